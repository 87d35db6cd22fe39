//! The cluster listener: Raft RPCs from peers, and nothing else. A peer link's frames are
//! batches of calls (`peer_link`); any other connection speaks HTTP, one call per request at
//! `/raft/{group}/{kind}` (snapshots, forwarded purges). Clients never reach it; it listens on
//! its own address (`server.cluster_listen`).
//!
//! With `server.cluster_tls`, a connection without a certificate from the cluster's CA ends
//! in the handshake, and a call whose claimed sender (the leader of an append or a snapshot,
//! the candidate of a vote, the `x-ursula-node` of a purge) is not the node the certificate
//! names is refused with 403 before Raft sees it.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Serialize;
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use std::sync::atomic::Ordering;

use openraft::raft::AppendEntriesRequest;

use super::frame;
use super::membership::{MembershipChange, change_here, hand_off_here};
use super::peer_link::{BatchAnswer, BatchCall, CallKind};
use super::rejoin::Rejoining;
use super::transport::{ClusterTls, FROM_HEADER, PeerIdentity, Wire};
use super::types::{NodeId, Raft, TypeConfig};
use crate::engine::Metrics;

/// Largest RPC body accepted: entries are batched, and snapshots come in chunks.
const MAX_RPC_BYTES: usize = 256 * 1024 * 1024;

/// What the cluster listener serves: this node's replicas by group, the node's metrics, and
/// which replicas may not vote (`rejoin`).
pub struct Served {
    pub rafts: Arc<Vec<Option<Raft>>>,
    pub calls: super::stop::RaftCalls,
    /// The groups' engines, which a hand-off of leadership drains for a while.
    pub engines: Vec<Option<Arc<crate::engine::Engine>>>,
    pub metrics: Arc<Metrics>,
    pub rejoining: Arc<Rejoining>,
    /// Makes the subscription changes other voters carry here.
    pub subscriptions: Arc<crate::subscriptions::Subscriptions>,
}

pub async fn serve(
    listener: TcpListener,
    served: Arc<Served>,
    tls: Option<Arc<ClusterTls>>,
    mut stopping: watch::Receiver<bool>,
) {
    // Every connection ends with the listener, so that no peer's call reaches a Raft group
    // that is shutting down.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = crate::shutdown::until_stopping(&mut stopping) => {
                connections.shutdown().await;
                return;
            }
        };
        while connections.try_join_next().is_some() {}
        let (stream, address) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "cluster accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let served = served.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let (stream, is_link, identity): (Box<dyn Wire>, _, _) = match &tls {
                Some(tls) => match tls.accept(stream).await {
                    Ok((stream, is_link, identity)) => (stream, is_link, Some(identity)),
                    Err(error) => {
                        tracing::warn!(%address, %error, "refused a cluster connection");
                        return;
                    }
                },
                None => {
                    let is_link = opens_a_link(&stream).await;
                    (Box::new(stream), is_link, None)
                }
            };
            if is_link {
                let rotated = tls.as_deref().map(|tls| (tls, tls.generation()));
                if let Err(error) = serve_link(stream, &served, identity.as_deref(), rotated).await
                {
                    tracing::debug!(%error, "peer link ended");
                }
                return;
            }
            let service =
                service_fn(move |request| handle(served.clone(), identity.clone(), request));
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http2()
                .max_concurrent_streams(4096)
                .initial_connection_window_size(16 * 1024 * 1024)
                .initial_stream_window_size(4 * 1024 * 1024);
            if let Err(error) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "cluster connection ended");
            }
        });
    }
}

/// Whether the connection starts with a peer link's `frame::MAGIC` (left unread).
async fn opens_a_link(stream: &TcpStream) -> bool {
    let mut seen = [0u8; frame::MAGIC.len()];
    // The magic comes in one small write; peeking again is for the rare split delivery.
    for _ in 0..100 {
        match stream.peek(&mut seen).await {
            Ok(0) | Err(_) => return false,
            Ok(n) if seen[..n] != frame::MAGIC[..n] => return false,
            Ok(n) if n == seen.len() => return true,
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(1)).await,
        }
    }
    false
}

