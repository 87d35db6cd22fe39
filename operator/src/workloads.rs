//! Pure builders of the cluster's Kubernetes objects. Each takes the `UrsulaCluster` and
//! returns the desired object; the controller applies them with server-side apply.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Affinity, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, KeyToPath, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ProjectedVolumeSource, SecretKeySelector, SecretProjection,
    SecretVolumeSource, Service, ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount,
    VolumeProjection, VolumeResourceRequirements, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use ursula_wire::ports;

use crate::crd::UrsulaCluster;
use crate::mounts;
use crate::objects::{InvalidSpec, headless_service_name, node_config};

pub const NODE: &str = "ursula-node";
pub const GATEWAY: &str = "ursula-gateway";
const CONFIG_DIR: &str = "/etc/ursula";
const DATA_DIR: &str = "/var/lib/ursula";
/// The non-root user the images run as.
const USER_ID: i64 = 10001;

pub fn labels(cluster: &UrsulaCluster, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), component.to_owned()),
        ("app.kubernetes.io/instance".to_owned(), cluster.name_any()),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "ursula-operator".to_owned(),
        ),
    ])
}

pub(crate) fn meta(cluster: &UrsulaCluster, name: String, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: cluster.namespace(),
        labels: Some(labels(cluster, component)),
        owner_references: cluster.controller_owner_ref(&()).map(|owner| vec![owner]),
        ..ObjectMeta::default()
    }
}

pub(crate) fn selector(cluster: &UrsulaCluster, component: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(cluster, component)),
        ..LabelSelector::default()
    }
}

/// Pods of one component on machines of their own where the scheduler can: two voters on one
/// machine are lost together (a majority of three, with one more), and a new voter placed
/// beside an old one takes its CPU while it catches up. Preferred, not required, so that a
/// cluster with fewer machines than pods still schedules them.
pub(crate) fn spread_over_machines(cluster: &UrsulaCluster, component: &str) -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(selector(cluster, component)),
                        topology_key: "kubernetes.io/hostname".to_owned(),
                        ..PodAffinityTerm::default()
                    },
                },
            ]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    }
}

pub(crate) fn port(name: &str, number: u16) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: i32::from(number),
        ..ContainerPort::default()
    }
}

fn service_port(name: &str, number: u16) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port: i32::from(number),
        target_port: Some(IntOrString::Int(i32::from(number))),
        ..ServicePort::default()
    }
}

/// Probes go to the admin listener, never the client one.
pub(crate) fn probe(path: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::Int(i32::from(ports::ADMIN)),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(5),
        failure_threshold: Some(3),
        ..Probe::default()
    }
}

/// A Secret as files readable by the node's group only (`fsGroup`). Not a `subPath` mount:
/// those miss the Secret's updates, and rotation relies on them.
fn secret_volume(name: &str, secret: String) -> Volume {
    Volume {
        name: name.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// The voters' certificates, in the layout of the operator's own Secret (`mounts`): that
/// Secret, or each voter's cert-manager Secret projected into it. A pod template serves every
/// voter, so each voter sees the others' certificates too, as it does with the operator's CA.
fn cluster_tls_volume(cluster: &UrsulaCluster) -> Volume {
    if cluster.spec.tls.is_none() {
        return secret_volume("cluster-tls", mounts::tls_secret(cluster));
    }
    let item = |key: &str, path: String| KeyToPath {
        key: key.to_owned(),
        path,
        ..KeyToPath::default()
    };
    let sources = (0..crate::objects::voter_pods(cluster))
        .map(|ordinal| {
            let mut items = vec![
                item(mounts::ISSUED_CERT, mounts::cert_file(ordinal)),
                item(mounts::ISSUED_KEY, mounts::key_file(ordinal)),
            ];
            // The issuer's CA is in every voter's Secret; one copy is the trust.
            if ordinal == 0 {
                items.push(item(mounts::CA_FILE, mounts::CA_FILE.to_owned()));
            }
            VolumeProjection {
                secret: Some(SecretProjection {
                    name: mounts::voter_certificate_secret(cluster, ordinal),
                    items: Some(items),
                    optional: Some(false),
                }),
                ..VolumeProjection::default()
            }
        })
        .collect();
    Volume {
        name: "cluster-tls".to_owned(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            default_mode: Some(0o440),
            ..ProjectedVolumeSource::default()
        }),
        ..Volume::default()
    }
}

pub(crate) fn security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(USER_ID),
        fs_group: Some(USER_ID),
        ..PodSecurityContext::default()
    }
}

