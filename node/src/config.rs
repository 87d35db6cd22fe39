//! Node configuration: a TOML file (keys named as in the spec: `server.*`, `storage.*`,
//! `runtime.*`), then command-line flags over it. Unknown keys are an error naming the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::machine::Limits;

mod subscriptions;
pub use subscriptions::SubscriptionsConfig;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid value for {key}: {message}")]
    Invalid { key: &'static str, message: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub node_id: u64,
    pub data_dir: PathBuf,
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub raft: RaftConfig,
    pub runtime: RuntimeConfig,
    pub subscriptions: SubscriptionsConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// Raft traffic between voters; bound only when the node has peers.
    pub cluster_listen: SocketAddr,
    #[serde(deserialize_with = "duration")]
    pub long_poll_timeout: Duration,
    /// The bucket that `/v1/stream/{name}` addresses; created at start-up.
    pub compat_bucket: String,
    /// Largest body of an append or create, in bytes.
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub max_append_size: u64,
    /// Largest snapshot body, in bytes.
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub max_snapshot_size: u64,
    /// About how many bytes one catch-up response or SSE data event carries.
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub read_chunk_size: usize,
    /// SSE connections close after this long so that intermediaries can collapse requests;
    /// clients resume from the last `streamNextOffset`.
    #[serde(deserialize_with = "duration")]
    pub sse_max_duration: Duration,
    /// Write bodies the node holds at once (received, not yet durable); a write whose body
    /// does not fit is refused with 503 `IngressBodyBytesLimitReached`.
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub http_inflight_body_size: u64,
    /// On SIGTERM, how long requests in flight may take to finish.
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// How long a request may wait on the node once its body is in: for its write to be
    /// proposed, replicated and applied, or for a read's data. Past it the client gets 503
    /// `RequestTimeout` with `Retry-After: 1` (never marked: the write may still apply).
    /// Long-polls and SSE keep their own durations.
    #[serde(deserialize_with = "duration")]
    pub request_timeout: Duration,
    /// A file holding the bearer token that the admin listener's drain, purge and replica
    /// routes ask for (`Authorization: Bearer <token>`). Read on every such request, so that
    /// a new token written there takes effect without a restart. Unset, those routes are open.
    pub admin_token_file: Option<PathBuf>,
    /// `/metrics` asks for the admin token too.
    pub metrics_require_token: bool,
    /// Mutual TLS between voters on the cluster listener. Peers' `cluster_url`s are then
    /// `https://`.
    pub cluster_tls: Option<ClusterTlsConfig>,
    /// TLS on the client listener (HTTP/1.1 and HTTP/2 by ALPN).
    pub tls: Option<ServerTlsConfig>,
    /// Lets a node with peers start without `cluster_tls`: its cluster listener then trusts
    /// whoever reaches it. Only where nothing but the voters can reach that port.
    pub allow_insecure_cluster: bool,
    /// The URL clients reach this node or its gateway by (`https://streams.example.com`),
    /// which subscription callback and key URLs start with. Unset: the scheme and `Host` of
    /// the request that created the subscription.
    pub public_url: Option<String>,
}

/// A listener's certificate (chain) and key: PEM files, watched for rotation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// How often the files are read again; changed files take effect without a restart.
    #[serde(
        deserialize_with = "duration",
        default = "ClusterTlsConfig::default_reload"
    )]
    pub reload_interval: Duration,
}

impl ServerTlsConfig {
    pub fn files(&self) -> ursula_tls::TlsFiles {
        ursula_tls::TlsFiles {
            ca_file: None,
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
        }
    }
}

/// A voter's certificate and key, and the cluster's CA: PEM files, watched for rotation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTlsConfig {
    /// The CA that every voter's certificate chains to.
    pub ca_file: PathBuf,
    /// This voter's certificate (chain), which names its node ID as the DNS name
    /// `node-{node_id}.ursula.internal`.
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// How often the files are read again; changed files take effect without a restart.
    #[serde(
        deserialize_with = "duration",
        default = "ClusterTlsConfig::default_reload"
    )]
    pub reload_interval: Duration,
}

