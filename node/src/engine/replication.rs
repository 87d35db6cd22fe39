//! The seam between the engine and whatever replicates its group: the engine proposes through
//! a `Replication` and reads its group's state from it; `cluster` implements it with openraft.
//! Nothing under `engine/` knows of Raft.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::ReplicaParts;
use super::error::EngineError;
use super::uncommitted::UncommittedGuard;
use crate::machine::{Command, Outcome};

/// A voter's ID, as the cluster's config names it.
pub type NodeId = u64;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What this node knows of its group now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupStatus {
    pub node: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    /// The last applied entry is of the current term (a new leader's first entry is): every
    /// entry of earlier terms has been applied.
    pub applied_current_term: bool,
}

impl GroupStatus {
    pub fn leads(&self) -> bool {
        self.leader == Some(self.node)
    }
}

pub trait Replication: Send + Sync {
    /// Proposes `command`; the receiver gets its outcome once a quorum holds it and this node
    /// applied it. `held` is released once the proposal is answered, or dropped unsent.
    fn submit(
        &self,
        command: Command,
        held: Option<UncommittedGuard>,
    ) -> oneshot::Receiver<Result<Outcome, EngineError>>;

    fn status(&self) -> GroupStatus;

    /// Whether this node may campaign for leadership (a draining node may not).
    fn allow_campaigns(&self, allow: bool);

    /// Confirms with a quorum that this node still leads, once it has applied everything
    /// committed before.
    fn confirm_leadership(&self) -> BoxFuture<'_, bool>;
}

/// Starts a group's replication around the state machine parts of its replica.
pub type StartReplication = Box<
    dyn FnOnce(ReplicaParts) -> BoxFuture<'static, Result<Arc<dyn Replication>, String>> + Send,
>;
