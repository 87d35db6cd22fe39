//! Ursula node: the Durable Streams Protocol over HTTP, durable in redb.

pub mod admin;
pub mod admin_token;
pub mod admission;
pub mod cluster;
pub mod cold;
pub mod config;
pub mod engine;
pub mod groups;
mod housekeeping;
pub mod http;
pub mod machine;
mod metrics;
pub mod names;
pub mod offset;
mod shutdown;
pub mod storage;
pub mod subscriptions;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;

use cluster::ClusterView;
use config::Config;
use engine::{Engine, EngineError, EngineSettings, Sequencer};
use groups::Groups;
use machine::{Command, Refusal};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("cannot open the data directory: {0}")]
    Engine(#[from] EngineError),
    #[error("cannot start replication: {0}")]
    Cluster(String),
    #[error("cannot use the cold tier (storage.cold): {0}")]
    Cold(#[from] cold::ColdError),
    #[error("cannot serve subscriptions: {0}")]
    Subscriptions(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// A started node: its listeners are bound and serving.
pub struct Node {
    pub client_addr: std::net::SocketAddr,
    pub admin_addr: std::net::SocketAddr,
    /// The cluster listener's address, on a node with peers.
    pub cluster_addr: Option<std::net::SocketAddr>,
    pub groups: Arc<Groups>,
    admin: Arc<admin::Admin>,
    stopping: tokio::sync::watch::Sender<bool>,
    client_server: tokio::task::JoinHandle<()>,
    /// A voter's Raft groups and cluster listener, stopped after its clients.
    replication: Option<cluster::stop::Replication>,
    grace: Duration,
}

impl Node {
    /// Stops taking requests and lets those in flight finish, for at most the configured grace
    /// (`server.shutdown_grace`). Live reads end early: long-polls answer, SSE streams close,
    /// and their clients resume elsewhere. Acknowledged writes are already durable.
    pub async fn shutdown(self) {
        self.admin.ready.store(false, Ordering::Release);
        // A voter first hands its leaderships over, so that writes move on without waiting
        // for an election timeout after it is gone.
        if self.groups.cluster.is_some() {
            let still_led = self.groups.drain(self.grace / 2).await;
            tracing::info!(still_led, "drained before stopping");
        }
        self.stopping.send_replace(true);
        let deadline = self.grace + Duration::from_millis(100);
        if tokio::time::timeout(deadline, self.client_server)
            .await
            .is_err()
        {
            tracing::warn!("requests still in flight after the shutdown grace; stopping anyway");
        }
        if let Some(replication) = self.replication {
            replication.stop().await;
        }
    }
}

/// Opens storage, binds the listeners and serves until the runtime stops. With peers, it also
/// starts this node's replica of every Raft group and the cluster listener.
pub async fn start(config: Config) -> Result<Node, StartError> {
    config.validate()?;
    let bind = |addr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Listen { addr, source })
    };
    let local = |listener: &TcpListener, addr| {
        listener
            .local_addr()
            .map_err(|source| StartError::Listen { addr, source })
    };
    let subscriptions =
        subscriptions::Subscriptions::open(&config).map_err(StartError::Subscriptions)?;
    let cold_store = match &config.storage.cold {
        Some(cold) => Some(Arc::new(cold::ColdStore::open(cold)?)),
        None => None,
    };
    let (stopping, stop_signal) = tokio::sync::watch::channel(false);
    let (groups, log_bytes, cluster_addr, transport, replication) =
        match ClusterView::from_config(&config) {
            None => {
                let settings = EngineSettings {
                    limits: config.limits(),
                    wal: &config.raft.wal,
                    request_timeout: config.server.request_timeout,
                    max_uncommitted: u64::MAX,
                    tail_cache_bytes: engine::TAIL_CACHE_BYTES,
                    metrics: Default::default(),
                };
                let engine = Engine::open(&config.data_dir, settings, Sequencer::Local).await?;
                match engine
                    .propose(Command::CreateBucket {
                        bucket: config.server.compat_bucket.clone(),
                    })
                    .await
                {
                    Ok(_) | Err(EngineError::Refused(Refusal::BucketFenced(_))) => {}
                    Err(error) => return Err(error.into()),
                }
                let log_bytes = engine.log_bytes.clone();
                (Groups::single(engine), log_bytes, None, None, None)
            }
            Some(view) => {
                // Bound first, so that peers reach this node as soon as its groups start.
                let listener = bind(config.server.cluster_listen).await?;
                let cluster_addr = local(&listener, config.server.cluster_listen)?;
                let transport =
                    cluster::transport::Transport::open(&view, config.server.cluster_tls.as_ref())
                        .map_err(|message| config::ConfigError::Invalid {
                            key: "server.cluster_tls",
                            message,
                        })?;
                if let (Some(tls), Some(files)) = (&transport.tls, &config.server.cluster_tls) {
                    tokio::spawn(
                        tls.files()
                            .watch(files.reload_interval, stop_signal.clone()),
                    );
                }
                let replicas = cluster::bootstrap::start_groups(&config, &view, &transport)
                    .await
                    .map_err(StartError::Cluster)?;
                let (engines, log) = (replicas.engines, replicas.log);
                let rafts = Arc::new(replicas.rafts);
                let rejoining = replicas.rejoining;
                let calls = replicas.calls;
                let metrics = engines
                    .iter()
                    .flatten()
                    .next()
                    .map(|engine| engine.metrics.clone())
                    .unwrap_or_default();
                let listener = tokio::spawn(cluster::service::serve(
                    listener,
                    Arc::new(cluster::service::Served {
                        rafts: rafts.clone(),
                        calls: calls.clone(),
                        engines: engines.clone(),
                        metrics,
                        rejoining: rejoining.clone(),
                        subscriptions: subscriptions.clone(),
                    }),
                    transport.tls.clone(),
                    stop_signal.clone(),
                ));
                let replication = cluster::stop::Replication {
                    listener,
                    rafts: rafts.clone(),
                    calls: calls.clone(),
                    log: log.clone(),
                };
                let members = cluster::membership::Members {
                    rafts,
                    calls,
                    book: view.book.clone(),
                    rejoining,
                    transport,
                    leader_lease: config.raft.election_timeout * 2,
                };
                let groups = Groups::replicated(engines, view);
                (
                    groups,
                    log.unpurged_bytes.clone(),
                    Some(cluster_addr),
                    Some(Arc::new(members)),
                    Some(replication),
                )
            }
        };
    let groups = Arc::new(groups);
    if let Some(store) = &cold_store {
        tracing::info!(
            url = %store.config.url,
            max_hot_size_per_group = store.config.max_hot_size_per_group,
            "cold tier on: older records move to object storage"
        );
        for (group, engine) in groups.hosted() {
            engine.attach_cold(
                store.clone(),
                group as u32,
                config.runtime.external_payload_min_size,
            );
            tokio::spawn(engine.clone().run_cold_tier());
        }
    }
    let client = bind(config.server.listen).await?;
    let admin = bind(config.server.admin_listen).await?;
    let client_addr = local(&client, config.server.listen)?;
    let admin_addr = local(&admin, config.server.admin_listen)?;

    let token = match &config.server.admin_token_file {
        Some(file) => Some(admin_token::AdminToken::open(file).map_err(|message| {
            config::ConfigError::Invalid {
                key: "server.admin_token_file",
                message,
            }
        })?),
        None => None,
    };
    let admin_state = Arc::new(admin::Admin {
        token,
        metrics_require_token: config.server.metrics_require_token,
        groups: groups.clone(),
        ready: Default::default(),
        drain_wait: config.raft.election_timeout * 4,
        members: transport,
        subscriptions: subscriptions.clone(),
    });
    tokio::spawn(admin::serve(admin, admin_state.clone()));
    let admission = admission::Admission::new(&config, log_bytes);
    let wal_dir = if groups.cluster.is_some() {
        config.data_dir.join("raft")
    } else {
        config.data_dir.join("wal")
    };
    admission.sample_disk(&wal_dir, config.raft.wal.min_available_size);
    tokio::spawn(
        admission
            .clone()
            .watch_disk(wal_dir, config.raft.wal.clone()),
    );
    if groups.cluster.is_some() {
        tokio::spawn(housekeeping::ensure_bucket(
            groups.clone(),
            config.server.compat_bucket.clone(),
        ));
    }
    let client_tls = match &config.server.tls {
        Some(tls) => {
            let invalid = |message| config::ConfigError::Invalid {
                key: "server.tls",
                message,
            };
            let files = ursula_tls::Tls::load(tls.files()).map_err(invalid)?;
            let server = files
                .server_config(&[b"h2", b"http/1.1"])
                .map_err(invalid)?;
            tokio::spawn(files.watch(tls.reload_interval, stop_signal.clone()));
            Some(tokio_rustls::TlsAcceptor::from(server))
        }
        None => None,
    };
    let app = Arc::new(http::App::new(
        groups.clone(),
        Arc::new(config),
        admission,
        subscriptions.clone(),
        admin_state.members.clone(),
        stop_signal.clone(),
    ));
    let grace = app.config.server.shutdown_grace;
    let stopping_signal = stop_signal.clone();
    let client_server = tokio::spawn(http::serve(client, app, client_tls, stop_signal));
    for engine in groups.all() {
        tokio::spawn(housekeeping::sweep(engine.clone()));
        tokio::spawn(subscriptions::delivery::run(
            subscriptions.clone(),
            engine.clone(),
            stopping_signal.clone(),
        ));
    }
    admin_state.ready.store(true, Ordering::Release);
    Ok(Node {
        client_addr,
        admin_addr,
        cluster_addr,
        groups,
        admin: admin_state,
        stopping,
        client_server,
        replication,
        grace,
    })
}