/// A peer link: each frame is a batch of calls, answered in a frame of the same exchange
/// number before the next is read (the link has one exchange in flight). A link opened
/// before the TLS files rotated ends after its exchange, so that the peer connects again and
/// is checked against what the files hold now.
async fn serve_link(
    stream: Box<dyn Wire>,
    served: &Served,
    identity: Option<&PeerIdentity>,
    rotated: Option<(&ClusterTls, u64)>,
) -> std::io::Result<()> {
    let mut stream = BufReader::with_capacity(64 * 1024, stream);
    let mut magic = [0u8; frame::MAGIC.len()];
    stream.read_exact(&mut magic).await?;
    if &magic != frame::MAGIC {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a peer link that does not open with the link's magic",
        ));
    }
    while let Some((exchange, payload)) = frame::read(&mut stream, MAX_RPC_BYTES).await? {
        let answers = batch(served, identity, &payload)
            .await
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let answer = postcard::to_extend(&answers, frame::start())
            .map_err(std::io::Error::other)
            .and_then(|frame| frame::finish(frame, exchange))?;
        frame::write(stream.get_mut(), &answer).await?;
        if rotated.is_some_and(|(tls, opened)| tls.generation() != opened) {
            return Ok(());
        }
    }
    Ok(())
}

fn answer(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

fn encode<T: Serialize>(value: &T) -> (StatusCode, Vec<u8>) {
    match postcard::to_allocvec(value) {
        Ok(body) => (StatusCode::OK, body),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            error.to_string().into_bytes(),
        ),
    }
}

async fn handle(
    served: Arc<Served>,
    identity: Option<Arc<PeerIdentity>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_owned();
    let mut parts = path.trim_start_matches('/').split('/');
    let (group, kind) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("raft"), Some(group), Some(route), None) => {
            let Some(kind) = CallKind::from_route(route) else {
                return Ok(answer(
                    StatusCode::NOT_FOUND,
                    b"no such cluster route".to_vec(),
                ));
            };
            match group.parse::<usize>() {
                Ok(group) => (group, kind),
                Err(_) => return Ok(answer(StatusCode::NOT_FOUND, b"no such group".to_vec())),
            }
        }
        _ => {
            return Ok(answer(
                StatusCode::NOT_FOUND,
                b"no such cluster route".to_vec(),
            ));
        }
    };
    if request.method() != Method::POST {
        return Ok(answer(StatusCode::METHOD_NOT_ALLOWED, Vec::new()));
    }
    let named = request
        .headers()
        .get(FROM_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<NodeId>().ok());
    let body = match Limited::new(request.into_body(), MAX_RPC_BYTES)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(error) => {
            return Ok(answer(
                StatusCode::BAD_REQUEST,
                error.to_string().into_bytes(),
            ));
        }
    };
    let sender = Sender {
        identity: identity.as_deref(),
        named,
    };
    let (status, body) = call(&served, sender, group, kind, body).await;
    Ok(answer(status, body))
}

/// A peer link's coalesced calls (`peer_link`), each run as its own route would run it, all
/// at once; the answers in the calls' order. A batch that does not decode is an error.
async fn batch(
    served: &Served,
    identity: Option<&PeerIdentity>,
    body: &[u8],
) -> Result<Vec<BatchAnswer>, String> {
    let sender = Sender {
        identity,
        named: None,
    };
    let calls: Vec<BatchCall> =
        postcard::from_bytes(body).map_err(|e| format!("a batch of calls: {e}"))?;
    let answers: Vec<BatchAnswer> =
        futures_util::future::join_all(calls.into_iter().map(|c| async move {
            let (status, body) = call(served, sender, c.group as usize, c.kind, c.body).await;
            if status.is_success() {
                Ok(Bytes::from(body))
            } else {
                Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
            }
        }))
        .await;
    Ok(answers)
}

/// Who sent a call: the certificate of the voter at the other end (with cluster TLS), and
/// the node an HTTP call says it comes from.
#[derive(Clone, Copy)]
struct Sender<'a> {
    identity: Option<&'a PeerIdentity>,
    named: Option<NodeId>,
}

impl Sender<'_> {
    /// Why a call that claims to come from `claimed` is refused: with cluster TLS, the
    /// certificate must be that node's. `None`: it is taken.
    fn refusal(&self, claimed: Option<NodeId>) -> Option<(StatusCode, Vec<u8>)> {
        let identity = self.identity?;
        let why = match claimed {
            Some(id) if identity.is(id) => return None,
            Some(id) => format!(
                "the call claims to come from node {id}, and the certificate is not node {id}'s"
            ),
            None => "the call does not name the node it comes from".to_owned(),
        };
        Some((StatusCode::FORBIDDEN, why.into_bytes()))
    }
}

