//! The Raft logs and votes of every group in one redb file.
//!
//! One writer thread owns all writes. It takes every write waiting for it, from any group,
//! into one transaction and commits it with one fsync, then tells each group its entries are
//! durable (group commit across groups). Each group also keeps the suffix of its log in memory,
//! because replication reads entries right after they are appended; older entries are read
//! back from redb.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{OptionalSend, RaftLogId};
use parking_lot::Mutex;
use redb::{Database, ReadableDatabase, TableDefinition};
use tokio::sync::oneshot;

use crate::engine::Metrics;

use super::types::{Entry, LogId, StorageError, TypeConfig, Vote, fail};

const LOG: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("raft_log");
const VOTES: TableDefinition<u32, &[u8]> = TableDefinition::new("raft_vote");
const PURGED: TableDefinition<u32, &[u8]> = TableDefinition::new("raft_purged");

/// Writes taken into one transaction at most.
const MAX_BATCH: usize = 4096;
/// A group keeps at most this many durable entries in memory, and this many bytes.
const MEMORY_ENTRIES: usize = 4096;
const MEMORY_BYTES: u64 = 32 * 1024 * 1024;

type Done = oneshot::Sender<Result<(), String>>;

enum Write {
    Append {
        tail: Arc<Mutex<Tail>>,
        group: u32,
        entries: Vec<(u64, Vec<u8>)>,
        flushed: LogFlushed<TypeConfig>,
    },
    Vote {
        group: u32,
        vote: Vec<u8>,
        done: Done,
    },
    Truncate {
        group: u32,
        from: u64,
        done: Done,
    },
    Purge {
        group: u32,
        upto: u64,
        record: Vec<u8>,
        done: Done,
    },
}

/// The shared log file and its writer thread.
pub struct LogDb {
    db: Arc<Database>,
    writes: mpsc::Sender<Write>,
    pub metrics: Arc<Metrics>,
    /// Log bytes of all groups not yet purged behind a snapshot, for write admission.
    pub unpurged_bytes: Arc<AtomicU64>,
}

