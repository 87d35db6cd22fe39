//! The engine: one state machine, one writer thread with group commit, and the published
//! state that readers use.

mod applier;
mod cold;
pub mod error;
mod metrics;
mod read;
mod read_barrier;
mod registry;
pub mod replication;
mod touch;
pub mod uncommitted;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};

pub use applier::AppliedBatch;
pub use error::EngineError;
pub use metrics::{Histogram, Metrics};
pub use read::{ReadError, Slice};
pub use registry::{RenderKey, Rendered, StreamHandle};

use crate::config::WalConfig;
use crate::machine::subscription::LinkView;
use crate::machine::{
    BucketState, Command, Limits, Machine, Outcome, StreamMeta, StreamPath, Subscription,
};
use crate::storage::Store;
use crate::storage::wal::{Replay, Wal};
use applier::Applier;
pub use registry::Registry;
pub use replication::{GroupStatus, NodeId, Replication, StartReplication};
use touch::TouchTracker;
pub use uncommitted::UncommittedGuard;
use writer::{Proposal, Writer};

/// Proposals waiting for the writer; beyond this, proposers wait (backpressure).
const INBOX_CAPACITY: usize = 16 * 1024;
/// Durable batches waiting for the applier; beyond this the writer waits.
const APPLIER_BACKLOG: usize = 4096;
/// Memory for tail caches across all streams of a node.
pub const TAIL_CACHE_BYTES: usize = 256 * 1024 * 1024;

/// What a reader finds at a path.
pub enum Lookup {
    Live(Arc<StreamHandle>, Arc<StreamMeta>),
    /// Soft-deleted: kept only for its forks.
    Deleted,
    Missing,
}

/// Who orders an engine's commands.
pub enum Sequencer {
    /// The single node's own writer thread and WAL.
    Local,
    /// The group's replication, started around its replica's state machine.
    Replicated(StartReplication),
}

enum Proposer {
    Local(mpsc::Sender<Proposal>),
    Replicated(Arc<dyn Replication>),
}

/// What an engine is opened with.
pub struct EngineSettings<'a> {
    pub limits: Limits,
    pub wal: &'a WalConfig,
    /// How long `propose` waits for its answer (`server.request_timeout`).
    pub request_timeout: Duration,
    /// Body bytes proposed and not yet answered at most (`raft.max_uncommitted_size_per_group`;
    /// a local writer is bounded by its inbox instead).
    pub max_uncommitted: u64,
    /// Memory for the tail caches of this engine's streams.
    pub tail_cache_bytes: usize,
    pub metrics: Arc<Metrics>,
}

/// Where the leader of an engine's group is, as this node knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leadership {
    Here,
    Elsewhere(NodeId),
    Unknown,
}

