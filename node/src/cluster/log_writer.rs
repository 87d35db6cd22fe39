//! The Raft log's writer thread: it takes every change waiting for it, from any group (new
//! entries, truncations, purges, votes), writes them as one WAL record, makes it durable with
//! one `fdatasync`, then tells each group its change is durable (group commit across groups).
//! It also deletes the segments no group needs any more. `log_store` is the openraft side.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

use openraft::storage::LogFlushed;
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};

use super::types::{LogId, TypeConfig, Vote};
use crate::engine::Metrics;
use crate::storage::wal::Wal;

/// Changes taken into one record at most (a record may exceed it by one turn's changes).
const MAX_BATCH: usize = 4096;
/// A summary of every group's vote and purge point is written after this many records.
pub(super) const SUMMARY_EVERY: u64 = 1024;

/// One durable change to a group's log state.
#[derive(Serialize, Deserialize)]
pub(super) enum LogOp {
    /// Entries, postcard-encoded as `Vec<Entry>` by the proposer's task. `Bytes`, which serde
    /// writes as one byte string, not byte by byte as a `Vec<u8>` (encoded alike: records
    /// written before read the same).
    Append {
        group: u32,
        entries: bytes::Bytes,
    },
    Truncate {
        group: u32,
        from: u64,
    },
    Purge {
        group: u32,
        upto: LogId,
    },
    Vote {
        group: u32,
        vote: Vote,
    },
    /// Every group's vote and purge point, in group order.
    Summary {
        groups: Vec<(Option<Vote>, Option<LogId>)>,
    },
}

pub(super) type Done = oneshot::Sender<Result<(), String>>;

/// What a writer must do after a change is durable.
pub(super) enum Then {
    Flushed(LogFlushed<TypeConfig>),
    Reply(Done),
    Nothing,
}

pub(super) struct Change {
    pub(super) op: LogOp,
    /// The last entry index of an `Append`, and how many entries it has.
    pub(super) last_index: u64,
    pub(super) count: u64,
    pub(super) then: Then,
}

/// The thread that owns the WAL.
pub(super) struct Writer {
    pub(super) wal: Wal,
    /// Per group: (last entry index, WAL seq) of every record with its unpurged entries.
    pub(super) pins: Vec<VecDeque<(u64, u64)>>,
    /// Per group: the latest vote and purge point written.
    pub(super) summary: Vec<(Option<Vote>, Option<LogId>)>,
    pub(super) summary_seq: u64,
    pub(super) records_since_summary: u64,
    pub(super) metrics: Arc<Metrics>,
}

impl Writer {
    pub(super) fn run(mut self, inbox: mpsc::Receiver<Vec<Change>>, turns: watch::Sender<u64>) {
        let mut batch: Vec<Change> = Vec::with_capacity(MAX_BATCH);
        while let Ok(first) = inbox.recv() {
            turns.send_modify(|turn| *turn += 1);
            batch.extend(first);
            while batch.len() < MAX_BATCH {
                match inbox.try_recv() {
                    Ok(next) => batch.extend(next),
                    Err(_) => break,
                }
            }
            let written = self.write(&batch);
            if let Err(error) = &written {
                // Memory is ahead of the disk now; only a restart can reconcile them.
                tracing::error!(%error, "the Raft log write failed; exiting to recover");
                std::process::exit(70);
            }
            for change in batch.drain(..) {
                match change.then {
                    Then::Flushed(flushed) => flushed.log_io_completed(Ok(())),
                    Then::Reply(done) => {
                        let _ = done.send(Ok(()));
                    }
                    Then::Nothing => {}
                }
            }
            turns.send_modify(|turn| *turn += 1);
            self.forget_purged();
        }
    }

    /// Writes the batch as one record with one fsync.
    fn write(&mut self, batch: &[Change]) -> Result<(), String> {
        let ops: Vec<&LogOp> = batch.iter().map(|change| &change.op).collect();
        self.wal.stage(&ops).map_err(|e| e.to_string())?;
        let seq = self.wal.last_seq() + 1;
        let started = Instant::now();
        self.wal.append_staged(seq).map_err(|e| e.to_string())?;
        self.metrics.observe_fsync(started.elapsed());
        self.metrics.batches.fetch_add(1, Ordering::Relaxed);
        let mut entries = 0u64;
        for change in batch {
            match &change.op {
                LogOp::Append { group, .. } => {
                    entries += change.count;
                    self.pins[*group as usize].push_back((change.last_index, seq));
                }
                // Records with truncated entries stay pinned until a purge passes their last
                // index: conservative, and the entries replacing them are purged in time too.
                LogOp::Truncate { .. } => {}
                LogOp::Purge { group, upto } => {
                    let g = *group as usize;
                    self.summary[g].1 = Some(*upto);
                    while self.pins[g]
                        .front()
                        .is_some_and(|(last, _)| *last <= upto.index)
                    {
                        self.pins[g].pop_front();
                    }
                }
                LogOp::Vote { group, vote } => self.summary[*group as usize].0 = Some(*vote),
                LogOp::Summary { .. } => {}
            }
        }
        self.metrics
            .log_entries
            .fetch_add(entries, Ordering::Relaxed);
        self.records_since_summary += 1;
        Ok(())
    }

    /// Deletes the segments no group needs any more, writing a fresh summary first when an
    /// old one is what holds them.
    fn forget_purged(&mut self) {
        if self.records_since_summary >= SUMMARY_EVERY {
            let summary = LogOp::Summary {
                groups: self.summary.clone(),
            };
            // A record is a sequence of ops (a slice; an array would encode as a tuple).
            let ops: &[&LogOp] = &[&summary];
            let seq = self.wal.last_seq() + 1;
            let written = self
                .wal
                .stage(ops)
                .map_err(|e| e.to_string())
                .and_then(|()| self.wal.append_staged(seq).map_err(|e| e.to_string()));
            match written {
                Ok(()) => {
                    self.summary_seq = seq;
                    self.records_since_summary = 0;
                }
                Err(error) => {
                    tracing::error!(%error, "the Raft log write failed; exiting to recover");
                    std::process::exit(70);
                }
            }
        }
        let oldest_needed = self
            .pins
            .iter()
            .filter_map(|pins| pins.front().map(|(_, seq)| *seq))
            .min()
            .unwrap_or(u64::MAX)
            .min(self.summary_seq);
        self.wal.purge_through(oldest_needed.saturating_sub(1));
    }
}