impl LogDb {
    pub fn open(dir: &Path, metrics: Arc<Metrics>) -> Result<Arc<Self>, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {dir:?}: {e}"))?;
        let db = Database::builder()
            .set_cache_size(64 * 1024 * 1024)
            .create(dir.join("raft.redb"))
            .map_err(|e| format!("cannot open the Raft log: {e}"))?;
        let txn = db.begin_write().map_err(|e| e.to_string())?;
        txn.open_table(LOG).map_err(|e| e.to_string())?;
        txn.open_table(VOTES).map_err(|e| e.to_string())?;
        txn.open_table(PURGED).map_err(|e| e.to_string())?;
        txn.commit().map_err(|e| e.to_string())?;
        let db = Arc::new(db);
        let (writes, inbox) = mpsc::channel();
        let writer = Writer {
            db: db.clone(),
            metrics: metrics.clone(),
        };
        std::thread::Builder::new()
            .name("ursula-raft-log".into())
            .spawn(move || writer.run(inbox))
            .map_err(|e| format!("cannot start the Raft log writer: {e}"))?;
        Ok(Arc::new(Self {
            db,
            writes,
            metrics,
            unpurged_bytes: Arc::new(AtomicU64::new(0)),
        }))
    }

    /// The log of one group, as it is on disk.
    pub fn group(self: &Arc<Self>, group: u32) -> Result<LogStore, String> {
        let txn = self.db.begin_read().map_err(|e| e.to_string())?;
        let log = txn.open_table(LOG).map_err(|e| e.to_string())?;
        let purged = txn.open_table(PURGED).map_err(|e| e.to_string())?;
        let last_purged: Option<LogId> = match purged.get(group).map_err(|e| e.to_string())? {
            Some(bytes) => Some(postcard::from_bytes(bytes.value()).map_err(|e| e.to_string())?),
            None => None,
        };
        let mut sizes = VecDeque::new();
        for row in log
            .range((group, 0)..=(group, u64::MAX))
            .map_err(|e| e.to_string())?
        {
            let (key, value) = row.map_err(|e| e.to_string())?;
            sizes.push_back((key.value().1, value.value().len() as u64));
        }
        let last_log_id = match log
            .range((group, 0)..=(group, u64::MAX))
            .map_err(|e| e.to_string())?
            .next_back()
        {
            Some(row) => {
                let (key, value) = row.map_err(|e| e.to_string())?;
                let entry: Entry = postcard::from_bytes(value.value()).map_err(|e| {
                    format!("Raft log entry {} of group {group}: {e}", key.value().1)
                })?;
                Some(*entry.get_log_id())
            }
            None => last_purged,
        };
        let bytes: u64 = sizes.iter().map(|(_, size)| size).sum();
        self.unpurged_bytes.fetch_add(bytes, Ordering::Relaxed);
        let next = last_log_id.map_or(0, |id| id.index + 1);
        Ok(LogStore {
            group,
            log: self.clone(),
            tail: Arc::new(Mutex::new(Tail {
                memory: VecDeque::new(),
                memory_first: next,
                memory_bytes: 0,
                flushed: next.saturating_sub(1),
                last_log_id,
                last_purged,
                sizes,
            })),
        })
    }

    async fn write(&self, make: impl FnOnce(Done) -> Write) -> Result<(), String> {
        let (done, answer) = oneshot::channel();
        self.writes
            .send(make(done))
            .map_err(|_| "the Raft log writer stopped".to_owned())?;
        answer
            .await
            .map_err(|_| "the Raft log writer stopped".to_owned())?
    }

    fn read_range(&self, group: u32, from: u64, until: u64) -> Result<Vec<Entry>, String> {
        let txn = self.db.begin_read().map_err(|e| e.to_string())?;
        let log = txn.open_table(LOG).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        if from >= until {
            return Ok(out);
        }
        for row in log
            .range((group, from)..(group, until))
            .map_err(|e| e.to_string())?
        {
            let (_, value) = row.map_err(|e| e.to_string())?;
            out.push(postcard::from_bytes(value.value()).map_err(|e| e.to_string())?);
        }
        Ok(out)
    }
}

/// A group's view of its log: the in-memory suffix and what is on disk.
pub struct Tail {
    /// Entries `memory_first..` in order; those above `flushed` are not durable yet.
    memory: VecDeque<Entry>,
    memory_first: u64,
    memory_bytes: u64,
    flushed: u64,
    last_log_id: Option<LogId>,
    last_purged: Option<LogId>,
    /// Encoded size of every unpurged entry, by index, for log-pressure accounting.
    sizes: VecDeque<(u64, u64)>,
}

impl Tail {
    /// Drops durable entries from memory beyond the memory bounds.
    fn trim(&mut self) {
        while (self.memory.len() > MEMORY_ENTRIES || self.memory_bytes > MEMORY_BYTES)
            && self.memory_first <= self.flushed
        {
            if self.memory.pop_front().is_none() {
                break;
            }
            if let Some(size) = self.size_of(self.memory_first) {
                self.memory_bytes = self.memory_bytes.saturating_sub(size);
            }
            self.memory_first += 1;
        }
    }

    fn size_of(&self, index: u64) -> Option<u64> {
        let first = self.sizes.front()?.0;
        let at = usize::try_from(index.checked_sub(first)?).ok()?;
        self.sizes.get(at).map(|(_, size)| *size)
    }
}

/// One group's log, implementing openraft's log storage.
#[derive(Clone)]
pub struct LogStore {
    group: u32,
    log: Arc<LogDb>,
    tail: Arc<Mutex<Tail>>,
}

impl LogStore {
    /// Log bytes of this group not yet purged behind a snapshot.
    pub fn unpurged_bytes(&self) -> u64 {
        self.tail.lock().sizes.iter().map(|(_, size)| size).sum()
    }
}

