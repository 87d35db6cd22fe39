//! The engine's one error type: what a proposal or a read of the engine can end in. A leaf,
//! so that the cluster's proposal batcher can name it without importing the engine.

use crate::machine::Refusal;
use crate::storage::StorageError;

/// Serializable: a voter answers a forwarded proposal with it (`subscriptions::change`).
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum EngineError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("storage failed: {0}")]
    Storage(String),
    #[error("the node is shutting down")]
    Stopped,
    /// This node does not lead the group; `leader` is the one it knows of, if any.
    #[error("this node does not lead the stream's Raft group")]
    NotLeader { leader: Option<u64> },
    #[error("replication failed: {0}")]
    Replication(String),
    /// No answer within `server.request_timeout`. The command may have been proposed, and may
    /// still apply.
    #[error(
        "no answer within server.request_timeout ({0:?}); the write may still apply: retry it (with the same producer headers, for exactly once)"
    )]
    TimedOut(std::time::Duration),
    /// Refused before proposing: the group has too many body bytes proposed and not applied.
    #[error(
        "the stream's Raft group has {proposed} body bytes proposed and not yet applied, at most {limit} may be"
    )]
    UncommittedBackpressure { proposed: u64, limit: u64 },
    /// A body could not be staged in object storage; nothing was proposed.
    #[error("cannot stage the body in object storage: {0}")]
    Staging(String),
    /// Refused before proposing: the group's records on local disk would exceed the hot cap.
    #[error(
        "the stream's Raft group holds {local} bytes of records on local disk, at most {limit} may be until cold flush catches up"
    )]
    ColdBackpressure { local: u64, limit: u64 },
}

impl EngineError {
    /// Whether this refusal came before anything was proposed (the engine's own checks).
    pub fn is_before_proposal(&self) -> bool {
        matches!(
            self,
            Self::UncommittedBackpressure { .. } | Self::ColdBackpressure { .. } | Self::Staging(_)
        )
    }
}

impl From<StorageError> for EngineError {
    fn from(e: StorageError) -> Self {
        Self::Storage(e.to_string())
    }
}