/// One config file per voter, `{cluster}-{ordinal}.toml`; a pod reads its own by name.
pub fn config_map(cluster: &UrsulaCluster) -> Result<ConfigMap, InvalidSpec> {
    let mut data = BTreeMap::new();
    for ordinal in 0..crate::objects::voter_pods(cluster) {
        let file = format!("{}-{ordinal}.toml", cluster.name_any());
        data.insert(file, node_config(cluster, ordinal)?);
    }
    Ok(ConfigMap {
        metadata: meta(cluster, format!("{}-config", cluster.name_any()), NODE),
        data: Some(data),
        ..ConfigMap::default()
    })
}

/// Stable DNS names for the voters; they are published before they are ready, so that peers
/// find each other while a group elects its leader.
pub fn headless_service(cluster: &UrsulaCluster) -> Service {
    Service {
        metadata: meta(cluster, headless_service_name(cluster), NODE),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            publish_not_ready_addresses: Some(true),
            selector: Some(labels(cluster, NODE)),
            ports: Some(vec![
                service_port("client", ports::CLIENT),
                service_port("admin", ports::ADMIN),
                service_port("cluster", ports::CLUSTER),
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// What clients connect to: the gateways.
pub fn client_service(cluster: &UrsulaCluster) -> Service {
    Service {
        metadata: meta(cluster, cluster.name_any(), GATEWAY),
        spec: Some(ServiceSpec {
            selector: Some(labels(cluster, GATEWAY)),
            ports: Some(vec![service_port("client", ports::CLIENT)]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

pub fn service_account_name(cluster: &UrsulaCluster) -> String {
    format!("{}-ursula", cluster.name_any())
}

/// The identity of the cluster's pods. Neither nodes nor gateways call the Kubernetes API, so
/// it has no roles and its token is not mounted.
pub fn service_account(cluster: &UrsulaCluster) -> ServiceAccount {
    ServiceAccount {
        metadata: meta(cluster, service_account_name(cluster), NODE),
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    }
}

/// The voter's environment: its pod name (which picks its config file) and, with an object
/// store, the store's credentials from the Secret the spec names.
fn node_env(cluster: &UrsulaCluster) -> Vec<EnvVar> {
    let mut env = vec![EnvVar {
        name: "POD_NAME".to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.name".to_owned(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }];
    if let Some(store) = &cluster.spec.object_store {
        for key in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
            env.push(EnvVar {
                name: key.to_owned(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: store.credentials_secret.clone(),
                        key: key.to_owned(),
                        optional: None,
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            });
        }
    }
    env
}

/// The voters. `OnDelete`: the operator replaces them one at a time, draining each first.
pub fn statefulset(cluster: &UrsulaCluster) -> StatefulSet {
    statefulset_at(cluster, &cluster.spec.version)
}

/// The voters with their pod template at `version` (during an upgrade, not yet the spec's).
pub fn statefulset_at(cluster: &UrsulaCluster, version: &str) -> StatefulSet {
    let spec = &cluster.spec;
    let container = Container {
        name: "node".to_owned(),
        image: Some(format!("{}:{version}", spec.node_image)),
        args: Some(vec![
            "--config".to_owned(),
            format!("{CONFIG_DIR}/$(POD_NAME).toml"),
        ]),
        env: Some(node_env(cluster)),
        ports: Some(vec![
            port("client", ports::CLIENT),
            port("admin", ports::ADMIN),
            port("cluster", ports::CLUSTER),
        ]),
        readiness_probe: Some(probe("/readyz")),
        liveness_probe: Some(probe("/healthz")),
        resources: spec.node_resources.clone(),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "data".to_owned(),
                mount_path: DATA_DIR.to_owned(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "config".to_owned(),
                mount_path: CONFIG_DIR.to_owned(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "admin-token".to_owned(),
                mount_path: mounts::ADMIN_DIR.to_owned(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "signing-key".to_owned(),
                mount_path: mounts::SIGNING_DIR.to_owned(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "cluster-tls".to_owned(),
                mount_path: mounts::TLS_DIR.to_owned(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        ]),
        ..Container::default()
    };
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: spec.storage.class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(spec.storage.size.clone()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };
    StatefulSet {
        metadata: meta(cluster, cluster.name_any(), NODE),
        spec: StatefulSetSpec {
            replicas: Some(i32::from(
                cluster
                    .status
                    .as_ref()
                    .and_then(|s| s.voter_pods)
                    .unwrap_or(spec.voters),
            )),
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_scaled: Some(spec.volume_reclaim.as_str().to_owned()),
                    when_deleted: Some("Retain".to_owned()),
                },
            ),
            service_name: Some(headless_service_name(cluster)),
            pod_management_policy: Some("Parallel".to_owned()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".to_owned()),
                ..StatefulSetUpdateStrategy::default()
            }),
            selector: selector(cluster, NODE),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(cluster, NODE)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    affinity: Some(spread_over_machines(cluster, NODE)),
                    security_context: Some(security()),
                    service_account_name: Some(service_account_name(cluster)),
                    automount_service_account_token: Some(false),
                    termination_grace_period_seconds: Some(30),
                    volumes: Some(vec![
                        Volume {
                            name: "config".to_owned(),
                            config_map: Some(ConfigMapVolumeSource {
                                name: format!("{}-config", cluster.name_any()),
                                ..ConfigMapVolumeSource::default()
                            }),
                            ..Volume::default()
                        },
                        secret_volume("admin-token", mounts::admin_token_secret(cluster)),
                        secret_volume("signing-key", mounts::signing_key_secret(cluster)),
                        cluster_tls_volume(cluster),
                    ]),
                    ..PodSpec::default()
                }),
            },
            volume_claim_templates: Some(vec![claim]),
            ..StatefulSetSpec::default()
        },
        ..StatefulSet::default()
    }
}

/// Voluntary disruptions never take a majority of voters: at most (voters - 1) / 2 may be
/// down (0 of 1, 1 of 3, 2 of 5). At least one gateway stays up when there are several.
pub fn disruption_budgets(cluster: &UrsulaCluster) -> [PodDisruptionBudget; 2] {
    // The voters the groups have now: widened only once a new voter is promoted.
    let voters = i32::from(
        cluster
            .status
            .as_ref()
            .and_then(|s| s.raft_voters)
            .unwrap_or(cluster.spec.voters),
    );
    let gateways = i32::from(cluster.spec.gateway_replicas);
    let budget = |name: String, component: &str, max_unavailable: i32| PodDisruptionBudget {
        metadata: meta(cluster, name, component),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(max_unavailable)),
            selector: Some(selector(cluster, component)),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    };
    [
        budget(
            format!("{}-voters", cluster.name_any()),
            NODE,
            (voters - 1) / 2,
        ),
        budget(
            format!("{}-gateway", cluster.name_any()),
            GATEWAY,
            (gateways - 1).clamp(0, 1),
        ),
    ]
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::crd::{StorageSpec, UrsulaClusterSpec};

    /// `prod` in namespace `ns`, at version 1.2.3.
    pub(crate) fn cluster(voters: u8, gateways: u16) -> UrsulaCluster {
        let mut cluster = UrsulaCluster::new(
            "prod",
            UrsulaClusterSpec {
                version: "1.2.3".into(),
                node_image: "reg/ursula-node".into(),
                gateway_image: "reg/ursula-gateway".into(),
                voters,
                volume_reclaim: Default::default(),
                gateway_replicas: gateways,
                node_resources: None,
                gateway_resources: None,
                gateway: None,
                storage: StorageSpec {
                    size: "20Gi".into(),
                    class_name: Some("fast".into()),
                },
                object_store: None,
                node_config: BTreeMap::new(),
                client_access: Vec::new(),
                network_policy: Default::default(),
                tls: None,
                paused: false,
            },
        );
        cluster.metadata.namespace = Some("ns".into());
        cluster.metadata.uid = Some("uid-1".into());
        cluster
    }

    #[test]
    fn during_a_membership_change_the_objects_follow_the_status_not_the_spec() {
        use crate::crd::{UrsulaClusterStatus, VolumeReclaim};
        for (voters, pods, raft_voters, bootstrapped, replicas, files, budget, join) in [
            // A new cluster: the spec's voters seed it.
            (3, None, None, false, 3, 3, 1, false),
            // Growing 3 -> 5: five pods join at once, the budget widens only with promotions.
            (5, Some(5), Some(3), true, 5, 5, 1, true),
            (5, Some(5), Some(5), true, 5, 5, 2, true),
            // Shrinking 5 -> 3: the pods of voters being removed stay until they are.
            (3, Some(5), Some(4), true, 5, 5, 1, true),
            (3, Some(3), Some(3), true, 3, 3, 1, true),
        ] {
            let mut uc = cluster(voters, 2);
            uc.spec.volume_reclaim = VolumeReclaim::Delete;
            uc.status = Some(UrsulaClusterStatus {
                voter_pods: pods,
                raft_voters,
                bootstrapped,
                ..UrsulaClusterStatus::default()
            });
            let what = format!("spec {voters}, status pods {pods:?} voters {raft_voters:?}");
            let set = statefulset_at(&uc, "1.2.3");
            assert_eq!(set.spec.replicas, Some(replicas), "{what}");
            let retention = set.spec.persistent_volume_claim_retention_policy.unwrap();
            assert_eq!(retention.when_scaled.as_deref(), Some("Delete"), "{what}");
            assert_eq!(retention.when_deleted.as_deref(), Some("Retain"), "{what}");
            let [v, _] = disruption_budgets(&uc);
            assert_eq!(max_unavailable(&v), budget, "{what}");
            let config = config_map(&uc).unwrap();
            let data = config.data.unwrap();
            assert_eq!(data.len(), files, "{what}");
            for text in data.values() {
                let parsed: toml::Table = toml::from_str(text).unwrap();
                let peers = parsed["raft"]["peers"].as_array().unwrap();
                assert_eq!(peers.len(), files, "{what}");
                assert_eq!(
                    parsed["raft"]
                        .get("join")
                        .and_then(|j| j.as_bool())
                        .unwrap_or(false),
                    join,
                    "{what}"
                );
            }
        }
    }

    fn max_unavailable(pdb: &PodDisruptionBudget) -> i32 {
        match pdb.spec.as_ref().unwrap().max_unavailable {
            Some(IntOrString::Int(n)) => n,
            ref other => panic!("{other:?}"),
        }
    }

    #[test]
    fn disruption_budgets_keep_quorum() {
        for (voters, gateways, voter_budget, gateway_budget) in
            [(1, 1, 0, 0), (3, 2, 1, 1), (5, 3, 2, 1), (3, 1, 1, 0)]
        {
            let [v, g] = disruption_budgets(&cluster(voters, gateways));
            assert_eq!(max_unavailable(&v), voter_budget, "{voters} voters");
            assert_eq!(max_unavailable(&g), gateway_budget, "{gateways} gateways");
        }
    }

    #[test]
    fn pods_run_as_a_service_account_without_a_token() {
        let uc = cluster(3, 2);
        let account = service_account(&uc);
        assert_eq!(account.metadata.name.as_deref(), Some("prod-ursula"));
        assert_eq!(account.automount_service_account_token, Some(false));
        // The gateways' pods: `gateways::tests::gateways_point_at_every_voter_directly`.
        let set = statefulset(&uc);
        let pod = set.spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("prod-ursula"));
        assert_eq!(pod.automount_service_account_token, Some(false));
        // A template at another version than the spec's, for a step of an upgrade.
        let older = statefulset_at(&uc, "1.2.2");
        assert_eq!(
            older.spec.template.spec.as_ref().unwrap().containers[0]
                .image
                .as_deref(),
            Some("reg/ursula-node:1.2.2")
        );
    }

    #[test]
    fn voters_and_gateways_prefer_machines_of_their_own() {
        let cluster = cluster(3, 2);
        let voters = statefulset(&cluster);
        let gateways = crate::gateways::gateway_deployment(&cluster);
        for (pod, component) in [
            (voters.spec.template.spec.unwrap(), NODE),
            (gateways.spec.template.spec.unwrap(), GATEWAY),
        ] {
            let anti = pod.affinity.unwrap().pod_anti_affinity.unwrap();
            assert!(
                anti.required_during_scheduling_ignored_during_execution
                    .is_none(),
                "preferred only: fewer machines than pods still schedule"
            );
            let terms = anti
                .preferred_during_scheduling_ignored_during_execution
                .unwrap();
            assert_eq!(terms.len(), 1);
            let term = &terms[0].pod_affinity_term;
            assert_eq!(term.topology_key, "kubernetes.io/hostname");
            let selected = term.label_selector.as_ref().unwrap().match_labels.as_ref();
            assert_eq!(
                selected.unwrap()["app.kubernetes.io/name"],
                component,
                "{component}'s pods spread from each other, not from the other component's"
            );
            assert_eq!(selected.unwrap()["app.kubernetes.io/instance"], "prod");
        }
    }

    #[test]
    fn statefulset_is_on_delete_with_probes_on_the_admin_port() {
        for voters in [1u8, 3, 5] {
            let set = statefulset(&cluster(voters, 2));
            let spec = &set.spec;
            assert_eq!(spec.replicas, Some(i32::from(voters)));
            assert_eq!(
                spec.update_strategy.as_ref().unwrap().type_.as_deref(),
                Some("OnDelete")
            );
            assert_eq!(spec.service_name.as_deref(), Some("prod-headless"));
            let pod = spec.template.spec.as_ref().unwrap();
            let node = &pod.containers[0];
            assert_eq!(node.image.as_deref(), Some("reg/ursula-node:1.2.3"));
            assert_eq!(
                node.args.as_ref().unwrap()[1],
                "/etc/ursula/$(POD_NAME).toml"
            );
            let readiness = node
                .readiness_probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap();
            assert_eq!(readiness.path.as_deref(), Some("/readyz"));
            assert_eq!(readiness.port, IntOrString::Int(4438));
            assert_eq!(
                pod.security_context.as_ref().unwrap().run_as_non_root,
                Some(true)
            );
            let claim = &spec.volume_claim_templates.as_ref().unwrap()[0];
            let claim_spec = claim.spec.as_ref().unwrap();
            assert_eq!(claim_spec.storage_class_name.as_deref(), Some("fast"));
            assert_eq!(
                claim_spec
                    .resources
                    .as_ref()
                    .unwrap()
                    .requests
                    .as_ref()
                    .unwrap()["storage"],
                Quantity("20Gi".into())
            );
            let owner = &set.metadata.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.controller),
                ("UrsulaCluster", Some(true))
            );
        }
    }

    #[test]
    fn voters_get_the_object_store_credentials_from_its_secret() {
        let env_names = |uc: &UrsulaCluster| -> Vec<(String, Option<(String, String)>)> {
            let set = statefulset(uc);
            let node = &set.spec.template.spec.clone().unwrap().containers[0].clone();
            node.env
                .clone()
                .unwrap()
                .into_iter()
                .map(|var| {
                    let secret = var
                        .value_from
                        .and_then(|from| from.secret_key_ref)
                        .map(|s| (s.name, s.key));
                    (var.name, secret)
                })
                .collect()
        };
        let mut uc = cluster(3, 2);
        assert_eq!(env_names(&uc), vec![("POD_NAME".to_owned(), None)]);
        uc.spec.object_store = Some(crate::crd::ObjectStoreSpec {
            bucket: "cold".into(),
            prefix: None,
            endpoint: None,
            region: None,
            credentials_secret: "ursula-s3".into(),
        });
        let secret = |key: &str| Some(("ursula-s3".to_owned(), key.to_owned()));
        assert_eq!(
            env_names(&uc),
            vec![
                ("POD_NAME".to_owned(), None),
                ("AWS_ACCESS_KEY_ID".to_owned(), secret("AWS_ACCESS_KEY_ID")),
                (
                    "AWS_SECRET_ACCESS_KEY".to_owned(),
                    secret("AWS_SECRET_ACCESS_KEY")
                ),
            ]
        );
    }

    /// Every voter finds its certificate, its key and the CA at the same paths whichever issues
    /// them: the operator's CA (one Secret) or cert-manager (a Secret per voter, projected).
    #[test]
    fn voters_mount_their_certificates_in_one_layout() {
        let volume = |cluster: &UrsulaCluster| {
            let set = statefulset_at(cluster, "1.2.3");
            let pod = set.spec.template.spec.unwrap();
            pod.volumes
                .unwrap()
                .into_iter()
                .find(|v| v.name == "cluster-tls")
                .unwrap()
        };
        let own = volume(&cluster(3, 1));
        assert_eq!(
            own.secret.unwrap().secret_name.as_deref(),
            Some("prod-cluster-tls")
        );

        let mut issued = cluster(3, 1);
        issued.spec.tls = Some(crate::crd::TlsSpec {
            issuer_ref: crate::crd::IssuerRef {
                name: "ca".into(),
                kind: "Issuer".into(),
                group: "cert-manager.io".into(),
            },
        });
        let projected = volume(&issued).projected.unwrap();
        assert_eq!(projected.default_mode, Some(0o440));
        let mut files = Vec::new();
        for source in projected.sources.unwrap() {
            let secret = source.secret.unwrap();
            for item in secret.items.unwrap() {
                files.push(format!("{}:{} -> {}", secret.name, item.key, item.path));
            }
        }
        assert_eq!(
            files,
            [
                "prod-node-1-tls:tls.crt -> node-1.crt",
                "prod-node-1-tls:tls.key -> node-1.key",
                "prod-node-1-tls:ca.crt -> ca.crt",
                "prod-node-2-tls:tls.crt -> node-2.crt",
                "prod-node-2-tls:tls.key -> node-2.key",
                "prod-node-3-tls:tls.crt -> node-3.crt",
                "prod-node-3-tls:tls.key -> node-3.key",
            ]
        );
    }

    #[test]
    fn services_and_config() {
        let headless = headless_service(&cluster(3, 2));
        let spec = headless.spec.as_ref().unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        let names: Vec<_> = spec
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| p.port)
            .collect();
        assert_eq!(names, vec![4437, 4438, 4439]);
        let client = client_service(&cluster(3, 2));
        let client_spec = client.spec.as_ref().unwrap();
        assert_eq!(client_spec.ports.as_ref().unwrap()[0].port, 4437);
        assert_eq!(
            client_spec.selector.as_ref().unwrap()["app.kubernetes.io/name"],
            "ursula-gateway"
        );
        let config = config_map(&cluster(5, 2)).unwrap();
        let files: Vec<&String> = config.data.as_ref().unwrap().keys().collect();
        assert_eq!(
            files,
            vec![
                "prod-0.toml",
                "prod-1.toml",
                "prod-2.toml",
                "prod-3.toml",
                "prod-4.toml"
            ]
        );
    }
}
