//! Raft RPCs of every group to one peer, coalesced: while an exchange with the peer is in
//! flight, the calls that arrive meanwhile wait and then go together as one frame on the
//! link's connection (`frame`), which the peer answers call by call. Each group's replication
//! keeps one RPC in flight per follower, so with many groups most RPCs find company; per-RPC
//! costs (frames, tasks and wake-ups on both sides) were the largest part of a replicated
//! append's CPU. A call that finds the link idle goes at once, alone.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{Mutex, oneshot};

use super::call_error::PostError;
use super::coalesce::{Coalescer, Item};
use super::frame;
use super::transport::{CONNECT_TIMEOUT, ClusterTls, Wire, authority_of};
use super::types::NodeId;

/// Exchanges with one peer in flight at once. One measured 15% less CPU per append than two
/// (3 voters, 16 groups, 32 writers): calls wait a little longer and go in bigger batches.
const IN_FLIGHT: usize = 1;
/// Calls in one exchange at most, and their body bytes.
const MAX_CALLS: usize = 256;
const MAX_BYTES: u64 = 8 * 1024 * 1024;
/// Largest answer accepted: a batch's answers are small (entries travel the other way).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// The calls the cluster listener answers, at `/raft/{group}/{route}` one by one, or in a
/// peer link's batch. Links carry appends and votes; snapshots are large and slow and go
/// alone, and purges are forwarded by the admin listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CallKind {
    Append,
    Vote,
    Snapshot,
    Purge,
    Membership,
    HandOff,
    /// A subscription change a client asked another voter for (`subscriptions::change`).
    Subscription,
}

impl CallKind {
    pub fn route(self) -> &'static str {
        match self {
            Self::Append => "append",
            Self::Vote => "vote",
            Self::Snapshot => "snapshot",
            Self::Purge => "purge",
            Self::Membership => "membership",
            Self::HandOff => "hand-off",
            Self::Subscription => "subscription",
        }
    }

    pub fn from_route(route: &str) -> Option<Self> {
        [
            Self::Append,
            Self::Vote,
            Self::Snapshot,
            Self::Purge,
            Self::Membership,
            Self::HandOff,
            Self::Subscription,
        ]
        .into_iter()
        .find(|kind| kind.route() == route)
    }

    /// Whether calls of this kind go through a peer link.
    pub fn is_linked(self) -> bool {
        matches!(self, Self::Append | Self::Vote)
    }
}

/// One call of a batch: what `/raft/{group}/{kind}` would have been sent.
#[derive(Debug, Serialize, Deserialize)]
pub struct BatchCall {
    pub group: u32,
    pub kind: CallKind,
    pub body: Bytes,
}

/// The answer to one call: the body of a 2xx, or what the peer said instead.
pub type BatchAnswer = Result<Bytes, String>;

struct Pending {
    call: BatchCall,
    timeout: Duration,
    reply: oneshot::Sender<Result<Bytes, PostError>>,
}

impl Item for Pending {
    fn size(&self) -> u64 {
        self.call.body.len() as u64
    }

    /// Its caller timed out behind a slow exchange: it is dropped, not sent late.
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }
}

pub struct PeerLink {
    queue: Arc<Coalescer<Pending>>,
}

impl PeerLink {
    /// Starts the link to node `target`, whose cluster listener is `base_url`
    /// (`http://host:port`, or `https://` with `tls`).
    pub fn start(base_url: &str, target: NodeId, tls: Option<Arc<ClusterTls>>) -> Arc<Self> {
        let wire = Arc::new(Route {
            authority: authority_of(base_url),
            target,
            tls,
            connection: Mutex::new(None),
        });
        let queue = Coalescer::start(IN_FLIGHT, MAX_CALLS, MAX_BYTES, None, move |batch| {
            exchange(wire.clone(), batch)
        });
        Arc::new(Self { queue })
    }

    /// Sends one call with the others waiting, and answers its body, within `timeout`.
    pub(super) async fn call(
        &self,
        group: u32,
        kind: CallKind,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, PostError> {
        let (reply, answer) = oneshot::channel();
        self.queue.push(Pending {
            call: BatchCall { group, kind, body },
            timeout,
            reply,
        });
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(PostError::Other("the peer link stopped".into())),
            Err(_) => Err(PostError::TimedOut),
        }
    }
}