/// What a replicated group's state machine is made of, handed to its replication by
/// `Engine::open`.
pub struct ReplicaParts {
    pub machine: Machine,
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
    uncommitted: Arc<AtomicU64>,
    max_uncommitted: u64,
    /// Set while the node drains: it takes no writes and lets its groups' leadership go.
    draining: std::sync::atomic::AtomicBool,
    /// Until when this group's leadership is being handed off (`yield_leadership`), in
    /// milliseconds since `started`; read on every write, so an atomic, not a lock.
    yielding_until_ms: AtomicU64,
    started: std::time::Instant,
    /// Reads wait here for a quorum's word that this node leads (`read_barrier`).
    reads: read_barrier::ReadBarrier,
    store: Arc<Store>,
    registry: Arc<Registry>,
    touches: Arc<TouchTracker>,
    pub metrics: Arc<Metrics>,
    /// Log bytes past the last checkpoint.
    pub log_bytes: Arc<AtomicU64>,
    /// Where older records go, when the node has a cold tier.
    cold: std::sync::OnceLock<cold::ColdTier>,
    /// How long `propose` waits for its answer (`server.request_timeout`).
    request_timeout: Duration,
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
    mut machine: Machine,
    applied: u64,
    replay: Vec<Replay>,
) -> Result<Machine, EngineError> {
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

/// The state readers use, published from `machine` up to log position `stored`.
fn published(
    store: &Store,
    machine: &Machine,
    tail_cache_bytes: usize,
    stored: u64,
) -> Result<Arc<Registry>, EngineError> {
    let registry = Arc::new(Registry::new(tail_cache_bytes, stored));
    registry.reset(machine, store.cold_segments()?);
    Ok(registry)
}

fn spawn(name: &str, run: impl FnOnce() + Send + 'static) -> Result<(), EngineError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(run)
        .map(|_| ())
        .map_err(|e| EngineError::Storage(format!("cannot start a thread: {e}")))
}

impl Engine {
    /// Opens a group's storage in `dir` and restores its machine; then `sequencer` orders its
    /// commands: a local writer (which first replays its WAL past the last checkpoint), or
    /// the group's replication, which takes the machine.
    pub async fn open(
        dir: &Path,
        settings: EngineSettings<'_>,
        sequencer: Sequencer,
    ) -> Result<Arc<Self>, EngineError> {
        let store = Arc::new(Store::open(dir)?);
        let (machine, applied) = store.load(settings.limits)?;
        let touches = Arc::new(TouchTracker::default());
        let log_bytes = Arc::new(AtomicU64::new(0));
        let (to_applier, applier_inbox) = std::sync::mpsc::sync_channel(APPLIER_BACKLOG);
        let applier = |registry: &Arc<Registry>, checkpointed: &Arc<AtomicU64>, commit_interval| {
            let applier = Applier {
                store: store.clone(),
                registry: registry.clone(),
                checkpointed: checkpointed.clone(),
                checkpoint_interval: settings.wal.checkpoint_interval,
                commit_interval,
            };
            spawn("ursula-applier", move || applier.run(applier_inbox))
        };
        let (proposer, registry) = match sequencer {
            Sequencer::Local => {
                let (mut wal, replay) = Wal::open(&dir.join("wal"), settings.wal.segment_size)
                    .map_err(|e| EngineError::Storage(format!("cannot open the WAL: {e}")))?;
                let machine = recover(&store, machine, applied, replay)?;
                wal.continue_after(applied);
                let stored = wal.last_seq();
                let registry = published(&store, &machine, settings.tail_cache_bytes, stored)?;
                let checkpointed = Arc::new(AtomicU64::new(stored));
                applier(&registry, &checkpointed, applier::NODE_COMMIT_INTERVAL)?;
                let (inbox, rx) = mpsc::channel(INBOX_CAPACITY);
                let writer = Writer {
                    machine,
                    wal,
                    registry: registry.clone(),
                    touches: touches.clone(),
                    metrics: settings.metrics.clone(),
                    applier: to_applier,
                    checkpointed,
                    log_bytes: log_bytes.clone(),
                    commands: Vec::new(),
                };
                spawn("ursula-writer", move || writer.run(rx))?;
                (Proposer::Local(inbox), registry)
            }
            Sequencer::Replicated(start) => {
                let registry = published(&store, &machine, settings.tail_cache_bytes, applied)?;
                let checkpointed = Arc::new(AtomicU64::new(applied));
                applier(&registry, &checkpointed, applier::REPLICA_COMMIT_INTERVAL)?;
                let parts = ReplicaParts {
                    machine,
                    store: store.clone(),
                    registry: registry.clone(),
                    applier: to_applier,
                    limits: settings.limits,
                    metrics: settings.metrics.clone(),
                };
                let replication = start(parts).await.map_err(EngineError::Replication)?;
                (Proposer::Replicated(replication), registry)
            }
        };
        Ok(Arc::new(Self {
            proposer,
            uncommitted: Default::default(),
            max_uncommitted: settings.max_uncommitted,
            draining: Default::default(),
            yielding_until_ms: AtomicU64::new(0),
            started: std::time::Instant::now(),
            reads: Default::default(),
            store,
            registry,
            touches,
            metrics: settings.metrics,
            log_bytes,
            cold: Default::default(),
            request_timeout: settings.request_timeout,
        }))
    }

    /// What this node knows of the group, when it is replicated.
    pub fn group_status(&self) -> Option<GroupStatus> {
        match &self.proposer {
            Proposer::Replicated(replication) => Some(replication.status()),
            Proposer::Local(_) => None,
        }
    }

    /// Confirms with a quorum that this node still leads, once it has applied everything
    /// committed before (a single node always leads).
    pub async fn confirm_leadership(&self) -> bool {
        match &self.proposer {
            Proposer::Replicated(replication) => replication.confirm_leadership().await,
            Proposer::Local(_) => true,
        }
    }

    /// Whether this replica has applied an entry of the current term (the blank entry a new
    /// leader appends), and so every entry committed in earlier terms.
    pub(crate) fn applied_its_log(&self) -> bool {
        self.group_status()
            .is_none_or(|status| status.applied_current_term)
    }

    /// Waits, up to `server.request_timeout`, until a read here sees every acknowledged write:
    /// a quorum confirmed this node leads, it applied the log up to that confirmation
    /// (`read_barrier`), and it applied its own log (`applied_its_log`: openraft's read index
    /// does not cover a leader restored in its old term). Answers whether it got there.
    pub async fn ready_to_read(&self) -> bool {
        let Proposer::Replicated(replication) = &self.proposer else {
            return true;
        };
        let ready = async {
            if !self.reads.pass(|| replication.confirm_leadership()).await {
                return false;
            }
            while !self.applied_its_log() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            true
        };
        tokio::time::timeout(self.request_timeout, ready)
            .await
            .unwrap_or(false)
    }

    /// Whether this node may propose to the group now.
    pub fn leadership(&self) -> Leadership {
        let Some(status) = self.group_status() else {
            return Leadership::Here;
        };
        match status.leader {
            // A draining leader is on its way out; it proposes nothing more.
            Some(_) if status.leads() && self.is_draining() => Leadership::Unknown,
            Some(_) if status.leads() => Leadership::Here,
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
            Proposer::Replicated(replication) => {
                let held = UncommittedGuard::hold(
                    &self.uncommitted,
                    command.body_len(),
                    self.max_uncommitted,
                )?;
                replication.submit(command, held)
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
        if let Proposer::Replicated(replication) = &self.proposer {
            replication.allow_campaigns(!draining);
        }
    }

    /// Whether this node is handing the group's leadership away: draining, or yielding it.
    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Acquire)
            || self
                .yielding_until_ms
                .load(std::sync::atomic::Ordering::Acquire)
                > self.started.elapsed().as_millis() as u64
    }

    /// Hands this group's leadership off: a drain of this group alone, which ends by itself
    /// after `window` (by then a voter that asked for it has campaigned, and won).
    pub fn yield_leadership(self: &Arc<Self>, window: Duration) {
        let until = (self.started.elapsed() + window).as_millis() as u64;
        self.yielding_until_ms
            .store(until, std::sync::atomic::Ordering::Release);
        if let Proposer::Replicated(replication) = &self.proposer {
            replication.allow_campaigns(false);
        }
        let engine = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(window).await;
            if let Proposer::Replicated(replication) = &engine.proposer
                && !engine.is_draining()
            {
                replication.allow_campaigns(true);
            }
        });
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

    pub fn subscription(&self, bucket: &str, id: &str) -> Option<Arc<Subscription>> {
        self.registry.subscription(bucket, id)
    }

    pub fn subscriptions(&self) -> Vec<Arc<Subscription>> {
        self.registry.subscriptions()
    }

    /// The group's subscriptions changed since the last call (one caller: the deliverer).
    pub fn take_changed_subscriptions(&self) -> Vec<(String, String)> {
        self.registry.take_changed_subscriptions()
    }

    /// Changes whenever one of the group's subscriptions does.
    pub fn watch_subscriptions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.registry.watch_subscriptions()
    }

    /// The subscription's links, each with its stream's tail as readers see it.
    pub fn link_views<'a>(&self, sub: &'a Subscription) -> Vec<LinkView<'a>> {
        sub.views(|name| self.registry.tail_of(&StreamPath::new(&sub.bucket, name)))
    }
}
