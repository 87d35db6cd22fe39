//! Custom resources, group `ursula.io`, version `v1alpha1`. The YAML in `crds/` is generated
//! from these types by `crdgen`; a test fails when they differ.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An Ursula cluster: a StatefulSet of voters, a gateway Deployment, their Services,
/// ConfigMap and PodDisruptionBudgets.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ursula.io",
    version = "v1alpha1",
    kind = "UrsulaCluster",
    namespaced,
    status = "UrsulaClusterStatus",
    shortname = "uc",
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#,
    printcolumn = r#"{"name":"Voters","type":"integer","jsonPath":".spec.voters"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyVoters"}"#,
    printcolumn = r#"{"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].status"}"#,
    printcolumn = r#"{"name":"Step","type":"string","jsonPath":".status.upgradeStep"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.tls) == has(oldSelf.tls) && (!has(self.tls) || self.tls == oldSelf.tls)",
    "message": "spec.tls is fixed at creation: voters whose certificates come from two CAs cannot reach each other while they are replaced"
}]))]
pub struct UrsulaClusterSpec {
    /// The Ursula version: the image tag of nodes and gateways. Raising it upgrades gateways
    /// first, then voters one at a time; lowering it rolls voters back first, then gateways.
    pub version: String,
    /// Image repository of the nodes (the tag is `version`).
    #[serde(default = "default_node_image")]
    pub node_image: String,
    /// Image repository of the gateways (the tag is `version`).
    #[serde(default = "default_gateway_image")]
    pub gateway_image: String,
    /// Raft voters: 1, 3 or 5. Every voter replicates every group; a write needs a majority.
    /// Changing it grows or shrinks the cluster one voter at a time while it serves: a new
    /// voter joins as a learner, catches up and is promoted; a voter beyond it hands off its
    /// leadership and is removed before its pod is.
    #[schemars(extend("enum" = [1, 3, 5]))]
    pub voters: u8,
    /// What happens to the volume of a voter removed by lowering `voters`: `Retain` (kept; a
    /// later growth reuses it) or `Delete`.
    #[serde(default)]
    pub volume_reclaim: VolumeReclaim,
    /// Gateway replicas.
    #[serde(default = "default_gateway_replicas")]
    #[schemars(range(min = 1))]
    pub gateway_replicas: u16,
    /// Compute resources of each voter.
    #[serde(default)]
    pub node_resources: Option<ResourceRequirements>,
    /// Compute resources of each gateway.
    #[serde(default)]
    pub gateway_resources: Option<ResourceRequirements>,
    /// Gateway options: body limits, the request deadline, access control and tenant limits.
    /// Without it the gateways keep their defaults.
    #[serde(default)]
    pub gateway: Option<GatewaySpec>,
    /// The persistent volume of each voter.
    pub storage: StorageSpec,
    /// Object storage for the cold tier: older records move there from the voters' volumes.
    /// Without it every record stays on the volumes.
    #[serde(default)]
    pub object_store: Option<ObjectStoreSpec>,
    /// Node configuration overrides, by the node's config key (`raft.snapshot_log_budget`,
    /// `server.long_poll_timeout`, ...). Keys the operator sets itself cannot be overridden.
    #[serde(default)]
    pub node_config: BTreeMap<String, serde_json::Value>,
    /// Who may reach the voters' client port (4437) besides the cluster's gateways, as
    /// NetworkPolicy peers (pod and namespace selectors, IP blocks). Empty: the gateways only.
    #[serde(default)]
    pub client_access: Vec<NetworkPolicyPeer>,
    /// The NetworkPolicy that fences the voters: the cluster port (4439) only from the
    /// cluster's own voters, the admin port (4438) only from the operator's namespace and
    /// `metricsFrom`, the client port from the gateways and `clientAccess`.
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,
    /// Where the voters' certificates for the cluster port (mutual TLS between voters) come
    /// from. Without it the operator keeps a CA of its own in the Secret `{name}-ca` and
    /// issues and renews them itself. Fixed at creation.
    #[serde(default)]
    pub tls: Option<TlsSpec>,
    /// While true, the operator changes nothing.
    #[serde(default)]
    pub paused: bool,
}

/// The voters' certificates from cert-manager.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// The cert-manager issuer of the voters' certificates: the operator makes a `Certificate`
    /// `{name}-node-{id}` for each voter, whose Secret `{name}-node-{id}-tls` the voter mounts,
    /// and cert-manager issues and renews them. Use a CA-like issuer (CA, Vault, ...): every
    /// voter trusts the `ca.crt` that issuer writes, so a self-signed issuer does not work.
    pub issuer_ref: IssuerRef,
}

