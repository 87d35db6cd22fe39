//! The openraft type configuration: a log entry carries a batch of state machine commands (the
//! proposals a group's batcher gathered while earlier ones were in flight).

use std::io::Cursor;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::machine::{Command, Outcome, Refusal};

pub use crate::engine::NodeId;

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Batch,
        R = ApplyReply,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;

/// The commands of one log entry, applied in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch(pub Vec<Command>);

/// What applying an entry answered its proposer. Only the leader that proposed the entry hands
/// it out, in process; openraft's serde bounds require it to be serializable, but it never
/// crosses the network, so it serializes as nothing and deserializes as `None`.
#[derive(Debug, Default)]
pub struct ApplyReply(pub Option<Vec<Result<Outcome, Refusal>>>);

impl Serialize for ApplyReply {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_unit()
    }
}

impl<'de> Deserialize<'de> for ApplyReply {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <()>::deserialize(deserializer)?;
        Ok(Self(None))
    }
}

/// Storage failures in openraft's terms.
pub mod fail {
    use openraft::{AnyError, StorageIOError};

    use super::StorageError;

    pub fn read_logs(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::read_logs(AnyError::error(e)).into()
    }
    pub fn write_logs(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::write_logs(AnyError::error(e)).into()
    }
    pub fn read_vote(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::read_vote(AnyError::error(e)).into()
    }
    pub fn write_vote(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::write_vote(AnyError::error(e)).into()
    }
    pub fn read_state(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::read_state_machine(AnyError::error(e)).into()
    }
    pub fn write_state(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::write_state_machine(AnyError::error(e)).into()
    }
    pub fn write_snapshot(e: impl std::fmt::Display) -> StorageError {
        StorageIOError::write_snapshot(None, AnyError::error(e)).into()
    }
}
