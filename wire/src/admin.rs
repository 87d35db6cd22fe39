//! Admin API types (the admin listener, port 4438), shared with the operator.

use serde::{Deserialize, Serialize};

/// The answer to `POST /admin/buckets/{bucket}/purge`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeResponse {
    pub bucket: String,
    /// Streams this purge deleted; 0 when the bucket was already purged.
    pub purged_streams: u64,
    /// Always true after a successful purge: the bucket ID can never be used again.
    pub fenced: bool,
}
