//! Gathers a group's concurrent proposals into one log entry. At most `IN_FLIGHT` entries of a
//! group are being replicated at once; proposals arriving meanwhile wait and go together in the
//! next entry. Under load an entry carries many commands, so the per-entry costs (a log
//! record, an AppendEntries to each follower, an apply and an answer on every voter) are shared;
//! with a single writer nothing waits.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::coalesce::{Coalescer, Item};
use super::types::Raft;
use crate::engine::EngineError;
use crate::machine::{Command, Outcome};

/// Entries of one group in flight at once.
const IN_FLIGHT: usize = 8;
/// Commands in one entry at most, and their body bytes.
const MAX_COMMANDS: usize = 512;
const MAX_BYTES: u64 = 4 * 1024 * 1024;

struct Proposal {
    command: Command,
    reply: oneshot::Sender<Result<Outcome, EngineError>>,
}

impl Item for Proposal {
    fn size(&self) -> u64 {
        self.command.body_len()
    }
}

pub struct Batcher {
    queue: Arc<Coalescer<Proposal>>,
}

impl Batcher {
    /// Starts the group's batcher task.
    pub fn start(raft: Raft) -> Arc<Self> {
        let queue = Coalescer::start(IN_FLIGHT, MAX_COMMANDS, MAX_BYTES, move |batch| {
            propose(raft.clone(), batch)
        });
        Arc::new(Self { queue })
    }

    pub async fn propose(&self, command: Command) -> Result<Outcome, EngineError> {
        let (reply, answer) = oneshot::channel();
        self.queue.push(Proposal { command, reply });
        answer.await.map_err(|_| EngineError::Stopped)?
    }
}

/// Proposes a batch as one entry and answers each proposal.
async fn propose(raft: Raft, batch: Vec<Proposal>) {
    let (commands, replies): (Vec<Command>, Vec<_>) =
        batch.into_iter().map(|p| (p.command, p.reply)).unzip();
    match super::propose_batch(&raft, commands).await {
        Ok(results) => {
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result.map_err(EngineError::Refused));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}
