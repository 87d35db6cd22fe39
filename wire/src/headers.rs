//! Header names, lower-case as HTTP/2 sends them (HTTP/1 names are case-insensitive).

pub const STREAM_NEXT_OFFSET: &str = "stream-next-offset";
pub const STREAM_UP_TO_DATE: &str = "stream-up-to-date";
pub const STREAM_CLOSED: &str = "stream-closed";
pub const STREAM_CURSOR: &str = "stream-cursor";
pub const STREAM_TTL: &str = "stream-ttl";
pub const STREAM_EXPIRES_AT: &str = "stream-expires-at";
pub const STREAM_SEQ: &str = "stream-seq";
pub const STREAM_FORKED_FROM: &str = "stream-forked-from";
pub const STREAM_FORK_OFFSET: &str = "stream-fork-offset";
pub const STREAM_FORK_SUB_OFFSET: &str = "stream-fork-sub-offset";
pub const STREAM_SSE_DATA_ENCODING: &str = "stream-sse-data-encoding";
/// Ursula extension: the first retained offset, on retention answers and 410s below it.
pub const STREAM_RETAINED_OFFSET: &str = "stream-retained-offset";
/// Ursula extension: the offset a snapshot was taken at, on bootstrap and snapshot reads.
pub const STREAM_SNAPSHOT_OFFSET: &str = "stream-snapshot-offset";

pub const PRODUCER_ID: &str = "producer-id";
pub const PRODUCER_EPOCH: &str = "producer-epoch";
pub const PRODUCER_SEQ: &str = "producer-seq";
pub const PRODUCER_EXPECTED_SEQ: &str = "producer-expected-seq";
pub const PRODUCER_RECEIVED_SEQ: &str = "producer-received-seq";

/// The marker: this refusal was sent before anything of the request was proposed.
pub const NOT_APPLIED: &str = "x-ursula-not-applied";
/// The vouch: a gateway at 0.7.3 or newer applied the redirect rule. Nodes never send it.
pub const NOT_APPLIED_CHECKED: &str = "x-ursula-not-applied-checked";
/// The node ID of the leader a redirect points at.
pub const LEADER_ID: &str = "x-ursula-leader-id";
