//! The Raft logs and votes of every group, in one write-ahead log.
//!
//! One writer thread (`log_writer`) owns the WAL. It takes every change waiting for it, from
//! any group (new entries, truncations, purges, votes), writes them as one record and makes it
//! durable with one `fdatasync`, then tells each group its change is durable: group commit
//! across groups. A record is a few kilobytes of entries, where a B-tree commit rewrites several pages; on the
//! reference machine redb as the log wrote about 40 KB to disk per append (see README).
//!
//! Every entry not yet purged behind a snapshot is also kept in memory, which is where reads
//! come from (as etcd's raft keeps its unstable and stable entries in memory until a
//! snapshot). Snapshots bound that memory: a group snapshots and purges after
//! `raft.snapshot_entries` entries or its share of `raft.snapshot_log_budget` bytes.
//!
//! On start-up the WAL is replayed to rebuild each group's entries, vote and purge point.
//! Segments are deleted once every group has purged the entries in them; the votes and purge
//! points are rewritten in a summary record now and then, so that old segments are never kept
//! only for them.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{OptionalSend, RaftLogId};
use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};

use super::log_writer::{Change, LogOp, SUMMARY_EVERY, Then, Writer};
use super::types::{Entry, LogId, StorageError, TypeConfig, Vote, fail};
use crate::engine::Metrics;
use crate::storage::wal::Wal;

/// A group's log as the openraft side sees it.
struct GroupLog {
    /// Every unpurged entry, `first..`, in order.
    entries: VecDeque<Entry>,
    first: u64,
    /// Encoded size of each entry in `entries`.
    sizes: VecDeque<u64>,
    bytes: u64,
    last_log_id: Option<LogId>,
    last_purged: Option<LogId>,
    vote: Option<Vote>,
}

impl GroupLog {
    fn empty() -> Self {
        Self {
            entries: VecDeque::new(),
            first: 0,
            sizes: VecDeque::new(),
            bytes: 0,
            last_log_id: None,
            last_purged: None,
            vote: None,
        }
    }

    fn push(&mut self, entry: Entry, size: u64) {
        let index = entry.get_log_id().index;
        // A new entry at an index held replaces it and everything after (Raft's truncation,
        // also when replaying a log written before a crash).
        if !self.entries.is_empty() && index < self.first + self.entries.len() as u64 {
            self.truncate(index);
        }
        if self.entries.is_empty() {
            self.first = index;
        }
        self.last_log_id = Some(*entry.get_log_id());
        self.entries.push_back(entry);
        self.sizes.push_back(size);
        self.bytes += size;
    }

    fn truncate(&mut self, from: u64) {
        let keep = usize::try_from(from.saturating_sub(self.first)).unwrap_or(usize::MAX);
        while self.entries.len() > keep {
            self.entries.pop_back();
            if let Some(size) = self.sizes.pop_back() {
                self.bytes -= size;
            }
        }
        self.last_log_id = self
            .entries
            .back()
            .map(|entry| *entry.get_log_id())
            .or(self.last_purged);
    }

    fn purge(&mut self, upto: LogId) {
        if self
            .last_purged
            .is_some_and(|purged| purged.index >= upto.index)
        {
            return;
        }
        while self.first <= upto.index && !self.entries.is_empty() {
            self.entries.pop_front();
            if let Some(size) = self.sizes.pop_front() {
                self.bytes -= size;
            }
            self.first += 1;
        }
        if self.entries.is_empty() {
            self.first = upto.index + 1;
        }
        self.last_purged = Some(upto);
        if self.last_log_id.is_none_or(|last| last.index < upto.index) {
            self.last_log_id = Some(upto);
        }
    }
}

/// Changes submitted during the current turn of the runtime, not yet sent to the writer.
#[derive(Default)]
struct Outbox {
    changes: Vec<Change>,
    /// Whether a task will send them.
    flush_scheduled: bool,
}

/// The shared log and its writer thread.
pub struct LogDb {
    groups: Vec<Arc<Mutex<GroupLog>>>,
    outbox: Mutex<Outbox>,
    changes: mpsc::Sender<Vec<Change>>,
    /// The writer's records begun and finished: odd while it writes one.
    writer_turns: watch::Receiver<u64>,
    /// Log bytes of all groups not yet purged behind a snapshot, for write admission.
    pub unpurged_bytes: Arc<AtomicU64>,
}