/// A cert-manager issuer, as a `Certificate`'s `issuerRef` names one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    /// Name of the issuer; an `Issuer` must be in the cluster's namespace.
    #[schemars(length(min = 1))]
    pub name: String,
    /// `Issuer` (default), `ClusterIssuer`, or an external issuer's kind.
    #[serde(default = "default_issuer_kind")]
    pub kind: String,
    /// API group of the issuer: `cert-manager.io` (default), or an external issuer's group.
    #[serde(default = "default_issuer_group")]
    pub group: String,
}

fn default_issuer_kind() -> String {
    "Issuer".into()
}

fn default_issuer_group() -> String {
    "cert-manager.io".into()
}

/// The voters' NetworkPolicy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Whether the operator applies it (default true). Off, it deletes it. A NetworkPolicy
    /// takes effect only where the cluster's network plugin enforces them.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Peers that may scrape `/metrics` on the admin port (e.g. Prometheus' namespace). The
    /// admin routes that change state still ask for the admin token.
    #[serde(default)]
    pub metrics_from: Vec<NetworkPolicyPeer>,
}

impl Default for NetworkPolicySpec {
    fn default() -> Self {
        Self {
            enabled: true,
            metrics_from: Vec::new(),
        }
    }
}

fn default_true() -> bool {
    true
}

/// A voter's persistent volume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// Size of each voter's volume, as a Kubernetes quantity (e.g. `20Gi`).
    pub size: String,
    /// StorageClass of the volumes; the cluster default when absent.
    #[serde(default)]
    pub class_name: Option<String>,
}

/// An S3-API object store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStoreSpec {
    /// Bucket name. The cluster keeps its objects under `{prefix}/` in it.
    pub bucket: String,
    /// Key prefix of this cluster's objects; `{namespace}/{name}` of the cluster when absent.
    /// No two clusters may share one.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Endpoint URL (MinIO, Ceph, ...); AWS when absent. An `http://` endpoint is allowed.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Region.
    #[serde(default)]
    pub region: Option<String>,
    /// Secret in the cluster's namespace with keys `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`, given to the voters as environment variables.
    pub credentials_secret: String,
}

/// Options of the gateways. Each field left out keeps the gateway's default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// Largest write body a gateway buffers (to resend it on a redirect), in bytes; larger ones
    /// are refused with 413 `RequestBodyTooLarge`. Default 64 MiB, the nodes'
    /// `server.max_append_size`.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_buffered_body_size: Option<u64>,
    /// Largest snapshot publish a gateway buffers, in bytes. Default 256 MiB, the nodes'
    /// `server.max_snapshot_size`.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_buffered_snapshot_size: Option<u64>,
    /// How long a request that is not a long-poll or SSE read may wait for the voters,
    /// redirects included, before the gateway answers 503 `RequestTimeout` (e.g. `15s`, the
    /// default; keep it above the voters' `server.request_timeout`).
    #[serde(default)]
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m)$"))]
    pub request_timeout: Option<String>,
    /// A Secret in the cluster's namespace whose key `access-keys.toml` holds the gateway's
    /// keys file: bearer tokens and JWT keys with the buckets each may read and write, and
    /// each tenant's request rates, byte rates and write quota (format in the gateway
    /// README). Turns access control on; without it the gateways let every request through.
    #[serde(default)]
    pub access_keys_secret: Option<String>,
    /// A `kubernetes.io/tls` Secret in the cluster's namespace (`tls.crt`, `tls.key`, as
    /// cert-manager writes them): the gateways serve clients over TLS (HTTP/1.1 and HTTP/2),
    /// and pick a renewed certificate up without a restart.
    #[serde(default)]
    pub tls_secret: Option<String>,
}