impl ClusterTlsConfig {
    fn default_reload() -> Duration {
        Duration::from_secs(10)
    }

    pub fn files(&self) -> ursula_tls::TlsFiles {
        ursula_tls::TlsFiles {
            ca_file: Some(self.ca_file.clone()),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
        }
    }
}

/// The node's log. A single node's log is its write-ahead log; the keys keep the names they
/// have on a replicated node.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftConfig {
    /// Log bytes not yet covered by a checkpoint that the node aims to stay under. Past twice
    /// this, writes with a body are refused (`RaftLogPressure`) until it is below 1.5 times.
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub snapshot_log_budget: u64,
    pub wal: WalConfig,
    /// Raft groups streams are spread over (by bucket). Fixed for the life of a cluster.
    pub group_count: usize,
    /// The address book: this node and the voters it knows of. A new cluster's first
    /// membership is this list (unless `join`); nodes added since are learned from the Raft
    /// log. Empty: a single node without Raft. Only this node: a cluster of one voter, which
    /// can grow.
    pub peers: Vec<Peer>,
    /// Join a cluster that exists instead of seeding one: the node initializes nothing, waits
    /// to be added as a learner, and, when its data directory is empty, never votes with the
    /// identity it may have had before (it is brought back through a membership change).
    pub join: bool,
    /// How often a leader sends heartbeats.
    #[serde(deserialize_with = "duration")]
    pub heartbeat_interval: Duration,
    /// A follower that hears no leader for this long (up to twice as long, randomized)
    /// campaigns.
    #[serde(deserialize_with = "duration")]
    pub election_timeout: Duration,
    /// How long a leader waits for a follower to answer an AppendEntries (heartbeats and
    /// entries, fsync included) before it sends again. Default: half the election timeout.
    /// It must cover a slow disk's fsync stall and a large entry's transfer; it is kept below
    /// the election timeout so that a follower is heard from again before it would campaign.
    #[serde(deserialize_with = "optional_duration")]
    pub rpc_timeout: Option<Duration>,
    /// A group snapshots its state, and purges its log behind it, after this many entries.
    pub snapshot_entries: u64,
    /// Entries kept behind a snapshot, so that briefly lagging followers catch up from the log.
    pub entries_kept_after_snapshot: u64,
    /// Bytes of creates and appends a group may have proposed but not yet applied; more are
    /// refused (`RaftUncommittedBackpressure`).
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub max_uncommitted_size_per_group: u64,
    /// Groups replicated by a subset of the voters; a group not listed is on every voter.
    pub group_voters: Vec<GroupVoters>,
}

/// The voters of one group, when not all of them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupVoters {
    pub group: usize,
    pub voters: Vec<u64>,
}

/// A voter: its ID, where peers reach it, and where clients are sent to reach it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    pub id: u64,
    pub cluster_url: String,
    pub client_url: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WalConfig {
    /// Below this much free space on the log's filesystem, writes are refused
    /// (`WalDiskPressure`).
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub min_available_size: u64,
    /// Writes pass again once free space is back to this much.
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub resume_available_size: u64,
    /// How often free space is sampled (statvfs).
    #[serde(deserialize_with = "duration")]
    pub free_space_check_interval: Duration,
    /// How often redb is made durable, after which the log before it is deleted. It bounds
    /// the log a restart replays.
    #[serde(deserialize_with = "duration")]
    pub checkpoint_interval: Duration,
    /// Size of a log segment file, preallocated before use.
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub segment_size: u64,
}

impl Default for RaftConfig {
    fn default() -> Self {
        Self {
            snapshot_log_budget: 256 * 1024 * 1024,
            wal: WalConfig::default(),
            group_count: 16,
            peers: Vec::new(),
            join: false,
            heartbeat_interval: Duration::from_millis(100),
            election_timeout: Duration::from_millis(1000),
            rpc_timeout: None,
            snapshot_entries: 20_000,
            entries_kept_after_snapshot: 1_000,
            max_uncommitted_size_per_group: 64 * 1024 * 1024,
            group_voters: Vec::new(),
        }
    }
}

