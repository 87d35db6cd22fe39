//! The node admin API, as the operator calls it: drain a voter before its pod is replaced,
//! purge a bucket. Admin listeners are reached through the headless Service's stable names.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ursula_wire::admin::{MembershipReport, NewMember, PurgeResponse};

/// A membership change the admin API makes (`/admin/membership/...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MembershipChange {
    AddLearner,
    Promote,
    Demote,
    Remove,
}

use crate::crd::UrsulaCluster;
use crate::objects::voter_host;

/// How long one admin call may take (a drain waits for elections).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("voter {ordinal}: {message}")]
    Call { ordinal: u8, message: String },
}

/// Where voter `ordinal`'s admin listener is, as `http://host:port`.
pub type AdminAddress = Arc<dyn Fn(&UrsulaCluster, u8) -> String + Send + Sync>;

#[derive(Clone)]
pub struct Nodes {
    client: Client<HttpConnector, Full<Bytes>>,
    admin: AdminAddress,
    /// The host template new voters are announced at (`with_member_host`).
    member_host: Option<String>,
}

/// Fills `{name}`, `{namespace}` and `{ordinal}` of `template` for voter `ordinal` of
/// `cluster`, e.g. `http://{name}-{ordinal}.example:4438`.
pub fn admin_url_from_template(template: &str, cluster: &UrsulaCluster, ordinal: u8) -> String {
    use kube::ResourceExt;
    template
        .replace("{name}", &cluster.name_any())
        .replace(
            "{namespace}",
            &cluster.namespace().unwrap_or_else(|| "default".into()),
        )
        .replace("{ordinal}", &ordinal.to_string())
        .trim_end_matches('/')
        .to_owned()
}

impl Default for Nodes {
    /// Voters are reached through the headless Service's stable names.
    fn default() -> Self {
        Self::with_admin(Arc::new(|cluster, ordinal| {
            format!(
                "http://{}:{}",
                voter_host(cluster, ordinal),
                ursula_wire::ports::ADMIN
            )
        }))
    }
}

impl Nodes {
    /// Voters' admin listeners at a URL template instead of the headless Service's names, for
    /// an operator that runs outside the cluster's network (see `admin_url_from_template`).
    pub fn with_admin_template(template: String) -> Self {
        Self::with_admin(Arc::new(move |cluster, ordinal| {
            admin_url_from_template(&template, cluster, ordinal)
        }))
    }

