//! The applier: writes the effects of durable WAL records to redb, off the request path, and
//! checkpoints redb now and then so the WAL before the checkpoint can be deleted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use super::registry::Registry;
use crate::machine::Effect;
use crate::storage::Store;

/// Effects merged into one redb transaction at most.
const MAX_EFFECTS: usize = 64 * 1024;
/// How long an applier gathers batches into one redb transaction at least, unless a reader
/// waits for redb (a snapshot body, a Raft snapshot; `Registry::wait_stored`). redb transactions
/// have a fixed cost (new pages are allocated zero-filled and written out whole); gathering the
/// batches of a while into one keeps the applier's CPU small. Readers do not wait: unstored
/// records stay in the tail cache. Measured against 50 ms: a single node's applier used 30%
/// less CPU, a 3-voter cluster's 16 per-group appliers 70% less (42 -> 12 µs per append over
/// all voters). Longer is not better for a single node: 1 s measured 0.93x its appends/s
/// (paired runs), its transactions being five times the size.
pub const NODE_COMMIT_INTERVAL: Duration = Duration::from_millis(200);
/// A replica's applier carries one group's share of the node's writes, and a voter runs one
/// per group, so each waits longer for a transaction of the same size: 16 groups committing
/// every 200 ms were 80 transactions a second per voter. Measured with 16 groups: the
/// appliers' CPU 28 -> 9 µs per append over all voters.
pub const REPLICA_COMMIT_INTERVAL: Duration = Duration::from_secs(1);

/// The effects of the log up to `seq`, for redb.
pub struct AppliedBatch {
    pub seq: u64,
    pub effects: Vec<Effect>,
    /// On a replicated node: the Raft position of `seq`, stored with the effects.
    pub raft: Option<Vec<u8>>,
}

pub struct Applier {
    pub store: Arc<Store>,
    pub registry: Arc<Registry>,
    /// The last WAL record a durable checkpoint covers; the writer purges the WAL up to it.
    pub checkpointed: Arc<AtomicU64>,
    /// How often redb is made durable, bounding the WAL a restart replays.
    pub checkpoint_interval: Duration,
    /// `NODE_COMMIT_INTERVAL` or `REPLICA_COMMIT_INTERVAL`.
    pub commit_interval: Duration,
}

impl Applier {
    pub fn run(self, inbox: Receiver<AppliedBatch>) {
        lower_priority();
        self.registry.register_applier();
        let mut last_checkpoint = Instant::now();
        let mut last_commit = Instant::now();
        let mut stored = self.registry.stored_seq();
        // Reused across commits: growing a fresh vector each time costs more than redb does.
        let mut effects: Vec<Effect> = Vec::new();
        let mut raft: Option<Vec<u8>> = None;
        let mut wrote_to: Vec<u64> = Vec::new();
        loop {
            let mut seq = match inbox.recv_timeout(self.checkpoint_interval) {
                Ok(first) => {
                    effects.extend(first.effects);
                    raft = first.raft.or(raft);
                    first.seq
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    self.checkpoint(stored, &mut last_checkpoint);
                    continue;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            };
            let gathered_until = last_commit + self.commit_interval;
            while !self.registry.take_hurry() {
                let now = Instant::now();
                if now >= gathered_until {
                    break;
                }
                std::thread::park_timeout(gathered_until - now);
            }
            while effects.len() < MAX_EFFECTS {
                match inbox.try_recv() {
                    Ok(next) => {
                        seq = next.seq;
                        effects.extend(next.effects);
                        raft = next.raft.or(raft);
                    }
                    Err(_) => break,
                }
            }
            last_commit = Instant::now();
            coalesce(&mut effects);
            let committed = self
                .store
                .commit(&effects, seq, false, raft.take().as_deref());
            wrote_to.extend(effects.iter().filter_map(|effect| match effect {
                Effect::PutRecord { stream_id, .. } => Some(*stream_id),
                _ => None,
            }));
            wrote_to.sort_unstable();
            wrote_to.dedup();
            effects.clear();
            if let Err(error) = committed {
                // Memory is ahead of redb; only a restart (WAL replay) can reconcile them.
                tracing::error!(%error, "cannot write applied state to redb; exiting to recover");
                std::process::exit(70);
            }
            stored = seq;
            self.registry.set_stored(seq, &wrote_to);
            wrote_to.clear();
            if last_checkpoint.elapsed() >= self.checkpoint_interval {
                self.checkpoint(stored, &mut last_checkpoint);
            }
        }
        self.checkpoint(stored, &mut last_checkpoint);
    }

    fn checkpoint(&self, stored: u64, last_checkpoint: &mut Instant) {
        *last_checkpoint = Instant::now();
        if stored <= self.checkpointed.load(Ordering::Acquire) {
            return;
        }
        match self.store.commit(&[], stored, true, None) {
            Ok(()) => self.checkpointed.store(stored, Ordering::Release),
            Err(error) => tracing::error!(%error, "checkpoint failed; the WAL is kept"),
        }
    }
}

/// Keeps only the last metadata write of each stream: a batch of appends rewrites the same
/// rows many times, and redb needs only the final value. Stream IDs are never reused, so no
/// write for a stream follows its deletion.
fn coalesce(effects: &mut Vec<Effect>) {
    let mut latest: std::collections::HashMap<u64, usize> = Default::default();
    for (i, effect) in effects.iter().enumerate() {
        match effect {
            Effect::PutStream(meta) => {
                latest.insert(meta.id, i);
            }
            Effect::DeleteStream { id, .. } => {
                latest.remove(id);
            }
            _ => {}
        }
    }
    let mut i = 0;
    effects.retain(|effect| {
        let keep = match effect {
            Effect::PutStream(meta) => latest.get(&meta.id) == Some(&i),
            _ => true,
        };
        i += 1;
        keep
    });
}

/// The applier is never on a request's path: it runs only on CPU time no request thread wants
/// (`SCHED_IDLE`). Under sustained overload its backlog fills and the writer waits for it, so
/// it cannot starve for long.
fn lower_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain system calls on the calling thread (ID 0) with a valid parameter struct.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc != 0 {
        tracing::debug!("cannot lower the applier's priority");
    }
}
