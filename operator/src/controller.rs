//! The `UrsulaCluster` reconciler: observe the voters and gateways, let the upgrade planner pick
//! the next step, apply the desired objects with server-side apply (pod templates at the
//! versions that step allows), act (drain and delete a voter's pod), and write status
//! conditions and events.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};

use crate::conditions::{
    certificates_condition, condition, keep_transition_times, since, started_at, step_started,
};
use crate::crd::{UrsulaCluster, UrsulaClusterStatus};
use crate::credentials::CredentialsError;
use crate::membership::MembershipStep;
use crate::nodes::Nodes;
use crate::upgrade::{self, GatewayState, Limits, Observed, Step, VoterState};
use crate::workloads;

pub use crate::apply::FIELD_MANAGER;
use crate::apply::{apply, apply_status};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0} has no namespace")]
    NoNamespace(String),
    #[error(transparent)]
    Node(#[from] crate::nodes::NodeError),
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
}

pub struct Context {
    pub client: kube::Client,
    pub recorder: Recorder,
    pub nodes: Nodes,
    pub limits: Limits,
    /// The operator's own namespace, which the voters' NetworkPolicy lets reach the admin port.
    pub namespace: Option<String>,
}

/// The version (image tag) of the first container of a pod template or pod spec.
fn image_tag(image: Option<&str>) -> Option<String> {
    let image = image?;
    let name_end = image.rfind('/').map_or(0, |slash| slash + 1);
    image[name_end..]
        .rsplit_once(':')
        .map(|(_, tag)| tag.to_owned())
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// What the planner needs, read from the API, and what acting on its step needs.
struct Observation {
    observed: Observed,
    /// The StatefulSet's replicas (0: it does not exist yet).
    voter_pods: u8,
    /// The version of the StatefulSet's pod template, if it exists.
    voter_template: Option<String>,
    /// The UID of each voter's pod (by ordinal), so that a replacement deletes exactly the pod
    /// the plan was made from.
    pod_uids: Vec<Option<String>>,
}

/// What the planner needs, read from the API.
async fn observe(
    cluster: &UrsulaCluster,
    ns: &str,
    client: &kube::Client,
) -> Result<Observation, Error> {
    let name = cluster.name_any();
    let desired = cluster.spec.version.clone();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    let template_version = |spec: Option<&k8s_openapi::api::core::v1::PodSpec>| {
        spec.and_then(|s| s.containers.first())
            .and_then(|c| image_tag(c.image.as_deref()))
    };
    let set = sets.get_opt(&name).await?;
    let replicas = set
        .as_ref()
        .and_then(|set| set.spec.replicas)
        .and_then(|replicas| u8::try_from(replicas).ok())
        .unwrap_or(0);
    let voter_template = set
        .as_ref()
        .and_then(|set| template_version(set.spec.template.spec.as_ref()));
    let gateway = match deployments.get_opt(&format!("{name}-gateway")).await? {
        Some(deployment) => {
            let version = template_version(deployment.spec.template.spec.as_ref())
                .unwrap_or_else(|| desired.clone());
            let want = deployment.spec.replicas.unwrap_or(1);
            let status = deployment.status.unwrap_or_default();
            let generation_seen = status.observed_generation >= deployment.metadata.generation;
            GatewayState {
                version,
                rolled_out: generation_seen
                    && status.updated_replicas.unwrap_or(0) >= want
                    && status.available_replicas.unwrap_or(0) >= want
                    && status.replicas.unwrap_or(0) == want,
                available: u16::try_from(status.available_replicas.unwrap_or(0)).unwrap_or(0),
            }
        }
        // Not created yet: it is created at the desired version.
        None => GatewayState {
            version: desired.clone(),
            rolled_out: false,
            available: 0,
        },
    };
    let selector = workloads::labels(cluster, workloads::NODE)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let listed = pods.list(&ListParams::default().labels(&selector)).await?;
    // The pods the StatefulSet has now (a growth adds pods before voters; a shrink removes
    // them last). A terminating pod is a voter being replaced: as good as missing.
    let existing = if replicas > 0 {
        replicas
    } else {
        cluster.spec.voters
    };
    let voter_pods: Vec<Option<&Pod>> = (0..existing)
        .map(|ordinal| {
            listed.items.iter().find(|p| {
                p.name_any() == format!("{name}-{ordinal}")
                    && p.metadata.deletion_timestamp.is_none()
            })
        })
        .collect();
    let pod_uids = voter_pods
        .iter()
        .map(|pod| pod.and_then(|p| p.metadata.uid.clone()))
        .collect();
    let voters = (0..existing)
        .zip(&voter_pods)
        .map(|(ordinal, pod)| VoterState {
            ordinal,
            version: pod.and_then(|p| template_version(p.spec.as_ref())),
            ready: pod.is_some_and(pod_ready),
        })
        .collect();
    let waiting_for = since(
        cluster
            .status
            .as_ref()
            .and_then(|s| s.step_started.as_deref()),
    );
    Ok(Observation {
        voter_pods: replicas,
        observed: Observed {
            desired,
            gateway,
            voters,
            waiting_for,
        },
        voter_template,
        pod_uids,
    })
}

fn step_name(step: &Step) -> String {
    match step {
        Step::Done => "done".into(),
        Step::RollGateway | Step::WaitForGateway => "gateways".into(),
        Step::UpdateVoterTemplate => "voter template".into(),
        Step::ReplaceVoter(o) | Step::WaitForVoter(o) => format!("voter {o}"),
        Step::WaitForMembership => "membership".into(),
        Step::Halt(_) => "halted".into(),
    }
}

/// What an event is about besides the cluster, and which action it reports. The Recorder folds
/// events of the same reason, action and related object into one series (keeping the first
/// note), so every distinct step needs its own action or related object.
struct EventScope {
    action: String,
    related: Option<ObjectReference>,
}

impl EventScope {
    fn reconcile() -> Self {
        Self {
            action: "Reconcile".into(),
            related: None,
        }
    }

    /// A step toward `version`, about one of the cluster's objects.
    fn version_step(version: &str, kind: &str, api_version: &str, ns: &str, name: String) -> Self {
        Self {
            action: format!("Version {version}"),
            related: Some(ObjectReference {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
                namespace: Some(ns.into()),
                name: Some(name),
                ..ObjectReference::default()
            }),
        }
    }
}

async fn publish(
    ctx: &Context,
    cluster: &UrsulaCluster,
    type_: EventType,
    reason: &str,
    scope: EventScope,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: scope.action,
        secondary: scope.related,
    };
    if let Err(error) = ctx.recorder.publish(&event, &cluster.object_ref(&())).await {
        tracing::warn!(%error, "cannot publish an event");
    }
}

