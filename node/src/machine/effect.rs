//! What storage must do so that it holds the machine's new state. The machine emits effects and
//! performs no I/O; the engine writes all effects of a batch in one transaction.

use std::sync::Arc;

use bytes::Bytes;

use super::stream::{ProducerState, StreamMeta, StreamPath};
use super::subscription::Subscription;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketState {
    Active,
    Fenced,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    PutBucket {
        bucket: String,
        state: BucketState,
    },
    SetNextStreamId(u64),
    /// Shared: the read model publishes the same value storage writes.
    PutStream(Arc<StreamMeta>),
    DeleteStream {
        id: u64,
        path: StreamPath,
    },
    PutRecord {
        stream_id: u64,
        offset: u64,
        bytes: Bytes,
    },
    /// Retention: records, and cold segments, wholly below `offset` are gone.
    DeleteRecordsBelow {
        stream_id: u64,
        offset: u64,
    },
    /// `[from, until)` of the stream is read from the cold object `key` from now on; the
    /// object's records start at `first`.
    PutColdSegment {
        stream_id: u64,
        from: u64,
        until: u64,
        first: u64,
        key: Arc<str>,
    },
    /// Local records wholly below `offset` may go: a cold segment holds them.
    DropLocalBelow {
        stream_id: u64,
        offset: u64,
    },
    PutProducer {
        stream_id: u64,
        producer_id: String,
        state: ProducerState,
    },
    DeleteProducer {
        stream_id: u64,
        producer_id: String,
    },
    PutSnapshot {
        stream_id: u64,
        offset: u64,
        content_type: String,
        body: Bytes,
    },
    DeleteSnapshot {
        stream_id: u64,
        offset: u64,
    },
    /// Shared, like `PutStream`: the read model publishes what storage writes.
    PutSubscription(Arc<Subscription>),
    DeleteSubscription {
        bucket: String,
        id: String,
    },
}