    pub fn with_admin(admin: AdminAddress) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            admin,
            member_host: None,
        }
    }

    /// Voters added to the Raft groups are announced at this host template (`{name}`,
    /// `{namespace}`, `{ordinal}`) instead of their headless Service names: for voters that
    /// are not at those names (a test's loopback addresses).
    pub fn with_member_host(mut self, template: String) -> Self {
        self.member_host = Some(template);
        self
    }

    fn admin_url(&self, cluster: &UrsulaCluster, ordinal: u8, path: &str) -> String {
        format!("{}{path}", (self.admin)(cluster, ordinal))
    }

    async fn post(&self, url: String, ordinal: u8, token: &str) -> Result<Bytes, NodeError> {
        self.call(http::Method::POST, url, ordinal, token, Bytes::new())
            .await
    }

    async fn call(
        &self,
        method: http::Method,
        url: String,
        ordinal: u8,
        token: &str,
        body: Bytes,
    ) -> Result<Bytes, NodeError> {
        let fail = |message: String| NodeError::Call { ordinal, message };
        let request = http::Request::builder()
            .method(method)
            .uri(&url)
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| fail(e.to_string()))?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| fail(format!("{url}: {e}")))?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| fail(e.to_string()))?
                .to_bytes();
            if status.is_success() {
                Ok(body)
            } else {
                Err(fail(format!(
                    "{url} answered {status}: {}",
                    String::from_utf8_lossy(&body)
                )))
            }
        };
        tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| fail(format!("{url} timed out")))?
    }

    /// Makes the voter hand its groups' leadership to the others (`POST /admin/drain`), with
    /// the cluster's admin `token`.
    pub async fn drain(
        &self,
        cluster: &UrsulaCluster,
        ordinal: u8,
        token: &str,
    ) -> Result<(), NodeError> {
        self.post(
            self.admin_url(cluster, ordinal, "/admin/drain"),
            ordinal,
            token,
        )
        .await
        .map(drop)
    }

    /// Voter `ordinal`'s view of its groups' membership (`GET /admin/membership`).
    pub async fn membership(
        &self,
        cluster: &UrsulaCluster,
        ordinal: u8,
        token: &str,
    ) -> Result<MembershipReport, NodeError> {
        let url = self.admin_url(cluster, ordinal, "/admin/membership");
        let body = self
            .call(http::Method::GET, url, ordinal, token, Bytes::new())
            .await?;
        serde_json::from_slice(&body).map_err(|e| NodeError::Call {
            ordinal,
            message: format!("an unreadable membership report: {e}"),
        })
    }

    /// Makes a membership change of node `id` in every group, through voter `via`.
    pub async fn change_membership(
        &self,
        cluster: &UrsulaCluster,
        via: u8,
        change: MembershipChange,
        id: u64,
        token: &str,
    ) -> Result<(), NodeError> {
        let (method, path, body) = match change {
            MembershipChange::AddLearner => {
                let ordinal = u8::try_from(id - 1).unwrap_or(u8::MAX);
                let (cluster_url, client_url) = match &self.member_host {
                    Some(template) => crate::objects::urls_at(&admin_url_from_template(
                        template, cluster, ordinal,
                    )),
                    None => crate::objects::voter_urls(cluster, ordinal),
                };
                let member = NewMember {
                    cluster_url,
                    client_url,
                };
                let body = serde_json::to_vec(&member).unwrap_or_default();
                (http::Method::PUT, "learners", Bytes::from(body))
            }
            MembershipChange::Promote => (http::Method::PUT, "voters", Bytes::new()),
            MembershipChange::Demote => (http::Method::DELETE, "voters", Bytes::new()),
            MembershipChange::Remove => (http::Method::DELETE, "learners", Bytes::new()),
        };
        let url = self.admin_url(cluster, via, &format!("/admin/membership/{path}/{id}"));
        self.call(method, url, via, token, body).await.map(drop)
    }

    /// Makes voter `ordinal` take over its share of the groups' leadership
    /// (`POST /admin/leadership/claim`).
    pub async fn claim_leadership(
        &self,
        cluster: &UrsulaCluster,
        ordinal: u8,
        token: &str,
    ) -> Result<(), NodeError> {
        let url = self.admin_url(cluster, ordinal, "/admin/leadership/claim");
        self.post(url, ordinal, token).await.map(drop)
    }

    /// Purges a bucket through voter `ordinal` (any voter forwards to the group's leader).
    pub async fn purge(
        &self,
        cluster: &UrsulaCluster,
        ordinal: u8,
        bucket: &str,
        token: &str,
    ) -> Result<PurgeResponse, NodeError> {
        let url = self.admin_url(cluster, ordinal, &format!("/admin/buckets/{bucket}/purge"));
        let body = self.post(url, ordinal, token).await?;
        serde_json::from_slice(&body).map_err(|e| NodeError::Call {
            ordinal,
            message: format!("an unreadable purge answer: {e}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::UrsulaClusterSpec;

    fn cluster(name: &str, namespace: &str) -> UrsulaCluster {
        let spec: UrsulaClusterSpec = serde_json::from_value(
            serde_json::json!({"version": "0.1.0", "voters": 3, "storage": {"size": "1Gi"}}),
        )
        .expect("spec");
        let mut cluster = UrsulaCluster::new(name, spec);
        cluster.metadata.namespace = Some(namespace.into());
        cluster
    }

    #[test]
    fn admin_url_templates_name_each_voter() {
        let streams = cluster("streams", "prod");
        let cases = [
            (
                "http://{name}-{ordinal}.{name}-headless.{namespace}:4438",
                2,
                "http://streams-2.streams-headless.prod:4438",
            ),
            (
                "http://127.0.0.1{ordinal}:4438/",
                0,
                "http://127.0.0.10:4438",
            ),
            ("http://admin.example", 1, "http://admin.example"),
        ];
        for (template, ordinal, expected) in cases {
            assert_eq!(
                admin_url_from_template(template, &streams, ordinal),
                expected,
                "{template}"
            );
        }
    }

    #[test]
    fn the_default_address_is_the_headless_service_name() {
        let nodes = Nodes::default();
        assert_eq!(
            nodes.admin_url(&cluster("streams", "prod"), 1, "/admin/drain"),
            "http://streams-1.streams-headless.prod.svc:4438/admin/drain"
        );
    }
}
