//! The engine: one state machine, one writer thread with group commit, and the published
//! state that readers use.

mod applier;
mod cold;
pub mod error;
mod metrics;
mod read;
mod registry;
mod touch;
pub mod uncommitted;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};

pub use applier::AppliedBatch;
pub use error::EngineError;
pub use metrics::Metrics;
pub use read::{ReadError, Slice};
pub use registry::{RenderKey, Rendered, StreamHandle};

use crate::cluster::types::{NodeId, Raft};
use crate::machine::{BucketState, Command, Limits, Outcome, StreamMeta, StreamPath};
use crate::storage::Store;
use crate::storage::wal::{Replay, Wal};
use applier::Applier;
pub use registry::Registry;
use touch::TouchTracker;
pub use uncommitted::UncommittedGuard;
use writer::{Proposal, Writer};

/// Proposals waiting for the writer; beyond this, proposers wait (backpressure).
const INBOX_CAPACITY: usize = 16 * 1024;
/// Durable batches waiting for the applier; beyond this the writer waits.
const APPLIER_BACKLOG: usize = 4096;
/// Memory for tail caches across all streams.
const TAIL_CACHE_BYTES: usize = 256 * 1024 * 1024;

/// What a reader finds at a path.
pub enum Lookup {
    Live(Arc<StreamHandle>, Arc<StreamMeta>),
    /// Soft-deleted: kept only for its forks.
    Deleted,
    Missing,
}

/// Who orders this engine's commands.
enum Proposer {
    /// The single node's own writer thread and WAL.
    Local(mpsc::Sender<Proposal>),
    /// The group's Raft instance and its proposal batcher, set once it has started.
    Raft(std::sync::OnceLock<(Raft, Arc<crate::cluster::batcher::Batcher>)>),
}

/// Where the leader of an engine's group is, as this node knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leadership {
    Here,
    Elsewhere(NodeId),
    Unknown,
}

/// What a Raft group's state machine is made of, handed to it by `Engine::open_replica`.
pub struct ReplicaParts {
    pub machine: crate::machine::Machine,
    pub store: Arc<Store>,
    pub registry: Arc<Registry>,
    pub applier: std::sync::mpsc::SyncSender<AppliedBatch>,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
}

