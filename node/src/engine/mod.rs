//! The engine: one state machine, one writer thread with group commit, and the published
//! state that readers use.

mod applier;
mod metrics;
mod read;
mod registry;
mod touch;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};

pub use metrics::Metrics;
pub use read::{ReadError, Slice};
pub use registry::StreamHandle;

use crate::machine::{BucketState, Command, Limits, Outcome, Refusal, StreamMeta, StreamPath};
use crate::storage::wal::{Replay, Wal};
use crate::storage::{StorageError, Store};
use applier::Applier;
use registry::Registry;
use touch::TouchTracker;
use writer::{Proposal, Writer};

/// Proposals waiting for the writer; beyond this, proposers wait (backpressure).
const INBOX_CAPACITY: usize = 16 * 1024;
/// Durable batches waiting for the applier; beyond this the writer waits.
const APPLIER_BACKLOG: usize = 4096;
/// Memory for tail caches across all streams.
const TAIL_CACHE_BYTES: usize = 256 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("storage failed: {0}")]
    Storage(String),
    #[error("the node is shutting down")]
    Stopped,
}

impl From<StorageError> for EngineError {
    fn from(e: StorageError) -> Self {
        Self::Storage(e.to_string())
    }
}

/// What a reader finds at a path.
pub enum Lookup {
    Live(Arc<StreamHandle>, Arc<StreamMeta>),
    /// Soft-deleted: kept only for its forks.
    Deleted,
    Missing,
}

pub struct Engine {
    inbox: mpsc::Sender<Proposal>,
    store: Arc<Store>,
    registry: Arc<Registry>,
    touches: Arc<TouchTracker>,
    pub metrics: Arc<Metrics>,
    /// Log bytes past the last checkpoint.
    pub log_bytes: Arc<std::sync::atomic::AtomicU64>,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Applies the WAL records the checkpointed state does not include, and makes the result
/// durable, so the WAL before it may go.
fn recover(
    store: &Store,
    mut machine: crate::machine::Machine,
    applied: u64,
    replay: Vec<Replay>,
) -> Result<crate::machine::Machine, EngineError> {
    let mut effects = Vec::new();
    let mut last = applied;
    for record in replay.into_iter().filter(|r| r.seq > applied) {
        let commands: Vec<Command> = postcard::from_bytes(&record.payload).map_err(|e| {
            EngineError::Storage(format!("WAL record {} does not decode: {e}", record.seq))
        })?;
        for command in commands {
            effects.extend(machine.apply(command).effects);
        }
        last = record.seq;
    }
    if last > applied {
        tracing::info!(
            records = last - applied,
            "replayed the WAL past the last checkpoint"
        );
        store.commit(&effects, last, true)?;
    }
    Ok(machine)
}

impl Engine {
    /// Opens storage, restores the machine (replaying the WAL past the last checkpoint) and
    /// starts the writer thread.
    pub fn open(
        data_dir: &Path,
        limits: Limits,
        wal_config: &crate::config::WalConfig,
    ) -> Result<Arc<Self>, EngineError> {
        let store = Arc::new(Store::open(data_dir)?);
        let (machine, applied) = store.load(limits)?;
        let (mut wal, replay) = Wal::open(&data_dir.join("wal"), wal_config.segment_size)
            .map_err(|e| EngineError::Storage(format!("cannot open the WAL: {e}")))?;
        let machine = recover(&store, machine, applied, replay)?;
        wal.continue_after(applied);
        let stored = wal.last_seq();
        let registry = Arc::new(Registry::new(TAIL_CACHE_BYTES, stored));
        registry.reset(machine.buckets(), machine.streams().map(|s| &s.meta));
        let touches = Arc::new(TouchTracker::default());
        let metrics = Arc::new(Metrics::default());
        let (inbox, rx) = mpsc::channel(INBOX_CAPACITY);
        let checkpointed = Arc::new(std::sync::atomic::AtomicU64::new(stored));
        let log_bytes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (to_applier, applier_inbox) = std::sync::mpsc::sync_channel(APPLIER_BACKLOG);
        let applier = Applier {
            store: store.clone(),
            registry: registry.clone(),
            checkpointed: checkpointed.clone(),
            checkpoint_interval: wal_config.checkpoint_interval,
        };
        let writer = Writer {
            machine,
            wal,
            registry: registry.clone(),
            touches: touches.clone(),
            metrics: metrics.clone(),
            applier: to_applier,
            checkpointed,
            log_bytes: log_bytes.clone(),
        };
        let spawn_error =
            |e: std::io::Error| EngineError::Storage(format!("cannot start a thread: {e}"));
        std::thread::Builder::new()
            .name("ursula-applier".into())
            .spawn(move || applier.run(applier_inbox))
            .map_err(spawn_error)?;
        std::thread::Builder::new()
            .name("ursula-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(spawn_error)?;
        Ok(Arc::new(Self {
            inbox,
            store,
            registry,
            touches,
            metrics,
            log_bytes,
        }))
    }

    /// Applies a command; answers once its effects are durable and visible to readers.
    pub async fn propose(&self, command: Command) -> Result<Outcome, EngineError> {
        let (reply, answer) = oneshot::channel();
        self.inbox
            .send(Proposal { command, reply })
            .await
            .map_err(|_| EngineError::Stopped)?;
        answer.await.map_err(|_| EngineError::Stopped)?
    }

    pub fn bucket(&self, bucket: &str) -> Option<BucketState> {
        self.registry.bucket(bucket)
    }

    /// The stream at `path` as readers must see it at `now_ms`: expired streams are missing.
    pub fn lookup(&self, path: &StreamPath, now_ms: u64) -> Lookup {
        let Some(handle) = self.registry.stream(path) else {
            return Lookup::Missing;
        };
        let meta = handle.meta();
        if meta.soft_deleted {
            return Lookup::Deleted;
        }
        if meta.is_expired(now_ms, handle.last_access_ms(&meta)) {
            return Lookup::Missing;
        }
        Lookup::Live(handle, meta)
    }

    /// A read resets the stream's sliding TTL.
    pub fn touch(&self, handle: &StreamHandle, meta: &StreamMeta, now_ms: u64) {
        if meta.ttl_secs.is_some() {
            handle.note_read(now_ms);
            self.touches.record(handle.id, now_ms);
        }
    }

    pub fn stream_by_id(&self, id: u64) -> Option<Arc<StreamHandle>> {
        self.registry.stream_by_id(id)
    }

    /// A snapshot body. Bodies are read from redb, so this first waits until redb holds the
    /// stream's latest change.
    pub async fn snapshot(
        &self,
        handle: &StreamHandle,
        offset: u64,
    ) -> Result<Option<bytes::Bytes>, EngineError> {
        self.registry.wait_stored(handle.changed_seq()).await;
        Ok(self.store.snapshot(handle.id, offset)?)
    }
}
