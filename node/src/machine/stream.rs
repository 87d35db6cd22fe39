//! The state of one stream incarnation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where a stream lives: a bucket and a stream name within it. The compatibility family maps
/// `/v1/stream/{name}` to `(compat_bucket, name)`, so names may contain `/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StreamPath {
    pub bucket: String,
    pub name: String,
}

impl StreamPath {
    pub fn new(bucket: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for StreamPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.bucket, self.name)
    }
}

/// An absolute expiry: the instant, and the text the client sent (echoed on HEAD).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiresAt {
    pub unix_ms: i64,
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkOrigin {
    pub source_id: u64,
    pub offset: u64,
    pub sub_offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub content_type: String,
    pub len: u64,
    pub digest: [u8; 32],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerState {
    pub epoch: u64,
    pub last_seq: u64,
    pub last_write_ms: u64,
}

/// Everything about a stream except its bytes and its producers, which are stored apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMeta {
    /// Unique per incarnation: a stream re-created at the same path gets a new ID, so its reads
    /// can never see the old incarnation's bytes.
    pub id: u64,
    pub path: StreamPath,
    pub content_type: String,
    pub ttl_secs: Option<u64>,
    pub expires_at: Option<ExpiresAt>,
    /// True when the TTL or expiry was taken from a fork source rather than given at create.
    pub expiry_inherited: bool,
    pub created_ms: u64,
    pub last_access_ms: u64,
    pub closed: bool,
    /// The offset the next appended byte gets.
    pub tail: u64,
    /// The first offset still readable; reads below it answer 410.
    pub retained_from: u64,
    pub fork: Option<ForkOrigin>,
    /// Live forks reading through this stream; a delete with forks only soft-deletes.
    pub fork_children: u32,
    pub soft_deleted: bool,
    pub stream_seq: Option<String>,
    pub snapshots: BTreeMap<u64, SnapshotInfo>,
}

impl StreamMeta {
    /// A text stream `b/s` with ID 1 and this tail, as unit tests start from.
    #[cfg(test)]
    pub fn for_tests(tail: u64) -> Self {
        Self {
            id: 1,
            path: StreamPath::new("b", "s"),
            content_type: "text/plain".into(),
            ttl_secs: None,
            expires_at: None,
            expiry_inherited: false,
            created_ms: 0,
            last_access_ms: 0,
            closed: false,
            tail,
            retained_from: 0,
            fork: None,
            fork_children: 0,
            soft_deleted: false,
            stream_seq: None,
            snapshots: Default::default(),
        }
    }

    pub fn is_json(&self) -> bool {
        is_json_content_type(&self.content_type)
    }

    pub fn expires(&self) -> bool {
        self.ttl_secs.is_some() || self.expires_at.is_some()
    }

    /// Expiry is decided on access with the caller's clock, not by a background sweep alone.
    pub fn is_expired(&self, now_ms: u64, last_access_ms: u64) -> bool {
        if let Some(at) = &self.expires_at
            && i128::from(now_ms) >= i128::from(at.unix_ms)
        {
            return true;
        }
        if let Some(ttl) = self.ttl_secs {
            let deadline = last_access_ms.saturating_add(ttl.saturating_mul(1000));
            return now_ms >= deadline;
        }
        false
    }
}

/// The media type, lower-cased, without parameters: `Application/JSON; charset=utf-8` →
/// `application/json`. Content types are compared in this form and stored as sent.
pub fn normalize_content_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// The media type of a content type, without parameters or surrounding space.
pub fn media_type(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or_default().trim()
}

/// Whether two content types name the same media type (case-insensitive, parameters
/// ignored). Checked on every append, so it compares in place rather than normalizing.
pub fn same_media_type(a: &str, b: &str) -> bool {
    media_type(a).eq_ignore_ascii_case(media_type(b))
}

pub fn is_json_content_type(content_type: &str) -> bool {
    media_type(content_type).eq_ignore_ascii_case("application/json")
}

pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";
