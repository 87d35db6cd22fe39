//! Starting this node's replicas of every group: storage, state machines, Raft instances.

use std::sync::Arc;

use super::group::RaftGroup;
use super::log_store::{LogDb, LogStore};
use super::network::GroupNetwork;
use super::rejoin::Rejoining;
use super::state_machine::GroupStateMachine;
use super::stop::RaftCalls;
use super::transport::Transport;
use super::types::Raft;
use super::{ClusterView, membership};
use crate::config::Config;
use crate::engine::replication::BoxFuture;
use crate::engine::{Engine, EngineSettings, Metrics, Replication, Sequencer, TAIL_CACHE_BYTES};
use std::sync::atomic::AtomicBool;

/// openraft's settings. openraft 0.9 gives every AppendEntries (heartbeats too) its heartbeat
/// interval as the deadline, so with a 100 ms heartbeat a follower whose fsync stalls for
/// 100 ms, or a 10 MiB entry on a slow machine, times out on every attempt, forever. Here
/// openraft's "heartbeat interval" is `raft.rpc_timeout`, its own heartbeats are off, and
/// `send_heartbeats` sends them every `raft.heartbeat_interval` instead.
fn raft_config(config: &Config) -> Result<Arc<openraft::Config>, String> {
    let rpc_timeout = config.raft.rpc_timeout().as_millis() as u64;
    let election = config.raft.election_timeout.as_millis() as u64;
    let raft = openraft::Config {
        cluster_name: "ursula".into(),
        heartbeat_interval: rpc_timeout.max(1),
        enable_heartbeat: false,
        election_timeout_min: election,
        election_timeout_max: election * 2,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.raft.snapshot_entries),
        max_in_snapshot_log_to_keep: config.raft.entries_kept_after_snapshot,
        install_snapshot_timeout: 10_000,
        max_payload_entries: 1024,
        ..Default::default()
    };
    raft.validate()
        .map(Arc::new)
        .map_err(|e| format!("invalid Raft settings: {e}"))
}

/// This node's replicas: per group, its engine and Raft instance (`None` where this node
/// does not host the group), and the Raft log they share.
pub struct Replicas {
    pub engines: Vec<Option<Arc<Engine>>>,
    pub rafts: Vec<Option<Raft>>,
    /// This node's own calls into them, which an orderly stop ends first.
    pub calls: RaftCalls,
    pub log: Arc<LogDb>,
    pub rejoining: Arc<Rejoining>,
}

/// Opens and starts every group this node hosts. A group whose log is empty joins its static
/// membership; every voter of it does the same, so they all hold the same first entry.
pub async fn start_groups(
    config: &Config,
    view: &Arc<ClusterView>,
    transport: &Transport,
) -> Result<Replicas, String> {
    let metrics = Arc::new(Metrics::default());
    let raft_dir = config.data_dir.join("raft");
    let rejoining = Arc::new(Rejoining::open(
        &raft_dir,
        !raft_dir.exists(),
        view.join,
        (0..config.raft.group_count)
            .filter(|group| view.hosts(*group))
            .map(|group| group as u32),
    )?);
    let log = LogDb::open(
        &raft_dir,
        config.raft.wal.segment_size,
        config.raft.group_count,
        metrics.clone(),
    )?;
    let settings = raft_config(config)?;
    let client = transport.http.clone();
    let health = Arc::new(super::link_health::LinkHealth::default());
    let mut replicas = Replicas {
        engines: Vec::with_capacity(config.raft.group_count),
        rafts: Vec::with_capacity(config.raft.group_count),
        calls: RaftCalls::default(),
        log: log.clone(),
        rejoining: rejoining.clone(),
    };
    for group in 0..config.raft.group_count {
        if !view.hosts(group) {
            replicas.engines.push(None);
            replicas.rafts.push(None);
            continue;
        }
        let dir = config.data_dir.join("groups").join(group.to_string());
        let group = group as u32;
        let network = GroupNetwork {
            group,
            this_node: view.node_id,
            client: client.clone(),
            book: view.book.clone(),
            health: health.clone(),
        };
        // The engine keeps the Replication; this node's heartbeats and its cluster listener
        // need the Raft instance itself, which the start hands out here.
        let (started, raft) = tokio::sync::oneshot::channel();
        let start = {
            let (settings, view, log) = (settings.clone(), view.clone(), log.clone());
            let calls = replicas.calls.clone();
            let rejoining = rejoining.clone();
            // A node that joins waits to be added; it seeds nothing.
            let first_entry = (!view.join).then(|| FirstEntry::of(config, &view, group));
            let snapshot_budget =
                (config.raft.snapshot_log_budget / config.raft.group_count as u64).max(1);
            move |parts| -> BoxFuture<'static, Result<Arc<dyn Replication>, String>> {
                Box::pin(async move {
                    let log_store = log.group(group);
                    let restored = log_store.restored_leadership(view.node_id);
                    let state_machine = GroupStateMachine::new(group, parts)?;
                    let raft = Raft::new(
                        view.node_id,
                        settings,
                        network,
                        log_store.clone(),
                        state_machine,
                    )
                    .await
                    .map_err(|e| format!("cannot start Raft: {e}"))?;
                    let campaigns = Arc::new(AtomicBool::new(true));
                    if rejoining.contains(group) {
                        raft.runtime_config().elect(false);
                    }
                    tokio::spawn(super::membership::follow(
                        raft.clone(),
                        group,
                        view.book.clone(),
                        rejoining.clone(),
                        campaigns.clone(),
                    ));
                    if let Some(first_entry) = first_entry {
                        first_entry.join(&raft, &calls).await?;
                    }
                    tokio::spawn(snapshot_on_log_bytes(
                        raft.clone(),
                        calls.clone(),
                        log_store,
                        snapshot_budget,
                    ));
                    let _ = started.send(raft.clone());
                    let group: Arc<dyn Replication> = Arc::new(RaftGroup::new(
                        raft,
                        calls,
                        group,
                        log.writer_turns(),
                        restored,
                        campaigns,
                        rejoining,
                    ));
                    Ok(group)
                })
            }
        };
        let engine = Engine::open(
            &dir,
            EngineSettings {
                limits: config.limits(),
                wal: &config.raft.wal,
                request_timeout: config.server.request_timeout,
                max_uncommitted: config.raft.max_uncommitted_size_per_group,
                // The node's tail-cache memory is shared out among its groups.
                tail_cache_bytes: (TAIL_CACHE_BYTES / config.raft.group_count.max(1))
                    .max(32 * 1024 * 1024),
                metrics: metrics.clone(),
            },
            Sequencer::Replicated(Box::new(start)),
        )
        .await
        .map_err(|e| format!("group {group}: {e}"))?;
        let raft = raft
            .await
            .map_err(|_| format!("group {group}: Raft did not start"))?;
        tokio::spawn(send_heartbeats(
            raft.clone(),
            replicas.calls.clone(),
            engine.clone(),
            config.raft.heartbeat_interval,
        ));
        replicas.engines.push(Some(engine));
        replicas.rafts.push(Some(raft));
    }
    Ok(replicas)
}