pub struct Engine {
    proposer: Proposer,
    /// Body bytes of creates and appends proposed to Raft and not yet answered, and the most
    /// there may be (`raft.max_uncommitted_size_per_group`).
    uncommitted: Arc<std::sync::atomic::AtomicU64>,
    max_uncommitted: u64,
    /// Set while the node drains: it takes no writes and lets its groups' leadership go.
    draining: std::sync::atomic::AtomicBool,
    store: Arc<Store>,
    registry: Arc<Registry>,
    touches: Arc<TouchTracker>,
    pub metrics: Arc<Metrics>,
    /// Log bytes past the last checkpoint.
    pub log_bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Where older records go, when the node has a cold tier.
    cold: std::sync::OnceLock<cold::ColdTier>,
    /// How long `propose` waits for its answer (`server.request_timeout`).
    request_timeout: std::time::Duration,
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
            // A refusal replays as the refusal it was; only the effects matter here.
            let _ = machine.apply_in_batch(command, &mut effects);
        }
        machine.finish_batch(&mut effects);
        last = record.seq;
    }
    if last > applied {
        tracing::info!(
            records = last - applied,
            "replayed the WAL past the last checkpoint"
        );
        store.commit(&effects, last, true, None)?;
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
        request_timeout: std::time::Duration,
    ) -> Result<Arc<Self>, EngineError> {
        let store = Arc::new(Store::open(data_dir)?);
        let (machine, applied) = store.load(limits)?;
        let (mut wal, replay) = Wal::open(&data_dir.join("wal"), wal_config.segment_size)
            .map_err(|e| EngineError::Storage(format!("cannot open the WAL: {e}")))?;
        let machine = recover(&store, machine, applied, replay)?;
        wal.continue_after(applied);
        let stored = wal.last_seq();
        let registry = Arc::new(Registry::new(TAIL_CACHE_BYTES, stored));
        registry.reset(
            machine.buckets(),
            machine.streams().map(|s| &s.meta),
            store.cold_segments()?,
        );
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
            commit_interval: applier::NODE_COMMIT_INTERVAL,
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
            commands: Vec::new(),
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
            proposer: Proposer::Local(inbox),
            uncommitted: Default::default(),
            max_uncommitted: u64::MAX,
            draining: Default::default(),
            store,
            registry,
            touches,
            metrics,
            log_bytes,
            cold: Default::default(),
            request_timeout,
        }))
    }

    /// The read side of one Raft group's replica: storage, the published state and the
    /// applier. The group's state machine takes the parts; `set_raft` connects the proposer.
    pub fn open_replica(
        dir: &Path,
        limits: Limits,
        wal_config: &crate::config::WalConfig,
        metrics: Arc<Metrics>,
        group_count: usize,
        max_uncommitted: u64,
        request_timeout: std::time::Duration,
    ) -> Result<(Arc<Self>, ReplicaParts), EngineError> {
        let store = Arc::new(Store::open(dir)?);
        let (machine, applied) = store.load(limits)?;
        // The node's tail-cache memory is shared out among its groups.
        let cache = (TAIL_CACHE_BYTES / group_count.max(1)).max(32 * 1024 * 1024);
        let registry = Arc::new(Registry::new(cache, applied));
        registry.reset(
            machine.buckets(),
            machine.streams().map(|s| &s.meta),
            store.cold_segments()?,
        );
        let (to_applier, applier_inbox) = std::sync::mpsc::sync_channel(APPLIER_BACKLOG);
        let applier = Applier {
            store: store.clone(),
            registry: registry.clone(),
            checkpointed: Arc::new(std::sync::atomic::AtomicU64::new(applied)),
            checkpoint_interval: wal_config.checkpoint_interval,
            commit_interval: applier::REPLICA_COMMIT_INTERVAL,
        };
        std::thread::Builder::new()
            .name("ursula-applier".into())
            .spawn(move || applier.run(applier_inbox))
            .map_err(|e| EngineError::Storage(format!("cannot start a thread: {e}")))?;
        let engine = Arc::new(Self {
            proposer: Proposer::Raft(std::sync::OnceLock::new()),
            uncommitted: Default::default(),
            max_uncommitted,
            draining: Default::default(),
            store: store.clone(),
            registry: registry.clone(),
            touches: Arc::new(TouchTracker::default()),
            metrics: metrics.clone(),
            log_bytes: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            cold: Default::default(),
            request_timeout,
        });
        let parts = ReplicaParts {
            machine,
            store,
            registry,
            applier: to_applier,
            limits,
            metrics,
        };
        Ok((engine, parts))
    }

    /// Connects a replica to its started Raft instance.
    pub fn set_raft(&self, raft: Raft, log_writer_turns: tokio::sync::watch::Receiver<u64>) {
        if let Proposer::Raft(slot) = &self.proposer {
            let batcher = crate::cluster::batcher::Batcher::start(raft.clone(), log_writer_turns);
            let _ = slot.set((raft, batcher));
        }
    }

    pub fn raft(&self) -> Option<&Raft> {
        match &self.proposer {
            Proposer::Raft(slot) => slot.get().map(|(raft, _)| raft),
            Proposer::Local(_) => None,
        }
    }

    /// Whether this node may propose to the group now.
    pub fn leadership(&self) -> Leadership {
        let Some(raft) = self.raft() else {
            return match self.proposer {
                Proposer::Local(_) => Leadership::Here,
                Proposer::Raft(_) => Leadership::Unknown,
            };
        };
        let metrics = raft.metrics();
        let metrics = metrics.borrow();
        match metrics.current_leader {
            // A draining leader is on its way out; it proposes nothing more.
            Some(leader) if leader == metrics.id && self.is_draining() => Leadership::Unknown,
            Some(leader) if leader == metrics.id => Leadership::Here,
            Some(leader) => Leadership::Elsewhere(leader),
            None => Leadership::Unknown,
        }
    }

    /// Applies a command; answers once its effects are durable (on a quorum, when replicated)
    /// and visible to readers, or `TimedOut` once `server.request_timeout` has passed.
    pub async fn propose(&self, command: Command) -> Result<Outcome, EngineError> {
        self.make_local_room(command.body_len())?;
        let deadline = tokio::time::Instant::now() + self.request_timeout;
        let timed_out = || EngineError::TimedOut(self.request_timeout);
        let answer = match &self.proposer {
            Proposer::Local(inbox) => {
                let (reply, answer) = oneshot::channel();
                tokio::time::timeout_at(deadline, inbox.send(Proposal { command, reply }))
                    .await
                    .map_err(|_| timed_out())?
                    .map_err(|_| EngineError::Stopped)?;
                answer
            }
            Proposer::Raft(slot) => {
                let (_, batcher) = slot.get().ok_or(EngineError::NotLeader { leader: None })?;
                let held = UncommittedGuard::hold(
                    &self.uncommitted,
                    command.body_len(),
                    self.max_uncommitted,
                )?;
                batcher.submit(command, held)
            }
        };
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(answered) => answered.map_err(|_| EngineError::Stopped)?,
            Err(_) => Err(timed_out()),
        }
    }

    /// Stops leading: no more writes, heartbeats (`cluster::bootstrap::send_heartbeats` asks)
    /// or campaigns here, so that the followers elect a new leader once the election timeout
    /// passes. `false` undoes it.
    pub fn set_draining(&self, draining: bool) {
        self.draining
            .store(draining, std::sync::atomic::Ordering::Release);
        if let Some(raft) = self.raft() {
            raft.runtime_config().elect(!draining);
        }
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Pending TTL resets from reads, as a command for the group's leader to propose.
    pub fn take_touches(&self) -> Option<Command> {
        let touches = self.touches.drain();
        (!touches.is_empty()).then_some(Command::Touch { touches })
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
        let stored = self.registry.wait_stored(handle.changed_seq());
        tokio::time::timeout(self.request_timeout, stored)
            .await
            .map_err(|_| EngineError::TimedOut(self.request_timeout))?;
        Ok(self.store.snapshot(handle.id, offset)?)
    }
}