pub async fn reconcile(cluster: Arc<UrsulaCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = cluster.name_any();
    let ns = cluster
        .namespace()
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    let client = &ctx.client;
    let generation = cluster.metadata.generation;
    let previous = cluster.status.clone().unwrap_or_default();

    if cluster.spec.paused {
        let mut status = previous.clone();
        status.conditions = vec![condition(
            "Progressing",
            false,
            "Paused",
            "spec.paused is set: nothing is changed".into(),
            generation,
        )];
        write_status(client, &ns, &name, &status).await?;
        return Ok(Action::requeue(Duration::from_secs(60)));
    }
    let config_map = match workloads::config_map(&cluster) {
        Ok(config_map) => config_map,
        Err(invalid) => {
            report_degraded(&ctx, &cluster, "InvalidSpec", invalid.to_string()).await?;
            return Ok(Action::await_change());
        }
    };

    let Observation {
        observed,
        voter_pods,
        voter_template,
        pod_uids,
    } = observe(&cluster, &ns, client).await?;
    // A new cluster starts at the desired version; an existing one moves by the planner.
    let voter_template = voter_template.unwrap_or_else(|| observed.desired.clone());
    let mut step = upgrade::next_step(&observed, &voter_template, ctx.limits);

    apply(client, &ns, &workloads::service_account(&cluster)).await?;
    // Before the voters: their pods mount these Secrets.
    let admin_token = crate::credentials::ensure(client, &ns, &cluster).await?;

    // A membership change and a version change never overlap: whichever is underway goes on.
    let membership_view = crate::resize::view(
        &cluster,
        voter_pods,
        crate::resize::observe(&ctx.nodes, &cluster, voter_pods, &admin_token).await,
        observed.version_changing(&voter_template),
        since(previous.membership_step_started.as_deref()),
        ctx.limits.ready_timeout,
    );
    let membership_step = crate::membership::next_step(&membership_view);
    if membership_step.is_changing() && step != Step::Done {
        step = Step::WaitForMembership;
    }
    // The builders read the cluster's shape from its status: what this reconcile decided.
    let shaped = {
        let mut shaped = (*cluster).clone();
        let status = shaped.status.get_or_insert_with(Default::default);
        status.voter_pods = Some(match membership_step {
            MembershipStep::Scale(pods) => pods,
            _ if voter_pods == 0 => cluster.spec.voters,
            _ => voter_pods,
        });
        status.raft_voters = crate::resize::raft_voters(&membership_view).or(previous.raft_voters);
        shaped
    };
    let config_map = workloads::config_map(&shaped).unwrap_or(config_map);
    if membership_step != MembershipStep::Done {
        tracing::info!(
            cluster = %name,
            namespace = %ns,
            step = %membership_step.name(),
            "membership planned"
        );
    }
    if step != Step::Done {
        tracing::info!(
            cluster = %name,
            namespace = %ns,
            step = ?step,
            voters = ?observed.voters,
            gateway = ?observed.gateway,
            "planned"
        );
    }
    let gateway_version = match step {
        Step::RollGateway => observed.desired.clone(),
        _ => observed.gateway.version.clone(),
    };
    let voter_version = match step {
        Step::UpdateVoterTemplate => observed.desired.clone(),
        _ => voter_template.clone(),
    };

    let waiting_for = match &cluster.spec.tls {
        None => Vec::new(),
        Some(tls) => {
            match crate::cert_manager::ensure(client, &ns, &cluster, &tls.issuer_ref).await {
                Err(missing @ CredentialsError::CertManagerMissing) => {
                    report_degraded(&ctx, &cluster, "CertManagerMissing", missing.to_string())
                        .await?;
                    // Installing cert-manager changes nothing the operator watches.
                    return Ok(Action::requeue(Duration::from_secs(30)));
                }
                waiting_for => waiting_for?,
            }
        }
    };
    apply(client, &ns, &config_map).await?;
    apply::<Service>(client, &ns, &workloads::headless_service(&cluster)).await?;
    apply::<Service>(client, &ns, &workloads::client_service(&cluster)).await?;
    apply(
        client,
        &ns,
        &workloads::statefulset_at(&shaped, &voter_version),
    )
    .await?;
    apply(
        client,
        &ns,
        &crate::gateways::gateway_deployment_at(&shaped, &gateway_version),
    )
    .await?;
    for budget in workloads::disruption_budgets(&shaped) {
        apply::<PodDisruptionBudget>(client, &ns, &budget).await?;
    }
    match crate::policies::voter_policy(&cluster, ctx.namespace.as_deref()) {
        Some(policy) => apply(client, &ns, &policy).await?,
        None => {
            let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
            let name = crate::policies::voter_policy_name(&cluster);
            match policies.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error.into()),
            }
        }
    }

    match &step {
        Step::ReplaceVoter(ordinal) => {
            publish(
                &ctx,
                &cluster,
                EventType::Normal,
                "ReplacingVoter",
                EventScope::version_step(
                    &observed.desired,
                    "Pod",
                    "v1",
                    &ns,
                    format!("{name}-{ordinal}"),
                ),
                format!(
                    "draining and replacing voter {ordinal} for version {}",
                    observed.desired
                ),
            )
            .await;
            // A voter that is not ready leads nothing and may not answer: no drain.
            let ready = observed
                .voters
                .iter()
                .any(|v| v.ordinal == *ordinal && v.ready);
            if ready {
                ctx.nodes.drain(&cluster, *ordinal, &admin_token).await?;
            }
            // Exactly the pod observed: never its replacement, should it already exist.
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: pod_uids.get(usize::from(*ordinal)).cloned().flatten(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            pods.delete(&format!("{name}-{ordinal}"), &params).await?;
        }
        Step::RollGateway => {
            publish(
                &ctx,
                &cluster,
                EventType::Normal,
                "RollingGateways",
                EventScope::version_step(
                    &observed.desired,
                    "Deployment",
                    "apps/v1",
                    &ns,
                    format!("{name}-gateway"),
                ),
                format!("gateways to version {}", observed.desired),
            )
            .await;
        }
        Step::Halt(reason) => {
            publish(
                &ctx,
                &cluster,
                EventType::Warning,
                "UpgradeHalted",
                EventScope {
                    action: format!("Version {}", observed.desired),
                    related: None,
                },
                reason.clone(),
            )
            .await;
        }
        _ => {}
    }

    match &membership_step {
        MembershipStep::AddLearner(_)
        | MembershipStep::Promote(_)
        | MembershipStep::Demote(_)
        | MembershipStep::Remove(_)
        | MembershipStep::SpreadLeaders(_)
        | MembershipStep::Scale(_) => {
            publish(
                &ctx,
                &cluster,
                EventType::Normal,
                "MembershipStep",
                EventScope {
                    action: format!("Membership {}", membership_step.name()),
                    related: None,
                },
                format!(
                    "{} (toward {} voters)",
                    membership_step.name(),
                    cluster.spec.voters
                ),
            )
            .await;
            let via = crate::resize::via(&membership_view, &membership_step);
            crate::resize::act(&ctx.nodes, &cluster, &membership_step, via, &admin_token).await?;
        }
        MembershipStep::Halt(reason) => {
            publish(
                &ctx,
                &cluster,
                EventType::Warning,
                "MembershipHalted",
                EventScope {
                    action: format!("Membership {} voters", cluster.spec.voters),
                    related: None,
                },
                reason.clone(),
            )
            .await;
        }
        _ => {}
    }

    let ready_voters = observed.voters.iter().filter(|v| v.ready).count() as u8;
    let membership_settled = membership_step == MembershipStep::Done;
    let settled = matches!(step, Step::Done) && membership_settled;
    let moving = !settled && !matches!(step, Step::Halt(_));
    let upgrading = observed.gateway.version != observed.desired
        || observed
            .voters
            .iter()
            .any(|v| v.version.as_deref() != Some(observed.desired.as_str()));
    let step_text = step_name(&step);
    let mut conditions = vec![
        condition(
            "Available",
            ready_voters > cluster.spec.voters / 2 && observed.gateway.rolled_out,
            if settled { "Ready" } else { "Partial" },
            format!("{ready_voters} of {} voters ready", cluster.spec.voters),
            generation,
        ),
        condition(
            "Progressing",
            moving,
            &step_text.replace(' ', ""),
            step_text.clone(),
            generation,
        ),
        condition(
            "Upgrading",
            upgrading && moving,
            "Version",
            format!("to {}", observed.desired),
            generation,
        ),
    ];
    conditions.push(certificates_condition(&cluster, &waiting_for, generation));
    if let Step::Halt(reason) = &step {
        conditions.push(condition(
            "Degraded",
            true,
            "UpgradeHalted",
            reason.clone(),
            generation,
        ));
    }
    if let MembershipStep::Halt(reason) = &membership_step {
        conditions.push(condition(
            "Degraded",
            true,
            "MembershipHalted",
            reason.clone(),
            generation,
        ));
    }
    // Waiting for an upgrade is the upgrade's step, shown as such.
    let membership_text = membership_step
        .is_changing()
        .then(|| membership_step.name());
    let membership_step_started = started_at(
        &previous,
        generation,
        previous.membership_step.as_deref(),
        previous.membership_step_started.as_deref(),
        membership_text.as_deref(),
        matches!(membership_step, MembershipStep::Halt(_)),
    );
    let shape = shaped.status.clone().unwrap_or_default();
    let versions: Vec<&str> = observed
        .voters
        .iter()
        .filter_map(|v| v.version.as_deref())
        .collect();
    keep_transition_times(&mut conditions, &previous.conditions);
    let status = UrsulaClusterStatus {
        observed_generation: generation,
        conditions,
        node_version: versions
            .first()
            .filter(|first| versions.iter().all(|v| v == *first))
            .map(|v| (*v).to_owned()),
        gateway_version: Some(observed.gateway.version.clone()),
        ready_voters,
        ready_gateways: observed.gateway.available,
        upgrade_step: (!matches!(step, Step::Done)).then(|| step_text.clone()),
        step_started: step_started(&previous, generation, &step, &step_text),
        // Formed once every group reports a leader: from the voters, not from pod readiness
        // (a voter joining before the cluster formed would wait forever to be added).
        bootstrapped: previous.bootstrapped || shape.raft_voters.is_some(),
        voter_pods: shape.voter_pods,
        raft_voters: shape.raft_voters,
        membership_step: membership_text,
        membership_step_started,
    };
    write_status(client, &ns, &name, &status).await?;
    Ok(Action::requeue(if settled {
        Duration::from_secs(60)
    } else {
        Duration::from_secs(5)
    }))
}