impl RaftConfig {
    /// `rpc_timeout`, or its default: half the election timeout.
    pub fn rpc_timeout(&self) -> Duration {
        self.rpc_timeout.unwrap_or(self.election_timeout / 2)
    }
}

impl Default for WalConfig {
    fn default() -> Self {
        Self {
            min_available_size: 256 * 1024 * 1024,
            resume_available_size: 512 * 1024 * 1024,
            free_space_check_interval: Duration::from_millis(100),
            checkpoint_interval: Duration::from_secs(2),
            segment_size: 64 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    pub max_producers_per_stream: u32,
    /// A producer idle this long may be evicted when a new producer needs its place.
    #[serde(deserialize_with = "duration")]
    pub producer_idle_timeout: Duration,
    /// The cold tier: where older records move, so that local disk holds only recent ones.
    /// Without it every record stays on local disk.
    pub cold: Option<ColdConfig>,
}

/// `[storage.cold]`: object storage for records that have left local disk.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ColdConfig {
    /// `s3://bucket/prefix` or `file:///directory`. Every voter of a cluster names the same
    /// place, and no two clusters share one.
    pub url: String,
    /// An S3-API endpoint other than AWS's (MinIO, Ceph, …).
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Lets `endpoint` be plain `http://`.
    pub allow_http: bool,
    /// Credentials; when absent, `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (and the
    /// rest of the AWS environment) are used.
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Record bytes a Raft group may hold on local disk. Creates and appends whose body would
    /// take it past this are refused (`ColdBackpressure`) until cold flush catches up.
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub max_hot_size_per_group: u64,
    /// About how many bytes one cold object holds: a stream is flushed once this much of it
    /// is on local disk, or sooner when its group nears `max_hot_size_per_group`.
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub segment_size: u64,
    /// How often a group's leader looks for records to flush.
    #[serde(deserialize_with = "duration")]
    pub flush_interval: Duration,
    /// How often a group's leader deletes objects no stream refers to any more (deleted and
    /// purged streams, records behind a retention advance, flushes that did not commit).
    #[serde(deserialize_with = "duration")]
    pub sweep_interval: Duration,
    /// How old an unreferenced object must be before the sweep deletes it: longer than any
    /// flush takes from upload to commit.
    #[serde(deserialize_with = "duration")]
    pub sweep_grace: Duration,
    /// Decoded cold objects kept in memory for readers, in bytes.
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub read_cache_size: u64,
}

impl Default for ColdConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            endpoint: None,
            region: None,
            allow_http: false,
            access_key_id: None,
            secret_access_key: None,
            max_hot_size_per_group: 1024 * 1024 * 1024,
            segment_size: 8 * 1024 * 1024,
            flush_interval: Duration::from_secs(1),
            sweep_interval: Duration::from_secs(300),
            sweep_grace: Duration::from_secs(600),
            read_cache_size: 64 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Tokio worker threads; default: one per core.
    pub worker_threads: Option<usize>,
    /// With a cold tier: a create or append body of at least this many bytes is written to
    /// object storage before the write is proposed, and only its name goes through Raft.
    #[serde(deserialize_with = "ursula_wire::size::optional_bytes")]
    pub external_payload_min_size: Option<u64>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            node_id: 1,
            data_dir: PathBuf::from("./ursula-data"),
            server: ServerConfig::default(),
            storage: StorageConfig::default(),
            raft: RaftConfig::default(),
            runtime: RuntimeConfig::default(),
            subscriptions: SubscriptionsConfig::default(),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], ursula_wire::ports::CLIENT)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], ursula_wire::ports::ADMIN)),
            cluster_listen: SocketAddr::from(([127, 0, 0, 1], ursula_wire::ports::CLUSTER)),
            long_poll_timeout: Duration::from_secs(20),
            compat_bucket: "default".into(),
            max_append_size: 64 * 1024 * 1024,
            max_snapshot_size: 256 * 1024 * 1024,
            read_chunk_size: 1024 * 1024,
            sse_max_duration: Duration::from_secs(60),
            http_inflight_body_size: 256 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            admin_token_file: None,
            cluster_tls: None,
            tls: None,
            allow_insecure_cluster: false,
            metrics_require_token: false,
            public_url: None,
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        let limits = Limits::default();
        Self {
            max_producers_per_stream: limits.max_producers_per_stream,
            producer_idle_timeout: Duration::from_millis(limits.producer_idle_ms),
            cold: None,
        }
    }
}

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_duration(&text).map_err(serde::de::Error::custom)
}

