//! What the machine is asked to do. Every command carries the proposer's clock (`now_ms`), so
//! applying the same commands in the same order gives the same state on every replica.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::stream::{ExpiresAt, StreamPath};
use super::subscription::SubscriptionCommand;

/// Bytes to append, already validated and framed for the stream's mode.
///
/// In JSON mode `bytes` holds the flattened messages joined by commas (`m1,m2`) and `messages`
/// counts them; otherwise `bytes` is the body as sent and `messages` is 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    pub bytes: Bytes,
    pub messages: u32,
    /// A body the node staged in object storage before proposing it; `bytes` is then empty.
    pub staged: Option<StagedBody>,
}

/// A body in a cold object of its own (`runtime.external_payload_min_size`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedBody {
    pub key: String,
    pub len: u64,
}

impl Payload {
    pub fn inline(bytes: Bytes, messages: u32) -> Self {
        Self {
            bytes,
            messages,
            staged: None,
        }
    }

    /// Bytes it adds to the stream.
    pub fn len(&self) -> u64 {
        self.staged
            .as_ref()
            .map_or(self.bytes.len() as u64, |staged| staged.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The idempotent-producer triple of an append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerClaim {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkSpec {
    pub source: StreamPath,
    /// `None` forks at the source's tail.
    pub offset: Option<u64>,
    pub sub_offset: u64,
    /// With a sub-offset: the leading part of the source record at `offset`, cut by the proposer
    /// from committed (immutable) data, and the source incarnation it was cut from.
    pub partial: Option<PartialRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialRecord {
    pub source_id: u64,
    pub payload: Payload,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateStream {
    pub path: StreamPath,
    /// As sent; `None` means the default (octet-stream) or, for a fork, the source's type.
    pub content_type: Option<String>,
    pub ttl_secs: Option<u64>,
    pub expires_at: Option<ExpiresAt>,
    pub closed: bool,
    pub initial: Option<Payload>,
    pub fork: Option<ForkSpec>,
    pub now_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendStream {
    pub path: StreamPath,
    /// Only checked when there is a payload: a close-only request may carry any type.
    pub content_type: Option<String>,
    pub payload: Option<Payload>,
    pub close: bool,
    pub stream_seq: Option<String>,
    pub producer: Option<ProducerClaim>,
    pub now_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishSnapshot {
    pub path: StreamPath,
    pub offset: u64,
    pub content_type: String,
    pub body: Bytes,
    pub digest: [u8; 32],
    pub now_ms: u64,
}

impl Command {
    /// The bodies the command carries: a create's fork part and initial body, an append's.
    fn payloads(&self) -> impl Iterator<Item = &Payload> {
        let (first, second) = match self {
            Self::Create(create) => (
                create
                    .fork
                    .as_ref()
                    .and_then(|fork| fork.partial.as_ref())
                    .map(|partial| &partial.payload),
                create.initial.as_ref(),
            ),
            Self::Append(append) => (append.payload.as_ref(), None),
            _ => (None, None),
        };
        first.into_iter().chain(second)
    }

    /// Bytes of data the command carries in the log (an append's or a create's body; a staged
    /// body is in object storage and carries none).
    pub fn body_len(&self) -> u64 {
        self.payloads().map(|p| p.bytes.len() as u64).sum()
    }

    /// The objects of the bodies the node staged for this command.
    pub fn staged_keys(&self) -> Vec<String> {
        self.payloads()
            .filter_map(|p| p.staged.as_ref().map(|staged| staged.key.clone()))
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    CreateBucket {
        bucket: String,
    },
    Create(CreateStream),
    Append(AppendStream),
    Delete {
        path: StreamPath,
        now_ms: u64,
    },
    /// Reads reset sliding TTLs; the node batches those resets into this command.
    Touch {
        touches: Vec<(u64, u64)>,
    },
    ExpireDue {
        now_ms: u64,
    },
    PublishSnapshot(PublishSnapshot),
    AdvanceRetention {
        path: StreamPath,
        offset: u64,
        now_ms: u64,
    },
    /// Deletes every stream of the bucket and fences its ID for good.
    PurgeBucket {
        bucket: String,
    },
    /// The records of a stream from `first` to `until` are in the cold object `key`.
    ColdFlush(ColdFlush),
    /// A change of a subscription (`__ds/subscriptions/{id}`) and its wakes.
    Subscription(SubscriptionCommand),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdFlush {
    /// The incarnation the leader read the records of; a re-created stream is another one.
    pub stream_id: u64,
    pub first: u64,
    pub until: u64,
    pub key: String,
}