impl LogDb {
    /// Opens (replays) the log of `group_count` groups in `dir` and starts its writer.
    pub fn open(
        dir: &Path,
        segment_size: u64,
        group_count: usize,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, String> {
        let (wal, records) = Wal::open(dir, segment_size)
            .map_err(|e| format!("cannot open the Raft log in {dir:?}: {e}"))?;
        let mut groups: Vec<GroupLog> = (0..group_count).map(|_| GroupLog::empty()).collect();
        let mut pins: Vec<VecDeque<(u64, u64)>> = vec![VecDeque::new(); group_count];
        let mut summary_seq = 0;
        for record in &records {
            let ops: Vec<LogOp> = postcard::from_bytes(&record.payload)
                .map_err(|e| format!("Raft log record {}: {e}", record.seq))?;
            for op in ops {
                let slot = |group: u32| -> Result<usize, String> {
                    let group = group as usize;
                    if group < group_count {
                        Ok(group)
                    } else {
                        Err(format!(
                            "the Raft log has group {group}, but raft.group_count is {group_count}; the group count cannot change"
                        ))
                    }
                };
                match op {
                    LogOp::Append { group, entries } => {
                        let g = slot(group)?;
                        let decoded: Vec<Entry> = postcard::from_bytes(&entries)
                            .map_err(|e| format!("Raft log record {}: {e}", record.seq))?;
                        let size = entries.len() as u64 / decoded.len().max(1) as u64;
                        if let Some(last) = decoded.last() {
                            pins[g].push_back((last.get_log_id().index, record.seq));
                        }
                        for entry in decoded {
                            groups[g].push(entry, size);
                        }
                    }
                    LogOp::Truncate { group, from } => groups[slot(group)?].truncate(from),
                    LogOp::Purge { group, upto } => {
                        let g = slot(group)?;
                        groups[g].purge(upto);
                        while pins[g].front().is_some_and(|(last, _)| *last <= upto.index) {
                            pins[g].pop_front();
                        }
                    }
                    LogOp::Vote { group, vote } => groups[slot(group)?].vote = Some(vote),
                    LogOp::Summary { groups: summary } => {
                        summary_seq = record.seq;
                        for (g, (vote, purged)) in summary.into_iter().enumerate() {
                            if g >= group_count {
                                break;
                            }
                            groups[g].vote = vote.or(groups[g].vote);
                            if let Some(upto) = purged {
                                groups[g].purge(upto);
                            }
                        }
                    }
                }
            }
        }
        let unpurged: u64 = groups.iter().map(|g| g.bytes).sum();
        let writer = Writer {
            summary: groups.iter().map(|g| (g.vote, g.last_purged)).collect(),
            wal,
            pins,
            summary_seq,
            records_since_summary: SUMMARY_EVERY,
            metrics,
        };
        let (changes, inbox) = mpsc::channel();
        let (turns, writer_turns) = watch::channel(0);
        std::thread::Builder::new()
            .name("ursula-raft-log".into())
            .spawn(move || writer.run(inbox, turns))
            .map_err(|e| format!("cannot start the Raft log writer: {e}"))?;
        Ok(Arc::new(Self {
            groups: groups
                .into_iter()
                .map(|g| Arc::new(Mutex::new(g)))
                .collect(),
            outbox: Mutex::default(),
            changes,
            writer_turns,
            unpurged_bytes: Arc::new(AtomicU64::new(unpurged)),
        }))
    }

    /// The writer's turns: odd while it writes a record, even while it waits for changes.
    /// A leader's proposer waits for a turn to end before it proposes, so that the entries of
    /// all groups proposed meanwhile go in one record (one fsync) and travel to each follower
    /// in one exchange: rounds, where each group's entries went alone, each with its own
    /// fsync and exchange, on every voter.
    pub fn writer_turns(&self) -> watch::Receiver<u64> {
        self.writer_turns.clone()
    }

    /// Whether no change waits to be sent to the writer.
    pub(super) fn outbox_empty(&self) -> bool {
        let outbox = self.outbox.lock();
        outbox.changes.is_empty() && !outbox.flush_scheduled
    }

    /// The log of one group.
    pub fn group(self: &Arc<Self>, group: u32) -> LogStore {
        LogStore {
            group,
            log: self.clone(),
            state: self.groups[group as usize].clone(),
        }
    }

    /// Queues a change for the writer. Changes submitted while the runtime works through the
    /// tasks it has already woken (a peer's frame carries appends of many groups; a commit
    /// wakes many proposers) go to the writer together, once those tasks have run: the
    /// writer wakes once and writes them as one record, where sending each at once woke it
    /// for the first and left the rest to a record of their own. The WAL keeps the order in
    /// which changes were submitted.
    fn submit(
        self: &Arc<Self>,
        op: LogOp,
        last_index: u64,
        count: u64,
        then: Then,
    ) -> Result<(), String> {
        let change = Change {
            op,
            last_index,
            count,
            then,
        };
        let first_of_turn = {
            let mut outbox = self.outbox.lock();
            outbox.changes.push(change);
            !std::mem::replace(&mut outbox.flush_scheduled, true)
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.flush_outbox();
        };
        if first_of_turn {
            let log = self.clone();
            runtime.spawn(async move {
                tokio::task::yield_now().await;
                if let Err(error) = log.flush_outbox() {
                    tracing::error!(%error, "Raft log changes were not written");
                }
            });
        }
        Ok(())
    }

    /// Sends every queued change to the writer. A change the writer cannot take any more is
    /// answered with the failure, so that nothing waits for it forever.
    fn flush_outbox(&self) -> Result<(), String> {
        // Under the lock, so that two flushes cannot reorder their changes.
        let mut outbox = self.outbox.lock();
        outbox.flush_scheduled = false;
        if outbox.changes.is_empty() {
            return Ok(());
        }
        let changes = std::mem::take(&mut outbox.changes);
        let Err(mpsc::SendError(changes)) = self.changes.send(changes) else {
            return Ok(());
        };
        const STOPPED: &str = "the Raft log writer stopped";
        for change in changes {
            match change.then {
                Then::Flushed(flushed) => {
                    flushed.log_io_completed(Err(std::io::Error::other(STOPPED)));
                }
                Then::Reply(done) => {
                    let _ = done.send(Err(STOPPED.to_owned()));
                }
                Then::Nothing => {}
            }
        }
        Err(STOPPED.to_owned())
    }

    async fn durable(self: &Arc<Self>, op: LogOp) -> Result<(), String> {
        let (done, answer) = oneshot::channel();
        self.submit(op, 0, 0, Then::Reply(done))?;
        answer
            .await
            .map_err(|_| "the Raft log writer stopped".to_owned())?
    }
}

fn release(counter: &AtomicU64, bytes: u64) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
        Some(now.saturating_sub(bytes))
    });
}

