//! What applying a command answered.

use super::stream::StreamMeta;
use super::subscription::SubscriptionOutcome;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerAck {
    pub epoch: u64,
    /// The highest seq accepted for this producer and epoch.
    pub seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendOutcome {
    pub next_offset: u64,
    pub closed: bool,
    pub producer: Option<ProducerAck>,
    /// A producer retry of a write that already applied: nothing was appended this time.
    pub duplicate: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    BucketCreated {
        created: bool,
    },
    StreamCreated {
        created: bool,
        meta: Box<StreamMeta>,
    },
    Appended(AppendOutcome),
    Deleted,
    Touched,
    Expired {
        streams: usize,
    },
    SnapshotPublished {
        created: bool,
    },
    RetentionAdvanced {
        retained_from: u64,
    },
    BucketPurged {
        streams: usize,
    },
    /// Whether the flushed range became the stream's cold segment. A flush of a range that is
    /// no longer all local (already flushed, behind retention, a stream since deleted) is not.
    ColdFlushed {
        accepted: bool,
    },
    Subscription(SubscriptionOutcome),
}

/// Why the machine refused a command. A refusal changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum Refusal {
    #[error("bucket {0} does not exist")]
    BucketNotFound(String),
    #[error("bucket {0} was purged; its ID is fenced")]
    BucketFenced(String),
    #[error("stream {0} does not exist")]
    StreamNotFound(String),
    #[error("stream {0} was deleted; it stays readable only through its forks")]
    StreamDeleted(String),
    #[error("stream {path} already exists with a different configuration: {reason}")]
    StreamConflict { path: String, reason: String },
    #[error("content type {request} does not match the stream's {stream}")]
    ContentTypeMismatch { stream: String, request: String },
    #[error("stream is closed at offset {next_offset}")]
    StreamClosed { next_offset: u64 },
    #[error("Stream-Seq {received} is not above the last one, {last}")]
    StreamSeqConflict { last: String, received: String },
    #[error("producer epoch {received} is older than the current epoch {current}")]
    ProducerFenced { current: u64, received: u64 },
    #[error("a new producer epoch must start at seq 0, got {seq}")]
    ProducerEpochSeqNotZero { seq: u64 },
    #[error("producer seq {received} skips ahead; expected {expected}")]
    ProducerSeqGap { expected: u64, received: u64 },
    #[error("the stream already has {limit} producers and none is idle")]
    TooManyProducers { limit: u32 },
    #[error("fork source {0} does not exist")]
    ForkSourceNotFound(String),
    #[error("fork source {0} was deleted")]
    ForkSourceDeleted(String),
    #[error("offset {offset} is beyond the tail {tail}")]
    OffsetBeyondTail { offset: u64, tail: u64 },
    #[error("offset {offset} is below the first retained offset {retained_from}")]
    OffsetNotRetained { offset: u64, retained_from: u64 },
    #[error("{0}")]
    InvalidFork(String),
    #[error("a different snapshot was already published at offset {offset}")]
    SnapshotConflict { offset: u64 },
    #[error("subscription {0} does not exist")]
    SubscriptionNotFound(String),
    #[error("subscription {0} already exists with a different configuration")]
    SubscriptionConflict(String),
    #[error("{0}")]
    InvalidSubscription(String),
    #[error("{0}")]
    InvalidAck(String),
    #[error(
        "the wake is not subscription {subscription}'s open one (its generation is {generation}): \
         it was acknowledged, released or issued again"
    )]
    WakeFenced {
        subscription: String,
        generation: u64,
    },
    #[error("the subscription's wake is claimed by {holder}")]
    AlreadyClaimed { holder: String },
}
