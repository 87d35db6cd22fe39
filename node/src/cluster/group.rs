//! A group's openraft instance as the engine's `Replication`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{oneshot, watch};

use super::batcher::Batcher;
use super::rejoin::Rejoining;
use super::stop::RaftCalls;
use super::types::Raft;
use crate::engine::replication::BoxFuture;
use crate::engine::{EngineError, GroupStatus, Replication, UncommittedGuard};
use crate::machine::{Command, Outcome};

pub struct RaftGroup {
    raft: Raft,
    calls: RaftCalls,
    group: u32,
    batcher: Arc<Batcher>,
    /// Whether the node lets its replicas campaign (a drain does not); a rejoining replica
    /// campaigns only once readmitted (`membership::follow`).
    campaigns: Arc<AtomicBool>,
    rejoining: Arc<Rejoining>,
    /// The term this node led the group in when it restarted, and its last log index then
    /// (`LogStore::restored_leadership`).
    restored: Option<(u64, u64)>,
}

impl RaftGroup {
    /// Proposals gather in the group's batcher, which proposes between the turns of the
    /// node's Raft log writer (`log_writer_turns`).
    pub fn new(
        raft: Raft,
        calls: RaftCalls,
        group: u32,
        log_writer_turns: watch::Receiver<u64>,
        restored: Option<(u64, u64)>,
        campaigns: Arc<AtomicBool>,
        rejoining: Arc<Rejoining>,
    ) -> Self {
        let batcher = Batcher::start(raft.clone(), calls.clone(), log_writer_turns);
        Self {
            raft,
            calls,
            group,
            batcher,
            campaigns,
            rejoining,
            restored,
        }
    }
}

/// Whether a replica has applied every entry committed before: once it applied an entry of its
/// current term (a leader's first entry comes after all of them), and a leader restored in its
/// old term (`LogStore::restored_leadership`), which appends no first entry, once it applied
/// what its log held at the restart.
fn applied_its_log(
    applied: Option<super::types::LogId>,
    current_term: u64,
    restored: Option<(u64, u64)>,
) -> bool {
    applied.is_some_and(|id| {
        id.leader_id.term == current_term
            && restored.is_none_or(|(term, last)| term != current_term || id.index >= last)
    })
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
            applied_current_term: applied_its_log(
                metrics.last_applied,
                metrics.current_term,
                self.restored,
            ),
        }
    }

    fn allow_campaigns(&self, allow: bool) {
        self.campaigns.store(allow, Ordering::Relaxed);
        self.raft
            .runtime_config()
            .elect(allow && !self.rejoining.contains(self.group));
    }

    /// openraft's read index: an openraft leader cut off from its voters does not step down
    /// by itself, so asking a quorum is the only proof.
    fn confirm_leadership(&self) -> BoxFuture<'_, bool> {
        Box::pin(async {
            let confirmed = self.calls.run(self.raft.ensure_linearizable()).await;
            confirmed.is_some_and(|answer| answer.is_ok())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, index: u64) -> super::super::types::LogId {
        openraft::LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
    }

    #[test]
    fn a_leader_restored_in_its_old_term_has_applied_its_log_only_up_to_its_last_index() {
        for (applied, term, restored, expected) in [
            (None, 3, None, false),
            // Elected: applied its term's first entry, or not yet.
            (Some(log_id(3, 10)), 3, None, true),
            (Some(log_id(2, 10)), 3, None, false),
            // Restored in term 3 with entries up to 40 in its log.
            (Some(log_id(3, 10)), 3, Some((3, 40)), false),
            (Some(log_id(3, 39)), 3, Some((3, 40)), false),
            (Some(log_id(3, 40)), 3, Some((3, 40)), true),
            // Elected again since: the usual rule.
            (Some(log_id(4, 41)), 4, Some((3, 40)), true),
            (Some(log_id(3, 40)), 4, Some((3, 40)), false),
        ] {
            assert_eq!(
                applied_its_log(applied, term, restored),
                expected,
                "applied {applied:?} in term {term}, restored {restored:?}"
            );
        }
    }
}