fn optional_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    duration(deserializer).map(Some)
}

/// `500ms`, `20s`, `7d`, …
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration: {e}"))
}

impl ColdConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &'static str, message: &str| ConfigError::Invalid {
            key,
            message: message.into(),
        };
        if !(self.url.starts_with("s3://") || self.url.starts_with("file:///")) {
            return Err(invalid(
                "storage.cold.url",
                "must be s3://bucket[/prefix] or file:///directory",
            ));
        }
        if self.segment_size == 0 || self.segment_size > u64::from(u32::MAX) {
            return Err(invalid(
                "storage.cold.segment_size",
                "must be between 1 byte and 4 GiB",
            ));
        }
        if self.flush_interval.is_zero() || self.sweep_interval.is_zero() {
            return Err(invalid(
                "storage.cold.flush_interval",
                "flush_interval and sweep_interval must be above zero",
            ));
        }
        Ok(())
    }
}

impl Config {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Whether this node replicates with peers (otherwise it is a single node).
    pub fn is_replicated(&self) -> bool {
        !self.raft.peers.is_empty()
    }

    fn validate_peers(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            key: "raft.peers",
            message,
        };
        let mut ids = std::collections::HashSet::new();
        for peer in &self.raft.peers {
            if !ids.insert(peer.id) {
                return Err(invalid(format!("node ID {} is listed twice", peer.id)));
            }
            let (scheme, why) = match self.server.cluster_tls {
                Some(_) => ("https://", "server.cluster_tls is set"),
                None => ("http://", "server.cluster_tls is not set"),
            };
            if !peer.cluster_url.starts_with(scheme) {
                return Err(invalid(format!(
                    "cluster_url {:?} of node {} is not an {scheme} URL ({why})",
                    peer.cluster_url, peer.id
                )));
            }
            if !["http://", "https://"]
                .iter()
                .any(|scheme| peer.client_url.starts_with(scheme))
            {
                return Err(invalid(format!(
                    "client_url {:?} of node {} is not an http:// or https:// URL",
                    peer.client_url, peer.id
                )));
            }
        }
        if self.is_replicated()
            && self.server.cluster_tls.is_none()
            && !self.server.allow_insecure_cluster
        {
            return Err(ConfigError::Invalid {
                key: "server.cluster_tls",
                message: "a node with peers needs mutual TLS between the voters (`ursula-node issue-certs` writes a CA and certificates), or server.allow_insecure_cluster = true where nothing but the voters reaches the cluster port".into(),
            });
        }
        if self.is_replicated() && !ids.contains(&self.node_id) {
            return Err(invalid(format!(
                "this node's node_id {} is not among the peers",
                self.node_id
            )));
        }
        if self.raft.group_count == 0 || self.raft.group_count > 4096 {
            return Err(ConfigError::Invalid {
                key: "raft.group_count",
                message: "must be between 1 and 4096".into(),
            });
        }
        let mut listed = std::collections::HashSet::new();
        for entry in &self.raft.group_voters {
            let invalid = |message: String| ConfigError::Invalid {
                key: "raft.group_voters",
                message,
            };
            if entry.group >= self.raft.group_count {
                return Err(invalid(format!(
                    "group {} is not below raft.group_count {}",
                    entry.group, self.raft.group_count
                )));
            }
            if !listed.insert(entry.group) {
                return Err(invalid(format!("group {} is listed twice", entry.group)));
            }
            if entry.voters.is_empty() {
                return Err(invalid(format!("group {} has no voters", entry.group)));
            }
            if let Some(stranger) = entry.voters.iter().find(|v| !ids.contains(v)) {
                return Err(invalid(format!(
                    "voter {stranger} of group {} is not among raft.peers",
                    entry.group
                )));
            }
        }
        if self.raft.election_timeout < self.raft.heartbeat_interval * 3 {
            return Err(ConfigError::Invalid {
                key: "raft.election_timeout",
                message: "must be at least three heartbeat intervals".into(),
            });
        }
        let rpc_timeout = self.raft.rpc_timeout();
        if rpc_timeout <= self.raft.heartbeat_interval || rpc_timeout >= self.raft.election_timeout
        {
            return Err(ConfigError::Invalid {
                key: "raft.rpc_timeout",
                message: format!(
                    "{rpc_timeout:?} must be longer than raft.heartbeat_interval ({:?}) and shorter than raft.election_timeout ({:?})",
                    self.raft.heartbeat_interval, self.raft.election_timeout
                ),
            });
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_peers()?;
        if self.server.metrics_require_token && self.server.admin_token_file.is_none() {
            return Err(ConfigError::Invalid {
                key: "server.metrics_require_token",
                message: "needs server.admin_token_file".into(),
            });
        }
        if let Some(file) = &self.server.admin_token_file {
            crate::admin_token::AdminToken::open(file).map_err(|message| ConfigError::Invalid {
                key: "server.admin_token_file",
                message,
            })?;
        }
        if !crate::names::is_valid_bucket(&self.server.compat_bucket) {
            return Err(ConfigError::Invalid {
                key: "server.compat_bucket",
                message: format!("{:?} is not a valid bucket ID", self.server.compat_bucket),
            });
        }
        if self.storage.max_producers_per_stream == 0 {
            return Err(ConfigError::Invalid {
                key: "storage.max_producers_per_stream",
                message: "must be at least 1".into(),
            });
        }
        if self.raft.wal.resume_available_size < self.raft.wal.min_available_size {
            return Err(ConfigError::Invalid {
                key: "raft.wal.resume_available_size",
                message: "must be at least raft.wal.min_available_size".into(),
            });
        }
        if let Some(cold) = &self.storage.cold {
            cold.validate()?;
            // A body that stays inline but is larger than the cap could never be taken,
            // however far flushing got. A cap of 0 stages every body.
            let largest_inline = self.largest_inline_body();
            if cold.max_hot_size_per_group != 0 && cold.max_hot_size_per_group < largest_inline {
                return Err(ConfigError::Invalid {
                    key: "storage.cold.max_hot_size_per_group",
                    message: format!(
                        "must be 0 (every body staged) or at least the largest body that is not staged ({largest_inline} bytes: server.max_append_size, or runtime.external_payload_min_size - 1)"
                    ),
                });
            }
        }
        match self.runtime.external_payload_min_size {
            Some(_) if self.storage.cold.is_none() => {
                return Err(ConfigError::Invalid {
                    key: "runtime.external_payload_min_size",
                    message: "needs storage.cold: bodies are staged in its object storage".into(),
                });
            }
            Some(0) => {
                return Err(ConfigError::Invalid {
                    key: "runtime.external_payload_min_size",
                    message: "must be at least 1".into(),
                });
            }
            _ => {}
        }
        if self.server.request_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                key: "server.request_timeout",
                message: "must be above zero".into(),
            });
        }
        if self.server.read_chunk_size == 0 {
            return Err(ConfigError::Invalid {
                key: "server.read_chunk_size",
                message: "must be at least 1".into(),
            });
        }
        if let Some(url) = &self.server.public_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(ConfigError::Invalid {
                key: "server.public_url",
                message: format!("{url:?} must start with http:// or https://"),
            });
        }
        self.subscriptions.validate(self.is_replicated())?;
        Ok(())
    }

    /// The largest create or append body that is not staged in object storage.
    pub fn largest_inline_body(&self) -> u64 {
        match self.runtime.external_payload_min_size {
            Some(min) => min.saturating_sub(1).min(self.server.max_append_size),
            None => self.server.max_append_size,
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_producers_per_stream: self.storage.max_producers_per_stream,
            producer_idle_ms: self.storage.producer_idle_timeout.as_millis() as u64,
        }
    }
}

#[cfg(test)]
mod tests;