/// The node a vote names: an append's or a snapshot's leader, a vote request's candidate.
fn voter_of(vote: &openraft::Vote<NodeId>) -> Option<NodeId> {
    vote.leader_id().voted_for()
}

/// One Raft call to `group`: its status and encoded answer.
async fn call(
    served: &Served,
    sender: Sender<'_>,
    group: usize,
    kind: CallKind,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    let metrics = &served.metrics;
    let Some(raft) = served.rafts.get(group).and_then(Option::clone) else {
        return (StatusCode::NOT_FOUND, b"no such group".to_vec());
    };
    let bad = |error: postcard::Error| (StatusCode::BAD_REQUEST, error.to_string().into_bytes());
    match kind {
        CallKind::Append => match postcard::from_bytes::<AppendEntriesRequest<TypeConfig>>(&body) {
            Ok(rpc) => {
                if let Some(refused) = sender.refusal(voter_of(&rpc.vote)) {
                    return refused;
                }
                metrics.append_rpcs.fetch_add(1, Ordering::Relaxed);
                metrics
                    .append_rpc_entries
                    .fetch_add(rpc.entries.len() as u64, Ordering::Relaxed);
                encode(&raft.append_entries(rpc).await)
            }
            Err(error) => bad(error),
        },
        CallKind::Vote => {
            match postcard::from_bytes::<openraft::raft::VoteRequest<NodeId>>(&body) {
                Ok(rpc) => match sender.refusal(voter_of(&rpc.vote)) {
                    Some(refused) => refused,
                    None if served.rejoining.contains(group as u32) => {
                        encode(&Ok::<_, openraft::error::RaftError<NodeId>>(withheld(rpc)))
                    }
                    None => encode(&raft.vote(rpc).await),
                },
                Err(error) => bad(error),
            }
        }
        CallKind::Snapshot => {
            match postcard::from_bytes::<openraft::raft::InstallSnapshotRequest<TypeConfig>>(&body)
            {
                Ok(rpc) => match sender.refusal(voter_of(&rpc.vote)) {
                    Some(refused) => refused,
                    None => encode(&raft.install_snapshot(rpc).await),
                },
                Err(error) => bad(error),
            }
        }
        // A peer's admin listener was asked to purge a bucket of a group this node leads.
        CallKind::Purge => match std::str::from_utf8(&body) {
            Ok(bucket) => match sender.refusal(sender.named) {
                Some(refused) => refused,
                None => encode(&purge_here(&raft, &served.calls, bucket).await),
            },
            Err(_) => (StatusCode::BAD_REQUEST, b"the bucket is not UTF-8".to_vec()),
        },
        // A voter asks this one, the group's leader, to hand the leadership off to it.
        CallKind::HandOff => match postcard::from_bytes::<u64>(&body) {
            Ok(window_ms) => match sender.refusal(sender.named) {
                Some(refused) => refused,
                None => {
                    let engine = served.engines.get(group).and_then(Option::as_ref);
                    encode(&hand_off_here(&raft, engine, window_ms))
                }
            },
            Err(error) => bad(error),
        },
        // A client asked another voter to change a subscription of a group this node leads.
        CallKind::Subscription => {
            match postcard::from_bytes::<crate::subscriptions::change::Change>(&body) {
                Ok(change) => match sender.refusal(sender.named) {
                    Some(refused) => refused,
                    None => match served.engines.get(group).and_then(Option::as_ref) {
                        Some(engine) => {
                            encode(&served.subscriptions.change_here(engine, change).await)
                        }
                        None => (
                            StatusCode::NOT_FOUND,
                            b"this node does not host the group".to_vec(),
                        ),
                    },
                },
                Err(error) => bad(error),
            }
        }
        // A peer's admin listener was asked to change the membership of every group.
        CallKind::Membership => match postcard::from_bytes::<MembershipChange>(&body) {
            Ok(change) => match sender.refusal(sender.named) {
                Some(refused) => refused,
                None => encode(&change_here(&raft, &served.calls, group as u32, &change).await),
            },
            Err(error) => bad(error),
        },
    }
}

/// The answer of a replica that may not vote (`rejoin`): not granted, and nothing of the
/// candidate's request taken in (its vote is answered back, so the candidate learns nothing
/// newer from it).
fn withheld(rpc: openraft::raft::VoteRequest<NodeId>) -> openraft::raft::VoteResponse<NodeId> {
    openraft::raft::VoteResponse {
        vote: rpc.vote,
        vote_granted: false,
        last_log_id: None,
    }
}

