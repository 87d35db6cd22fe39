//! Raft RPCs to peers, on each peer's cluster listener. Appends and votes of every group go
//! through the peer's link (`peer_link`: one connection, coalesced, framed); snapshots, large
//! appends and forwarded purges are HTTP/2 requests (`transport`: TLS with
//! `server.cluster_tls`, prior knowledge without). Either way a call's
//! body is the postcard-encoded request, and its answer the postcard-encoded `Result` of the
//! peer's Raft call.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::address_book::{AddressBook, cluster_url_of};
use super::call_error::PostError;
use super::link_health::LinkHealth;
use super::peer_link::{CallKind, PeerLink};
use super::transport::{FROM_HEADER, HttpClient};
use super::types::{NodeId, TypeConfig};

/// Calls larger than this go as HTTP/2 requests of their own, not through the peer link: a
/// link has one exchange in flight, so a large entry there would hold up every group's
/// heartbeats to that peer for as long as its transfer and fsync take.
const MAX_LINKED_CALL_BYTES: usize = 1024 * 1024;

/// Makes connections for one group; all groups share the HTTP/2 client and its connections,
/// and the links that coalesce their appends and votes to each peer.
#[derive(Clone)]
pub struct GroupNetwork {
    pub group: u32,
    pub this_node: NodeId,
    pub client: HttpClient,
    pub book: Arc<AddressBook>,
    pub health: Arc<LinkHealth>,
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = PeerConnection;

    /// The membership entry that names `target` is the newest word on where it is.
    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        self.book.learn([(&target, node)]);
        let base = cluster_url_of(node).trim_end_matches('/').to_owned();
        PeerConnection {
            target,
            this_node: self.this_node,
            group: self.group,
            base: format!("{base}/raft/{}", self.group),
            client: self.client.clone(),
            link: self.book.link(target),
            health: self.health.clone(),
        }
    }
}

pub struct PeerConnection {
    target: NodeId,
    this_node: NodeId,
    group: u32,
    base: String,
    client: HttpClient,
    link: Option<Arc<PeerLink>>,
    health: Arc<LinkHealth>,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl PeerConnection {
    async fn call<Req, Resp, E>(
        &self,
        kind: CallKind,
        rpc: &Req,
        timeout: Duration,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let body = crate::storage::encode_sized(rpc).map_err(|e| network_error(e.to_string()))?;
        let sent = match &self.link {
            Some(link) if kind.is_linked() && body.len() <= MAX_LINKED_CALL_BYTES => {
                link.call(self.group, kind, body.into(), timeout).await
            }
            _ => {
                let url = format!("{}/{}", self.base, kind.route());
                post(&self.client, &url, self.this_node, body, timeout).await
            }
        };
        match &sent {
            Ok(_) => self.health.succeeded(self.target),
            Err(error) => self
                .health
                .failed(self.target, kind.route(), &error.describe(timeout)),
        }
        let bytes = match sent {
            Ok(bytes) => bytes,
            Err(PostError::Connect(message)) => {
                return Err(RPCError::Unreachable(Unreachable::new(
                    &std::io::Error::other(message),
                )));
            }
            Err(PostError::TimedOut) => {
                return Err(network_error(format!(
                    "{} to node {} timed out after {timeout:?}",
                    kind.route(),
                    self.target
                )));
            }
            Err(PostError::Other(message)) => return Err(network_error(message)),
        };
        let answer: Result<Resp, RaftError<NodeId, E>> =
            postcard::from_bytes(&bytes).map_err(|e| network_error(e.to_string()))?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// POSTs `body` from node `from` to a peer's cluster listener and answers the body of a 2xx,
/// within `timeout`.
pub(super) async fn post(
    client: &HttpClient,
    url: &str,
    from: NodeId,
    body: impl Into<Bytes>,
    timeout: Duration,
) -> Result<Bytes, PostError> {
    let request = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/octet-stream")
        .header(FROM_HEADER, from)
        .body(Full::new(body.into()))
        .map_err(|e| PostError::Other(e.to_string()))?;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| {
            if e.is_connect() {
                PostError::Connect(e.to_string())
            } else {
                PostError::Other(e.to_string())
            }
        })?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| PostError::Other(e.to_string()))?
            .to_bytes();
        if status.is_success() {
            Ok(bytes)
        } else {
            Err(PostError::Other(format!(
                "peer answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            )))
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| PostError::TimedOut)?
}

fn network_error<E: std::error::Error>(
    message: String,
) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
    RPCError::Network(NetworkError::new(&std::io::Error::other(message)))
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        self.call(CallKind::Append, &rpc, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call(CallKind::Snapshot, &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(CallKind::Vote, &rpc, option.hard_ttl()).await
    }
}

/// Asks the node at `cluster_url`, on behalf of node `from`, to make a `kind` call (a purge,
/// a membership change) in a group it leads: the answer it encoded, or why there is none.
pub async fn forward<T: serde::de::DeserializeOwned>(
    client: &HttpClient,
    from: NodeId,
    cluster_url: &str,
    group: usize,
    kind: CallKind,
    body: Vec<u8>,
) -> Result<T, String> {
    let url = format!(
        "{}/raft/{group}/{}",
        cluster_url.trim_end_matches('/'),
        kind.route()
    );
    match post(client, &url, from, body, Duration::from_secs(30)).await {
        Ok(body) => postcard::from_bytes::<T>(&body).map_err(|e| e.to_string()),
        Err(PostError::TimedOut) => Err(format!("the {} call timed out", kind.route())),
        Err(PostError::Connect(message) | PostError::Other(message)) => Err(message),
    }
}
