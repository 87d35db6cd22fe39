//! The single writer: applies commands to the state machine in batches and makes each batch
//! durable with one fsync (group commit) before anyone sees its results.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::registry::Registry;
use super::touch::TouchTracker;
use super::{EngineError, Metrics};
use crate::machine::{Command, Effect, Machine, Outcome, Refusal};
use crate::storage::Store;

/// Commands taken into one batch at most; more wait for the next fsync.
const MAX_BATCH: usize = 4096;

pub struct Proposal {
    pub command: Command,
    pub reply: oneshot::Sender<Result<Outcome, EngineError>>,
}

pub struct Writer {
    pub machine: Machine,
    pub store: Arc<Store>,
    pub registry: Arc<Registry>,
    pub touches: Arc<TouchTracker>,
    pub metrics: Arc<Metrics>,
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
        }
    }

    fn commit_batch(&mut self, batch: &mut Vec<Proposal>) {
        let mut effects: Vec<Effect> = Vec::new();
        let touches = self.touches.drain();
        if !touches.is_empty() {
            effects.extend(self.machine.apply(Command::Touch { touches }).effects);
        }
        let mut results: Vec<Result<Outcome, Refusal>> = Vec::with_capacity(batch.len());
        let mut appends = 0u64;
        let mut appended_bytes = 0u64;
        for proposal in batch.iter() {
            let applied = self.machine.apply(proposal.command.clone());
            for effect in &applied.effects {
                if let Effect::PutRecord { bytes, .. } = effect {
                    appends += 1;
                    appended_bytes += bytes.len() as u64;
                }
            }
            effects.extend(applied.effects);
            results.push(applied.result);
        }
        self.metrics
            .commands
            .fetch_add(batch.len() as u64, Ordering::Relaxed);

        if !effects.is_empty() {
            let started = Instant::now();
            if let Err(error) = self.store.commit(&effects, true) {
                tracing::error!(%error, "commit failed; the batch is refused and state reloaded");
                self.metrics.commit_failures.fetch_add(1, Ordering::Relaxed);
                for proposal in batch.drain(..) {
                    let _ = proposal
                        .reply
                        .send(Err(EngineError::Storage(error.to_string())));
                }
                self.reload();
                return;
            }
            self.metrics.observe_fsync(started.elapsed());
            self.metrics.batches.fetch_add(1, Ordering::Relaxed);
            self.metrics.appends.fetch_add(appends, Ordering::Relaxed);
            self.metrics
                .appended_bytes
                .fetch_add(appended_bytes, Ordering::Relaxed);
            self.registry.publish(effects);
        }
        for (proposal, result) in batch.drain(..).zip(results) {
            let _ = proposal.reply.send(result.map_err(EngineError::Refused));
        }
    }

    /// After a failed commit the machine is ahead of storage: rebuild it from what is durable.
    fn reload(&mut self) {
        match self.store.load(self.machine.limits()) {
            Ok(machine) => {
                self.machine = machine;
                self.registry.reset(
                    self.machine.buckets(),
                    self.machine.streams().map(|s| &s.meta),
                );
            }
            Err(error) => {
                tracing::error!(%error, "cannot reload state after a failed commit; exiting");
                std::process::exit(70);
            }
        }
    }
}
