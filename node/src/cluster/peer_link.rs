//! Raft RPCs of every group to one peer, coalesced: while an exchange with the peer is in
//! flight, the calls that arrive meanwhile wait and then go together as one HTTP/2 request to
//! `/raft/batch`, which the peer answers call by call. Each group's replication keeps one RPC
//! in flight per follower, so with many groups most RPCs find company; per-request costs (a
//! stream, its frames and tasks on both sides) were the largest part of a replicated append's
//! CPU. A call that finds the link idle goes at once, alone.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::coalesce::{Coalescer, Item};
use super::network::{HttpClient, PostError, post};

/// Exchanges with one peer in flight at once. One measured 15% less CPU per append than two
/// (3 voters, 16 groups, 32 writers): calls wait a little longer and go in bigger batches.
const IN_FLIGHT: usize = 1;
/// Calls in one exchange at most, and their body bytes.
const MAX_CALLS: usize = 256;
const MAX_BYTES: u64 = 8 * 1024 * 1024;

/// The Raft calls a link carries (snapshots go alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CallKind {
    Append,
    Vote,
}

impl CallKind {
    /// The route of the same call sent alone: `/raft/{group}/{route}`.
    pub fn route(self) -> &'static str {
        match self {
            Self::Append => "append",
            Self::Vote => "vote",
        }
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
    /// Starts the link to the peer whose cluster listener is `base_url`.
    pub fn start(client: HttpClient, base_url: &str) -> Arc<Self> {
        let url: Arc<str> = format!("{}/raft/batch", base_url.trim_end_matches('/')).into();
        let queue = Coalescer::start(IN_FLIGHT, MAX_CALLS, MAX_BYTES, move |batch| {
            exchange(client.clone(), url.clone(), batch)
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

/// One exchange: the batch as one request, each answer to its caller.
async fn exchange(client: HttpClient, url: Arc<str>, batch: Vec<Pending>) {
    // The exchange may take as long as its most patient caller waits.
    let timeout = batch
        .iter()
        .map(|p| p.timeout)
        .max()
        .unwrap_or(Duration::from_secs(1));
    let (calls, replies): (Vec<BatchCall>, Vec<_>) =
        batch.into_iter().map(|p| (p.call, p.reply)).unzip();
    let answers = match postcard::to_allocvec(&calls) {
        Ok(body) => post(&client, &url, body, timeout).await.and_then(|bytes| {
            postcard::from_bytes::<Vec<BatchAnswer>>(&bytes)
                .map_err(|e| PostError::Other(format!("a batch answer: {e}")))
        }),
        Err(error) => Err(PostError::Other(error.to_string())),
    };
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
