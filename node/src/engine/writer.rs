//! The single writer: applies commands to the state machine in batches and makes each batch
//! durable with one WAL append and one fsync (group commit). Then it publishes the batch to
//! readers, answers its proposers, and hands the effects to the applier, which writes them to
//! redb off the request path. After a crash, start-up replays the WAL records past redb's last
//! checkpoint through the same deterministic state machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::applier::AppliedBatch;
use super::registry::Registry;
use super::touch::TouchTracker;
use super::{EngineError, Metrics};
use crate::machine::{Command, Effect, Machine, Outcome, Refusal};
use crate::storage::wal::Wal;

/// Commands taken into one batch at most; more wait for the next fsync.
const MAX_BATCH: usize = 1024;

pub struct Proposal {
    pub command: Command,
    pub reply: oneshot::Sender<Result<Outcome, EngineError>>,
}

pub struct Writer {
    pub machine: Machine,
    pub wal: Wal,
    pub registry: Arc<Registry>,
    pub touches: Arc<TouchTracker>,
    pub metrics: Arc<Metrics>,
    pub applier: SyncSender<AppliedBatch>,
    pub checkpointed: Arc<AtomicU64>,
    /// Log bytes past the last checkpoint, for write admission.
    pub log_bytes: Arc<AtomicU64>,
    /// The current batch's commands; empty between batches.
    pub commands: Vec<Command>,
}

impl Writer {
    pub fn run(mut self, mut inbox: mpsc::Receiver<Proposal>) {
        let mut batch: Vec<Proposal> = Vec::with_capacity(MAX_BATCH);
        while let Some(first) = inbox.blocking_recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match inbox.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            self.commit_batch(&mut batch);
            self.wal
                .purge_through(self.checkpointed.load(Ordering::Acquire));
            self.log_bytes
                .store(self.wal.unsnapshotted_bytes(), Ordering::Release);
        }
    }

    fn commit_batch(&mut self, batch: &mut Vec<Proposal>) {
        // Batches come thousands of times a second: their working vectors are reused rather
        // than allocated, grown and freed each time (glibc's malloc showed in the profile).
        let mut commands = std::mem::take(&mut self.commands);
        let touches = self.touches.drain();
        if !touches.is_empty() {
            commands.push(Command::Touch { touches });
        }
        let replies: Vec<_> = batch
            .drain(..)
            .map(|proposal| {
                commands.push(proposal.command);
                proposal.reply
            })
            .collect();
        // The WAL record is the batch's commands, encoded before they are applied.
        let staged = self.wal.stage(&commands);

        // About one record and a share of a metadata write per command.
        let mut effects: Vec<Effect> = Vec::with_capacity(commands.len() * 2);
        let mut results: Vec<Result<Outcome, Refusal>> = Vec::with_capacity(replies.len());
        let first_reply = commands.len() - replies.len();
        for (i, command) in commands.drain(..).enumerate() {
            let result = self.machine.apply_in_batch(command, &mut effects);
            if i >= first_reply {
                results.push(result);
            }
        }
        self.commands = commands;
        self.machine.finish_batch(&mut effects);
        // A batch the WAL cannot take ends the process (below), so counting now is exact.
        self.metrics.count(replies.len() as u64, &effects);

        // A batch without effects changed nothing and needs no write.
        if !effects.is_empty() {
            let seq = self.wal.last_seq() + 1;
            let started = Instant::now();
            let written = staged
                .map_err(|e| e.to_string())
                .and_then(|()| self.wal.append_staged(seq).map_err(|e| e.to_string()));
            if let Err(error) = written {
                // The machine is ahead of the log and the page cache cannot be trusted after a
                // failed sync: refuse the batch and restart, which recovers from the WAL.
                tracing::error!(%error, "WAL write failed; exiting to recover");
                for reply in replies {
                    let _ = reply.send(Err(EngineError::Storage(error.clone())));
                }
                std::process::exit(70);
            }
            self.metrics.observe_fsync(started.elapsed());
            self.metrics.batches.fetch_add(1, Ordering::Relaxed);
            self.registry.publish(&effects, seq);
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result.map_err(EngineError::Refused));
            }
            let batch = AppliedBatch {
                seq,
                effects,
                raft: None,
            };
            if self.applier.send(batch).is_err() {
                tracing::error!("the applier stopped; exiting to recover");
                std::process::exit(70);
            }
            return;
        }
        for (reply, result) in replies.into_iter().zip(results) {
            let _ = reply.send(result.map_err(EngineError::Refused));
        }
    }
}