/// One group's log, implementing openraft's log storage.
#[derive(Clone)]
pub struct LogStore {
    group: u32,
    log: Arc<LogDb>,
    state: Arc<Mutex<GroupLog>>,
}

impl LogStore {
    /// When the stored vote is this node's own committed one, openraft restarts the group
    /// with this node as its leader at once, in the old term and without a new first entry:
    /// then answers that term and the last log index. Its read index then covers only what
    /// it committed since the restart, so everything in its log, which holds every write it
    /// acknowledged before, must be applied first (`RaftGroup::status`).
    pub fn restored_leadership(&self, node: super::types::NodeId) -> Option<(u64, u64)> {
        let state = self.state.lock();
        let vote = state.vote?;
        (vote.is_committed() && vote.leader_id().voted_for() == Some(node)).then(|| {
            (
                vote.leader_id().term,
                state.last_log_id.map_or(0, |id| id.index),
            )
        })
    }

    /// Log bytes of this group not yet purged behind a snapshot.
    pub fn unpurged_bytes(&self) -> u64 {
        self.state.lock().bytes
    }
}

fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let from = match range.start_bound() {
        Bound::Included(at) => *at,
        Bound::Excluded(at) => at.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let until = match range.end_bound() {
        Bound::Included(at) => at.saturating_add(1),
        Bound::Excluded(at) => *at,
        Bound::Unbounded => u64::MAX,
    };
    (from, until)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let (from, until) = bounds(&range);
        let state = self.state.lock();
        // Positions in memory of the indexes asked for, clamped to what is held.
        let held = state.entries.len();
        let position = |index: u64| {
            usize::try_from(index.saturating_sub(state.first))
                .unwrap_or(usize::MAX)
                .min(held)
        };
        let (start, end) = (position(from), position(until));
        Ok(state
            .entries
            .range(start..end.max(start))
            .cloned()
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let state = self.state.lock();
        Ok(LogState {
            last_purged_log_id: state.last_purged,
            last_log_id: state.last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.state.lock().vote = Some(*vote);
        self.log
            .durable(LogOp::Vote {
                group: self.group,
                vote: *vote,
            })
            .await
            .map_err(fail::write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.state.lock().vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let Some(last) = entries.last().map(|e| e.get_log_id().index) else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        let encoded = crate::storage::encode_sized(&entries).map_err(fail::write_logs)?;
        let count = entries.len() as u64;
        let size = encoded.len() as u64 / count;
        {
            let mut state = self.state.lock();
            let before = state.bytes;
            for entry in entries {
                state.push(entry, size);
            }
            let after = state.bytes;
            if after >= before {
                self.log
                    .unpurged_bytes
                    .fetch_add(after - before, Ordering::Relaxed);
            } else {
                release(&self.log.unpurged_bytes, before - after);
            }
        }
        let op = LogOp::Append {
            group: self.group,
            entries: encoded.into(),
        };
        self.log
            .submit(op, last, count, Then::Flushed(callback))
            .map_err(fail::write_logs)
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        {
            let mut state = self.state.lock();
            let before = state.bytes;
            state.truncate(log_id.index);
            release(&self.log.unpurged_bytes, before - state.bytes);
        }
        // Durable before the conflicting entries are replaced: the WAL keeps order, so any
        // entry appended after this is written after it.
        self.log
            .durable(LogOp::Truncate {
                group: self.group,
                from: log_id.index,
            })
            .await
            .map_err(fail::write_logs)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        {
            let mut state = self.state.lock();
            let before = state.bytes;
            state.purge(log_id);
            release(&self.log.unpurged_bytes, before - state.bytes);
        }
        // Purged entries are covered by a durable snapshot; losing this record in a crash only
        // means replaying entries that the snapshot already holds.
        self.log
            .submit(
                LogOp::Purge {
                    group: self.group,
                    upto: log_id,
                },
                0,
                0,
                Then::Nothing,
            )
            .map_err(fail::write_logs)
    }
}

#[cfg(test)]
mod tests;