/// One exchange: the batch as one frame, each answer to its caller.
async fn exchange(wire: Arc<Route>, batch: Vec<Pending>) {
    // The exchange may take as long as its most patient caller waits.
    let timeout = batch
        .iter()
        .map(|p| p.timeout)
        .max()
        .unwrap_or(Duration::from_secs(1));
    let (calls, replies): (Vec<BatchCall>, Vec<_>) =
        batch.into_iter().map(|p| (p.call, p.reply)).unzip();
    let answers = wire.exchange(&calls, timeout).await;
    match answers {
        Ok(answers) if answers.len() == replies.len() => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(answer.map_err(PostError::Other));
            }
        }
        Ok(answers) => {
            let error = PostError::Other(format!(
                "the peer answered {} calls of {}",
                answers.len(),
                replies.len()
            ));
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

/// Where the link goes, and its connection there: opened on first use, after any failure,
/// and after the TLS files rotate (so that the peer sees the new certificate).
struct Route {
    authority: String,
    target: NodeId,
    tls: Option<Arc<ClusterTls>>,
    connection: Mutex<Option<Connection>>,
}

struct Connection {
    stream: BufReader<Box<dyn Wire>>,
    last_exchange: u64,
    /// The TLS files' generation it was opened under.
    generation: u64,
}

impl Route {
    async fn exchange(
        &self,
        calls: &[BatchCall],
        timeout: Duration,
    ) -> Result<Vec<BatchAnswer>, PostError> {
        let frame = postcard::to_extend(calls, frame::start())
            .map_err(|e| PostError::Other(e.to_string()))?;
        // One exchange at a time per link (`IN_FLIGHT`), so the lock is never contended.
        let mut slot = self.connection.lock().await;
        match tokio::time::timeout(timeout, self.exchange_on(&mut slot, frame)).await {
            Ok(Ok(answers)) => Ok(answers),
            Ok(Err(error)) => {
                *slot = None;
                Err(error)
            }
            Err(_) => {
                // Its answer may still come: the connection is out of step; start afresh.
                *slot = None;
                Err(PostError::TimedOut)
            }
        }
    }

    async fn exchange_on(
        &self,
        slot: &mut Option<Connection>,
        frame: Vec<u8>,
    ) -> Result<Vec<BatchAnswer>, PostError> {
        let generation = self.tls.as_ref().map_or(0, |tls| tls.generation());
        if slot.as_ref().is_some_and(|c| c.generation != generation) {
            *slot = None;
        }
        let connection = match slot {
            Some(connection) => connection,
            None => slot.insert(self.open(generation).await?),
        };
        connection.last_exchange += 1;
        let exchange = connection.last_exchange;
        let other =
            |e: std::io::Error| PostError::Other(format!("link to {}: {e}", self.authority));
        let frame = frame::finish(frame, exchange).map_err(other)?;
        frame::write(connection.stream.get_mut(), &frame)
            .await
            .map_err(other)?;
        match frame::read(&mut connection.stream, MAX_ANSWER_BYTES).await {
            Ok(Some((answered, payload))) if answered == exchange => {
                postcard::from_bytes::<Vec<BatchAnswer>>(&payload)
                    .map_err(|e| PostError::Other(format!("a batch answer: {e}")))
            }
            Ok(Some((answered, _))) => Err(PostError::Other(format!(
                "link to {}: answer to exchange {answered} while waiting for {exchange}",
                self.authority
            ))),
            Ok(None) => Err(PostError::Other(format!(
                "link to {}: the peer closed the connection",
                self.authority
            ))),
            Err(error) => Err(other(error)),
        }
    }

    /// Connects and announces a link. Failing here, nothing of any call was sent.
    async fn open(&self, generation: u64) -> Result<Connection, PostError> {
        let authority = &self.authority;
        let connect = |e: std::io::Error| PostError::Connect(format!("link to {authority}: {e}"));
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(authority))
            .await
            .map_err(|_| PostError::Connect(format!("link to {authority}: connection timed out")))?
            .map_err(connect)?;
        stream.set_nodelay(true).map_err(connect)?;
        let mut stream: Box<dyn Wire> = match &self.tls {
            Some(tls) => tls
                .connect_link(stream, self.target)
                .await
                .map_err(connect)?,
            None => Box::new(stream),
        };
        stream.write_all(frame::MAGIC).await.map_err(connect)?;
        Ok(Connection {
            stream: BufReader::with_capacity(64 * 1024, stream),
            last_exchange: 0,
            generation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_kinds_round_trip_through_their_routes() {
        for kind in [
            CallKind::Append,
            CallKind::Vote,
            CallKind::Snapshot,
            CallKind::Purge,
        ] {
            assert_eq!(CallKind::from_route(kind.route()), Some(kind));
        }
        assert_eq!(CallKind::from_route("batch"), None);
    }

    #[test]
    fn cluster_urls_become_authorities() {
        assert_eq!(authority_of("http://10.0.0.1:4439"), "10.0.0.1:4439");
        assert_eq!(
            authority_of("http://voter-0.ursula:4439/"),
            "voter-0.ursula:4439"
        );
        assert_eq!(authority_of("127.0.0.1:4439"), "127.0.0.1:4439");
    }
}