/// How a group with an empty log gets its first entry: each group's first leader is its
/// preferred voter, so that leadership starts out spread over the voters. The others
/// initialize too, later, in case it is down.
struct FirstEntry {
    group: u32,
    members: std::collections::BTreeMap<super::types::NodeId, openraft::BasicNode>,
    delay: std::time::Duration,
}

impl FirstEntry {
    fn of(config: &Config, view: &ClusterView, group: u32) -> Self {
        let voters = view.voters_of(group as usize);
        let preferred = voters[group as usize % voters.len()];
        let delay = if preferred == view.node_id {
            std::time::Duration::ZERO
        } else {
            config.raft.election_timeout * 3
        };
        Self {
            group,
            members: membership(view, group as usize),
            delay,
        }
    }

    async fn join(self, raft: &Raft, calls: &RaftCalls) -> Result<(), String> {
        let initialized = raft.is_initialized().await.map_err(|e| e.to_string())?;
        if !initialized {
            tokio::spawn(initialize(
                raft.clone(),
                calls.clone(),
                self.members,
                self.delay,
                self.group,
            ));
        }
        Ok(())
    }
}

/// A leader's heartbeats (see `raft_config`), every `every`, unless the node drains: a
/// draining leader lets its followers' election timeouts run out.
async fn send_heartbeats(
    raft: Raft,
    calls: RaftCalls,
    engine: Arc<Engine>,
    every: std::time::Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let leads = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            metrics.current_leader == Some(metrics.id)
        };
        if leads && !engine.is_draining() {
            let sent = calls.run(raft.trigger().heartbeat()).await;
            if sent.is_none_or(|sent| sent.is_err()) {
                return;
            }
        }
    }
}

/// Entry counts alone do not bound the log's bytes: a group also snapshots (and so purges its
/// log) once its share of `raft.snapshot_log_budget` is used.
async fn snapshot_on_log_bytes(raft: Raft, calls: RaftCalls, log: LogStore, budget: u64) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_snapshot_index = None;
    loop {
        tick.tick().await;
        if log.unpurged_bytes() < budget {
            continue;
        }
        let applied = raft.metrics().borrow().last_applied;
        // One request per applied position; a snapshot in progress covers the rest.
        if applied == last_snapshot_index {
            continue;
        }
        last_snapshot_index = applied;
        let triggered = calls.run(raft.trigger().snapshot()).await;
        if triggered.is_none_or(|triggered| triggered.is_err()) {
            return;
        }
    }
}

/// Joins a group with an empty log to the static membership, after `delay`, unless it has
/// learned it from a leader meanwhile. Every voter holds the same first entry either way.
async fn initialize(
    raft: Raft,
    calls: RaftCalls,
    members: std::collections::BTreeMap<super::types::NodeId, openraft::BasicNode>,
    delay: std::time::Duration,
    group: u32,
) {
    tokio::time::sleep(delay).await;
    let Some(Ok(false)) = calls.run(raft.is_initialized()).await else {
        return;
    };
    let Some(initialized) = calls.run(raft.initialize(members)).await else {
        return;
    };
    match initialized {
        Ok(())
        | Err(openraft::error::RaftError::APIError(
            openraft::error::InitializeError::NotAllowed(_),
        )) => {}
        Err(error) => tracing::error!(group, %error, "cannot initialize the group"),
    }
}
