//! Gathers a group's concurrent proposals into one log entry. At most `IN_FLIGHT` entries of a
//! group are being replicated at once; proposals arriving meanwhile wait and go together in the
//! next entry. Under load an entry carries many commands, so the per-entry costs (a log
//! record, an AppendEntries to each follower, an apply and an answer on every voter) are shared;
//! with a single writer nothing waits.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, oneshot};

use super::types::Raft;
use crate::engine::EngineError;
use crate::machine::{Command, Outcome};

/// Entries of one group in flight at once.
const IN_FLIGHT: usize = 8;
/// Commands in one entry at most, and their body bytes.
const MAX_COMMANDS: usize = 512;
const MAX_BYTES: u64 = 4 * 1024 * 1024;

type Reply = oneshot::Sender<Result<Outcome, EngineError>>;

pub struct Batcher {
    queue: Mutex<Vec<(Command, Reply)>>,
    wake: Notify,
}

impl Batcher {
    /// Starts the group's batcher task.
    pub fn start(raft: Raft) -> Arc<Self> {
        let batcher = Arc::new(Self {
            queue: Mutex::new(Vec::new()),
            wake: Notify::new(),
        });
        tokio::spawn(batcher.clone().run(raft));
        batcher
    }

    pub async fn propose(&self, command: Command) -> Result<Outcome, EngineError> {
        let (reply, answer) = oneshot::channel();
        self.queue.lock().push((command, reply));
        self.wake.notify_one();
        answer.await.map_err(|_| EngineError::Stopped)?
    }

    /// The next entry's commands: everything waiting, up to the entry limits.
    fn take(&self) -> Vec<(Command, Reply)> {
        let mut queue = self.queue.lock();
        let mut bytes = 0;
        let mut count = 0;
        for (command, _) in queue.iter() {
            bytes += command.body_len();
            if count > 0 && (count == MAX_COMMANDS || bytes > MAX_BYTES) {
                break;
            }
            count += 1;
        }
        let rest = queue.split_off(count);
        std::mem::replace(&mut *queue, rest)
    }

    async fn run(self: Arc<Self>, raft: Raft) {
        let slots = Arc::new(Semaphore::new(IN_FLIGHT));
        loop {
            // A slot first: while every slot is busy, proposals gather in the queue.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let batch = loop {
                let batch = self.take();
                if !batch.is_empty() {
                    break batch;
                }
                self.wake.notified().await;
            };
            if !self.queue.lock().is_empty() {
                self.wake.notify_one();
            }
            let raft = raft.clone();
            tokio::spawn(async move {
                let (commands, replies): (Vec<Command>, Vec<Reply>) = batch.into_iter().unzip();
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
                drop(slot);
            });
        }
    }
}
