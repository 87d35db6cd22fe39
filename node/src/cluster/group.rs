//! A group's openraft instance as the engine's `Replication`.

use std::sync::Arc;

use tokio::sync::{oneshot, watch};

use super::batcher::Batcher;
use super::types::Raft;
use crate::engine::replication::BoxFuture;
use crate::engine::{EngineError, GroupStatus, Replication, UncommittedGuard};
use crate::machine::{Command, Outcome};

pub struct RaftGroup {
    raft: Raft,
    batcher: Arc<Batcher>,
}

impl RaftGroup {
    /// Proposals gather in the group's batcher, which proposes between the turns of the
    /// node's Raft log writer (`log_writer_turns`).
    pub fn new(raft: Raft, log_writer_turns: watch::Receiver<u64>) -> Self {
        let batcher = Batcher::start(raft.clone(), log_writer_turns);
        Self { raft, batcher }
    }
}

impl Replication for RaftGroup {
    fn submit(
        &self,
        command: Command,
        held: Option<UncommittedGuard>,
    ) -> oneshot::Receiver<Result<Outcome, EngineError>> {
        self.batcher.submit(command, held)
    }

    fn status(&self) -> GroupStatus {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        GroupStatus {
            node: metrics.id,
            leader: metrics.current_leader,
            term: metrics.current_term,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            applied_index: metrics.last_applied.map_or(0, |id| id.index),
            applied_current_term: metrics
                .last_applied
                .is_some_and(|id| id.leader_id.term == metrics.current_term),
        }
    }

    fn allow_campaigns(&self, allow: bool) {
        self.raft.runtime_config().elect(allow);
    }

    /// openraft's read index: an openraft leader cut off from its voters does not step down
    /// by itself, so asking a quorum is the only proof.
    fn confirm_leadership(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { self.raft.ensure_linearizable().await.is_ok() })
    }
}