/// A spec the operator cannot act on, or something it needs that is missing: the `Degraded`
/// condition and a warning say why.
async fn report_degraded(
    ctx: &Context,
    cluster: &UrsulaCluster,
    reason: &str,
    message: String,
) -> Result<(), Error> {
    let generation = cluster.metadata.generation;
    let mut status = cluster.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    let previous = std::mem::take(&mut status.conditions);
    status.conditions = vec![condition(
        "Degraded",
        true,
        reason,
        message.clone(),
        generation,
    )];
    keep_transition_times(&mut status.conditions, &previous);
    let ns = cluster.namespace().unwrap_or_default();
    write_status(&ctx.client, &ns, &cluster.name_any(), &status).await?;
    publish(
        ctx,
        cluster,
        EventType::Warning,
        reason,
        EventScope::reconcile(),
        message,
    )
    .await;
    Ok(())
}

async fn write_status(
    client: &kube::Client,
    ns: &str,
    name: &str,
    status: &UrsulaClusterStatus,
) -> Result<(), Error> {
    Ok(apply_status::<UrsulaCluster>(client, ns, name, status).await?)
}

pub fn error_policy(_cluster: Arc<UrsulaCluster>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::image_tag;

    #[test]
    fn versions_are_image_tags() {
        for (image, tag) in [
            ("reg/ursula-node:0.7.3", Some("0.7.3")),
            ("registry:5000/ursula-node:1.0", Some("1.0")),
            ("registry:5000/ursula-node", None),
            ("ursula-node", None),
        ] {
            assert_eq!(image_tag(Some(image)).as_deref(), tag, "{image}");
        }
    }
}