/// What the operator observed and did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UrsulaClusterStatus {
    /// The generation of the spec this status describes.
    #[serde(default)]
    pub observed_generation: Option<i64>,
    /// `Available`, `Progressing`, `Degraded` and `Upgrading`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The version every voter runs, when they agree.
    #[serde(default)]
    pub node_version: Option<String>,
    /// The version every gateway runs, when they agree.
    #[serde(default)]
    pub gateway_version: Option<String>,
    /// Voters ready and caught up.
    #[serde(default)]
    pub ready_voters: u8,
    /// Gateways ready.
    #[serde(default)]
    pub ready_gateways: u16,
    /// The step of an upgrade or rollback in progress, e.g. `gateways` or `voter 2`.
    #[serde(default)]
    pub upgrade_step: Option<String>,
    /// When the current step began (RFC 3339); a step that waits too long halts the upgrade.
    #[serde(default)]
    pub step_started: Option<String>,
    /// Whether the voters have formed the cluster once; from then on a voter that starts on
    /// an empty volume joins it instead of seeding a new one.
    #[serde(default)]
    pub bootstrapped: bool,
    /// The voter pods the StatefulSet is set to: `spec.voters`, or more while voters beyond
    /// it are being removed.
    #[serde(default)]
    pub voter_pods: Option<u8>,
    /// Voters of every Raft group, as the groups' leaders report them.
    #[serde(default)]
    pub raft_voters: Option<u8>,
    /// The step of a membership change in progress, e.g. `promote voter 4`.
    #[serde(default)]
    pub membership_step: Option<String>,
    /// When the membership step began (RFC 3339); one that waits too long halts the change.
    #[serde(default)]
    pub membership_step_started: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum VolumeReclaim {
    #[default]
    Retain,
    Delete,
}

impl VolumeReclaim {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retain => "Retain",
            Self::Delete => "Delete",
        }
    }
}

fn default_node_image() -> String {
    "ursula/ursula-node".into()
}

fn default_gateway_image() -> String {
    "ursula/ursula-gateway".into()
}

fn default_gateway_replicas() -> u16 {
    2
}

/// Deletes every stream of a bucket and fences the bucket ID for good. The spec cannot change
/// after creation; deleting the resource never touches data.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ursula.io",
    version = "v1alpha1",
    kind = "BucketPurge",
    namespaced,
    status = "BucketPurgeStatus",
    validation = r#"self.spec == oldSelf.spec"#,
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster"}"#,
    printcolumn = r#"{"name":"Bucket","type":"string","jsonPath":".spec.bucket"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BucketPurgeSpec {
    /// The `UrsulaCluster` (same namespace) that holds the bucket.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "cluster is immutable"}]))]
    pub cluster: String,
    /// The bucket ID to purge and fence.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "bucket is immutable"}]))]
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$"))]
    pub bucket: String,
}

/// Where a purge is. Phases only move forward: Pending, Purging, then Succeeded or Failed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BucketPurgeStatus {
    /// `Pending`, `Purging`, `Succeeded` or `Failed`.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf || (oldSelf == 'Pending' && self != 'Pending') || (oldSelf == 'Purging' && (self == 'Succeeded' || self == 'Failed'))",
        "message": "phases only move forward"
    }]))]
    pub phase: Option<PurgePhase>,
    /// Why the purge is in this phase.
    #[serde(default)]
    pub reason: Option<String>,
    /// Streams the purge deleted.
    #[serde(default)]
    pub purged_streams: Option<u64>,
}

/// The phase of a purge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PurgePhase {
    Pending,
    Purging,
    Succeeded,
    Failed,
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    /// Every property of every schema has a description, so `kubectl explain` says something.
    fn undescribed(schema: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        if let Some(properties) = schema.get("properties").and_then(|p| p.as_object()) {
            for (name, property) in properties {
                let here = format!("{path}.{name}");
                // Fields whose types come from Kubernetes keep Kubernetes' own descriptions.
                if property.get("description").is_none() && path.starts_with(".spec") {
                    out.push(here.clone());
                }
                undescribed(property, &here, out);
            }
        }
        if let Some(items) = schema.get("items") {
            undescribed(items, path, out);
        }
    }

    #[test]
    fn every_spec_field_is_described() {
        for crd in [UrsulaCluster::crd(), BucketPurge::crd()] {
            let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
            let root = &schema["openAPIV3Schema"];
            let mut missing = Vec::new();
            undescribed(&root["properties"]["spec"], ".spec", &mut missing);
            assert!(
                missing.is_empty(),
                "{}: no description on {missing:?}",
                crd.spec.names.kind
            );
        }
    }

    #[test]
    fn voters_are_one_three_or_five() {
        let schema =
            serde_json::to_value(UrsulaCluster::crd().spec.versions[0].schema.clone()).unwrap();
        let voters = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["voters"];
        assert_eq!(voters["enum"], serde_json::json!([1, 3, 5]));
    }
}
