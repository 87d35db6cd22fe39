//! Ursula node: the Durable Streams Protocol over HTTP, durable in redb.

pub mod admin;
pub mod admission;
pub mod config;
pub mod cursor;
pub mod engine;
pub mod http;
pub mod machine;
pub mod offset;
pub mod storage;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;

use config::Config;
use engine::{Engine, EngineError, now_ms};
use machine::{Command, Refusal};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("cannot open the data directory: {0}")]
    Engine(#[from] EngineError),
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
    pub engine: Arc<Engine>,
    admin: Arc<admin::Admin>,
    stopping: tokio::sync::watch::Sender<bool>,
    client_server: tokio::task::JoinHandle<()>,
    grace: Duration,
}

impl Node {
    /// Stops taking requests and lets those in flight finish, for at most the configured grace
    /// (`server.shutdown_grace`). Live reads end early: long-polls answer, SSE streams close,
    /// and their clients resume elsewhere. Acknowledged writes are already durable.
    pub async fn shutdown(self) {
        self.admin.ready.store(false, Ordering::Release);
        self.stopping.send_replace(true);
        let deadline = self.grace + Duration::from_millis(100);
        if tokio::time::timeout(deadline, self.client_server)
            .await
            .is_err()
        {
            tracing::warn!("requests still in flight after the shutdown grace; stopping anyway");
        }
    }
}

/// Opens storage, binds both listeners and serves until the runtime stops.
pub async fn start(config: Config) -> Result<Node, StartError> {
    config.validate()?;
    let engine = Engine::open(&config.data_dir, config.limits(), &config.raft.wal)?;
    match engine
        .propose(Command::CreateBucket {
            bucket: config.server.compat_bucket.clone(),
        })
        .await
    {
        Ok(_) | Err(EngineError::Refused(Refusal::BucketFenced(_))) => {}
        Err(error) => return Err(error.into()),
    }
    let bind = |addr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Listen { addr, source })
    };
    let client = bind(config.server.listen).await?;
    let admin = bind(config.server.admin_listen).await?;
    let client_addr = client.local_addr().map_err(|source| StartError::Listen {
        addr: config.server.listen,
        source,
    })?;
    let admin_addr = admin.local_addr().map_err(|source| StartError::Listen {
        addr: config.server.admin_listen,
        source,
    })?;

    let admin_state = Arc::new(admin::Admin {
        engine: engine.clone(),
        ready: Default::default(),
    });
    tokio::spawn(admin::serve(admin, admin_state.clone()));
    let admission = admission::Admission::new(&config, engine.log_bytes.clone());
    let wal_dir = config.data_dir.join("wal");
    admission.sample_disk(&wal_dir, config.raft.wal.min_available_size);
    tokio::spawn(
        admission
            .clone()
            .watch_disk(wal_dir, config.raft.wal.clone()),
    );
    let (stopping, stop_signal) = tokio::sync::watch::channel(false);
    let app = Arc::new(http::App {
        engine: engine.clone(),
        config: Arc::new(config),
        admission,
        stopping: stop_signal.clone(),
    });
    let grace = app.config.server.shutdown_grace;
    let client_server = tokio::spawn(http::serve(client, app, stop_signal));
    tokio::spawn(sweep_expired(engine.clone()));
    admin_state.ready.store(true, Ordering::Release);
    Ok(Node {
        client_addr,
        admin_addr,
        engine,
        admin: admin_state,
        stopping,
        client_server,
        grace,
    })
}

/// Expiry is checked on every access; this sweep also frees expired streams nobody touches,
/// and persists pending TTL resets from reads.
async fn sweep_expired(engine: Arc<Engine>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(EngineError::Stopped) = engine
            .propose(Command::ExpireDue { now_ms: now_ms() })
            .await
        {
            return;
        }
    }
}
