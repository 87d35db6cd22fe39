//! Gathers a group's concurrent proposals into one log entry. At most `IN_FLIGHT` entries of a
//! group are being replicated at once; proposals arriving meanwhile wait and go together in the
//! next entry. Under load an entry carries many commands, so the per-entry costs (a log
//! record, an AppendEntries to each follower, an apply and an answer on every voter) are shared;
//! with a single writer nothing waits. An entry is proposed between the turns of the node's
//! Raft log writer, so that the entries of all groups proposed during a turn share the next
//! record's fsync and each follower's next exchange.

use std::sync::Arc;

use tokio::sync::{oneshot, watch};

use super::coalesce::{Coalescer, Item};
use super::stop::RaftCalls;
use super::types::Raft;
use crate::engine::error::EngineError;
use crate::engine::uncommitted::UncommittedGuard;
use crate::machine::{Command, Outcome};

/// Entries of one group in flight at once. Fewer, fuller entries are what makes a busy group
/// fast (per-entry costs on every voter dwarf per-command ones): with one group taking all
/// the load (3 voters, 32 writers) 2 in flight gave 14.7–15.2k appends/s where 8 gave
/// 7.9–9.3k, and with the load spread over 16 groups (2 writers each) 0.92–1.0× of 8.
const IN_FLIGHT: usize = 2;
/// Commands in one entry at most, and their body bytes.
const MAX_COMMANDS: usize = 512;
const MAX_BYTES: u64 = 4 * 1024 * 1024;

struct Proposal {
    command: Command,
    reply: oneshot::Sender<Result<Outcome, EngineError>>,
    /// Held until the proposal is answered, or dropped unsent.
    held: Option<UncommittedGuard>,
}

impl Item for Proposal {
    fn size(&self) -> u64 {
        self.command.body_len()
    }

    /// Its caller stopped waiting (`server.request_timeout`) before it was proposed: it is
    /// dropped, never proposed.
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }
}

pub struct Batcher {
    queue: Arc<Coalescer<Proposal>>,
}

impl Batcher {
    /// Starts the group's batcher task; it proposes between the turns of the Raft log writer
    /// (`LogDb::writer_turns`).
    pub fn start(
        raft: Raft,
        calls: RaftCalls,
        log_writer_turns: watch::Receiver<u64>,
    ) -> Arc<Self> {
        let turns = Some(log_writer_turns);
        let queue = Coalescer::start(IN_FLIGHT, MAX_COMMANDS, MAX_BYTES, turns, move |batch| {
            propose(raft.clone(), calls.clone(), batch)
        });
        Arc::new(Self { queue })
    }

    /// Queues a command for the next entry; the receiver gets its answer.
    pub fn submit(
        &self,
        command: Command,
        held: Option<UncommittedGuard>,
    ) -> oneshot::Receiver<Result<Outcome, EngineError>> {
        let (reply, answer) = oneshot::channel();
        self.queue.push(Proposal {
            command,
            reply,
            held,
        });
        answer
    }
}

/// Proposes a batch as one entry and answers each proposal.
async fn propose(raft: Raft, calls: RaftCalls, batch: Vec<Proposal>) {
    let mut held = Vec::with_capacity(batch.len());
    let (commands, replies): (Vec<Command>, Vec<_>) = batch
        .into_iter()
        .map(|p| {
            held.push(p.held);
            (p.command, p.reply)
        })
        .unzip();
    let answered = super::propose_batch(&raft, &calls, commands).await;
    drop(held);
    match answered {
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