fn release(counter: &AtomicU64, bytes: u64) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
        Some(now.saturating_sub(bytes))
    });
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
        let (memory_first, from_memory) = {
            let tail = self.tail.lock();
            let start = from.max(tail.memory_first);
            let skip = usize::try_from(start - tail.memory_first).unwrap_or(usize::MAX);
            let take = usize::try_from(until.saturating_sub(start)).unwrap_or(usize::MAX);
            let entries: Vec<Entry> = tail.memory.iter().skip(skip).take(take).cloned().collect();
            (tail.memory_first, entries)
        };
        // Entries leave memory only once durable, so whatever is below memory is on disk.
        let mut out = self
            .log
            .read_range(self.group, from, until.min(memory_first))
            .map_err(fail::read_logs)?;
        out.extend(from_memory);
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let tail = self.tail.lock();
        Ok(LogState {
            last_purged_log_id: tail.last_purged,
            last_log_id: tail.last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let bytes = postcard::to_allocvec(vote).map_err(fail::write_vote)?;
        let group = self.group;
        self.log
            .write(|done| Write::Vote {
                group,
                vote: bytes,
                done,
            })
            .await
            .map_err(fail::write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        let txn = self.log.db.begin_read().map_err(fail::read_vote)?;
        let votes = txn.open_table(VOTES).map_err(fail::read_vote)?;
        match votes.get(self.group).map_err(fail::read_vote)? {
            Some(bytes) => postcard::from_bytes::<Vote>(bytes.value())
                .map(Some)
                .map_err(fail::read_vote),
            None => Ok(None),
        }
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
        let mut encoded = Vec::new();
        {
            let mut tail = self.tail.lock();
            for entry in entries {
                let bytes = postcard::to_allocvec(&entry).map_err(fail::write_logs)?;
                let index = entry.get_log_id().index;
                let size = bytes.len() as u64;
                tail.sizes.push_back((index, size));
                tail.memory_bytes += size;
                tail.last_log_id = Some(*entry.get_log_id());
                if tail.memory.is_empty() {
                    tail.memory_first = index;
                }
                tail.memory.push_back(entry);
                self.log.unpurged_bytes.fetch_add(size, Ordering::Relaxed);
                encoded.push((index, bytes));
            }
        }
        self.log
            .writes
            .send(Write::Append {
                tail: self.tail.clone(),
                group: self.group,
                entries: encoded,
                flushed: callback,
            })
            .map_err(|_| fail::write_logs("the Raft log writer stopped"))
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let from = log_id.index;
        {
            let mut tail = self.tail.lock();
            let keep = usize::try_from(from.saturating_sub(tail.memory_first)).unwrap_or(0);
            tail.memory.truncate(keep);
            let mut removed = 0;
            while tail.sizes.back().is_some_and(|(index, _)| *index >= from) {
                if let Some((_, size)) = tail.sizes.pop_back() {
                    removed += size;
                }
            }
            release(&self.log.unpurged_bytes, removed);
            tail.memory_bytes = tail.memory_bytes.saturating_sub(removed);
            if tail.memory.is_empty() {
                tail.memory_first = from;
            }
            tail.flushed = tail.flushed.min(from.saturating_sub(1));
        }
        let group = self.group;
        self.log
            .write(|done| Write::Truncate { group, from, done })
            .await
            .map_err(fail::write_logs)?;
        // The last entry left is the one before `from`: in memory, on disk, or purged.
        let previous = self
            .try_get_log_entries(from.saturating_sub(1)..from)
            .await?;
        let mut tail = self.tail.lock();
        tail.last_log_id = match previous.last() {
            Some(entry) if from > 0 => Some(*entry.get_log_id()),
            _ => tail.last_purged,
        };
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let upto = log_id.index;
        {
            let mut tail = self.tail.lock();
            while tail.memory_first <= upto && tail.memory.pop_front().is_some() {
                tail.memory_first += 1;
            }
            if tail.memory.is_empty() {
                tail.memory_first = tail.memory_first.max(upto + 1);
            }
            let mut removed = 0;
            while tail.sizes.front().is_some_and(|(index, _)| *index <= upto) {
                if let Some((_, size)) = tail.sizes.pop_front() {
                    removed += size;
                }
            }
            tail.memory_bytes = tail
                .memory
                .iter()
                .map(|e| e.get_log_id().index)
                .filter_map(|index| tail.size_of(index))
                .sum();
            release(&self.log.unpurged_bytes, removed);
            tail.last_purged = Some(log_id);
            if tail.last_log_id.is_none_or(|last| last.index < upto) {
                tail.last_log_id = Some(log_id);
            }
        }
        let record = postcard::to_allocvec(&log_id).map_err(fail::write_logs)?;
        let group = self.group;
        self.log
            .write(|done| Write::Purge {
                group,
                upto,
                record,
                done,
            })
            .await
            .map_err(fail::write_logs)
    }
}

struct Writer {
    db: Arc<Database>,
    metrics: Arc<Metrics>,
}

impl Writer {
    fn run(self, inbox: mpsc::Receiver<Write>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Ok(first) = inbox.recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match inbox.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            let started = Instant::now();
            let written = self.commit(&batch);
            self.metrics.observe_fsync(started.elapsed());
            self.metrics.batches.fetch_add(1, Ordering::Relaxed);
            if let Err(error) = &written {
                self.metrics.commit_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%error, "the Raft log write failed");
            }
            for write in batch.drain(..) {
                let result = written.clone();
                match write {
                    Write::Append {
                        tail,
                        entries,
                        flushed,
                        ..
                    } => {
                        if result.is_ok() {
                            self.metrics
                                .log_entries
                                .fetch_add(entries.len() as u64, Ordering::Relaxed);
                            let mut tail = tail.lock();
                            if let Some((last, _)) = entries.last() {
                                tail.flushed = tail.flushed.max(*last);
                            }
                            tail.trim();
                        }
                        flushed.log_io_completed(result.map_err(std::io::Error::other));
                    }
                    Write::Vote { done, .. }
                    | Write::Truncate { done, .. }
                    | Write::Purge { done, .. } => {
                        let _ = done.send(result);
                    }
                }
            }
        }
    }

    /// One transaction, one fsync, for every write in the batch, in order.
    fn commit(&self, batch: &[Write]) -> Result<(), String> {
        let txn = self.db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut log = txn.open_table(LOG).map_err(|e| e.to_string())?;
            let mut votes = txn.open_table(VOTES).map_err(|e| e.to_string())?;
            let mut purged = txn.open_table(PURGED).map_err(|e| e.to_string())?;
            for write in batch {
                match write {
                    Write::Append { group, entries, .. } => {
                        for (index, bytes) in entries {
                            log.insert((*group, *index), bytes.as_slice())
                                .map_err(|e| e.to_string())?;
                        }
                    }
                    Write::Vote { group, vote, .. } => {
                        votes
                            .insert(*group, vote.as_slice())
                            .map_err(|e| e.to_string())?;
                    }
                    Write::Truncate { group, from, .. } => {
                        log.retain_in((*group, *from)..=(*group, u64::MAX), |_, _| false)
                            .map_err(|e| e.to_string())?;
                    }
                    Write::Purge {
                        group,
                        upto,
                        record,
                        ..
                    } => {
                        log.retain_in((*group, 0)..=(*group, *upto), |_, _| false)
                            .map_err(|e| e.to_string())?;
                        purged
                            .insert(*group, record.as_slice())
                            .map_err(|e| e.to_string())?;
                    }
                }
            }
        }
        txn.commit().map_err(|e| e.to_string())
    }
}