/// Proposes the purge of `bucket` here: the streams it deleted, or why it could not.
async fn purge_here(
    raft: &Raft,
    calls: &super::stop::RaftCalls,
    bucket: &str,
) -> Result<u64, String> {
    let command = crate::machine::Command::PurgeBucket {
        bucket: bucket.to_owned(),
    };
    match super::propose(raft, calls, command).await {
        Ok(crate::machine::Outcome::BucketPurged { streams }) => Ok(streams as u64),
        Ok(_) => Err("unexpected outcome of a purge".into()),
        Err(error) => Err(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cluster::call_error::PostError;
    use crate::cluster::network::post;
    use crate::cluster::transport::http2_client;

    /// A listener of a node that hosts no group.
    fn nothing_hosted() -> Served {
        let dir = tempfile::tempdir().unwrap();
        Served {
            rafts: Arc::new(vec![None]),
            calls: Default::default(),
            engines: vec![None],
            metrics: Arc::default(),
            rejoining: Arc::new(Rejoining::open(dir.path(), false, false, []).unwrap()),
            subscriptions: crate::subscriptions::Subscriptions::open(&crate::config::Config {
                data_dir: dir.path().to_owned(),
                ..Default::default()
            })
            .unwrap(),
        }
    }

    #[tokio::test]
    async fn every_call_of_a_batch_gets_its_own_answer() {
        let calls = vec![
            BatchCall {
                group: 7,
                kind: CallKind::Append,
                body: Bytes::from_static(b"x"),
            },
            BatchCall {
                group: 0,
                kind: CallKind::Vote,
                body: Bytes::new(),
            },
        ];
        let body = postcard::to_allocvec(&calls).unwrap();
        // No group is hosted here: each call gets its own refusal.
        let answers = batch(&nothing_hosted(), None, &body).await.unwrap();
        assert_eq!(answers.len(), 2);
        for answer in answers {
            let error = answer.expect_err("no group is hosted");
            assert!(
                error.contains("404") && error.contains("no such group"),
                "{error}"
            );
        }
    }

    #[tokio::test]
    async fn a_batch_that_does_not_decode_is_refused() {
        let error = batch(&nothing_hosted(), None, b"\xff\xff\xff")
            .await
            .unwrap_err();
        assert!(error.contains("a batch of calls"), "{error}");
    }

    async fn serves_links_and_http(tls: Option<(Arc<ClusterTls>, Arc<ClusterTls>)>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{address}");
        let (_stop, stopping) = watch::channel(false);
        let (server, client) = tls.unzip();
        tokio::spawn(serve(
            listener,
            Arc::new(nothing_hosted()),
            server,
            stopping,
        ));

        let link = crate::cluster::peer_link::PeerLink::start(&url, 1, client.clone());
        for _ in 0..3 {
            let error = link
                .call(0, CallKind::Vote, Bytes::new(), Duration::from_secs(5))
                .await
                .expect_err("group 0 is not hosted");
            assert!(
                matches!(&error, PostError::Other(m) if m.contains("no such group")),
                "{error:?}"
            );
        }

        let client =
            http2_client(client.as_deref(), move |at| (at == address).then_some(1)).unwrap();
        let error = post(
            &client,
            &format!("{url}/raft/0/snapshot"),
            2,
            Vec::new(),
            Duration::from_secs(5),
        )
        .await
        .expect_err("group 0 is not hosted");
        assert!(
            matches!(&error, PostError::Other(m) if m.contains("404")),
            "{error:?}"
        );
    }

    /// One listener, two protocols: a link's frames and HTTP/2, told apart by the magic.
    #[tokio::test]
    async fn the_cluster_listener_serves_links_and_http_on_one_port() {
        serves_links_and_http(None).await;
    }

    /// The same over mutual TLS, told apart by ALPN: node 2 calls node 1.
    #[tokio::test]
    async fn the_cluster_listener_serves_links_and_http_over_mutual_tls() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = ursula_testkit::certs::write_cluster(dir.path(), &[1, 2]);
        let open = |id| {
            let files = ursula_tls::TlsFiles {
                ca_file: Some(files.ca_file()),
                cert_file: files.cert_file(id),
                key_file: files.key_file(id),
            };
            ClusterTls::open(files, id).unwrap()
        };
        serves_links_and_http(Some((open(1), open(2)))).await;
    }
}
