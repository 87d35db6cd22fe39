//! Gateway configuration: `--config FILE` (TOML) with flags over it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// Health, readiness and metrics of the gateway itself.
    pub admin_listen: SocketAddr,
    /// The nodes' client listeners, e.g. `http://ursula-0.ursula-headless:4437`.
    pub upstreams: Vec<String>,
    /// Write bodies are buffered so they can be resent after a redirect; larger ones are
    /// refused with 413 `RequestBodyTooLarge`.
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub max_buffered_body_size: u64,
    /// The same for snapshot publishes (`PUT .../snapshot/{offset}`), which nodes take up to
    /// their `server.max_snapshot_size` (256 MiB), so the two limits agree.
    #[serde(deserialize_with = "ursula_wire::size::bytes")]
    pub max_buffered_snapshot_size: u64,
    /// Leader redirects followed in a row at most.
    pub max_redirect_hops: u32,
    /// No hop starts later than this after the first redirect.
    #[serde(deserialize_with = "duration")]
    pub redirect_window: Duration,
    /// How long connecting to an upstream may take.
    #[serde(deserialize_with = "duration")]
    pub connect_timeout: Duration,
    /// How long a request that is not a live read (long-poll, SSE) may wait for a node's
    /// answer, redirects included; then 503 `RequestTimeout`, never marked. Above the nodes'
    /// own `server.request_timeout` (5 s), so that their answer comes first; this one covers
    /// a node that answers nothing at all (frozen, or cut off after it took the request).
    #[serde(deserialize_with = "duration")]
    pub request_timeout: Duration,
    /// Turns on access control and tenant limits (format in `access.rs` and the README).
    pub access_keys_file: Option<std::path::PathBuf>,
    /// The nodes' `server.compat_bucket`: the bucket `/v1/stream/{name}` addresses.
    pub compat_bucket: String,
    /// Forward requests with a bounded answer over one multiplexed link per node (see
    /// `ursula_wire::link`) instead of one HTTP request per connection at a time. Nodes that
    /// do not offer the link are sent HTTP.
    pub upstream_link: bool,
    /// Clients following one stream with SSE from the same position share one subscription
    /// to the node, fanned out here (see `tails.rs`).
    pub shared_tails: bool,
    /// Identical long-polls in flight at once share one upstream request and its answer
    /// (see `collapse.rs`).
    pub collapse_long_polls: bool,
    /// TLS on the client listener: the certificate (chain) and key, PEM, picked up again
    /// when they change.
    pub tls_cert_file: Option<std::path::PathBuf>,
    pub tls_key_file: Option<std::path::PathBuf>,
    /// The CA that `https://` upstreams' certificates chain to.
    pub upstream_ca_file: Option<std::path::PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], ursula_wire::ports::CLIENT)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], ursula_wire::ports::ADMIN)),
            upstreams: Vec::new(),
            max_buffered_body_size: 64 * 1024 * 1024,
            max_buffered_snapshot_size: 256 * 1024 * 1024,
            max_redirect_hops: 3,
            redirect_window: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(15),
            access_keys_file: None,
            compat_bucket: "default".into(),
            upstream_link: true,
            shared_tails: true,
            collapse_long_polls: true,
            tls_cert_file: None,
            tls_key_file: None,
            upstream_ca_file: None,
        }
    }
}

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text).map_err(serde::de::Error::custom)
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {0}: {1}")]
    Read(String, std::io::Error),
    #[error("invalid config: {0}")]
    Invalid(String),
}

impl Config {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Read(path.display().to_string(), e))?;
        toml::from_str(&text).map_err(|e| ConfigError::Invalid(e.to_string()))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.upstreams.is_empty() {
            return Err(ConfigError::Invalid(
                "at least one upstream is needed (--upstream URL)".into(),
            ));
        }
        for upstream in &self.upstreams {
            let origin = crate::upstream::Origin::parse(upstream).ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "upstream {upstream:?} is not an http:// or https:// URL"
                ))
            })?;
            if origin.is_tls() && self.upstream_ca_file.is_none() {
                return Err(ConfigError::Invalid(format!(
                    "upstream {upstream:?} is https://: --upstream-ca names the CA its certificate chains to"
                )));
            }
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err(ConfigError::Invalid(
                "--tls-cert and --tls-key go together".into(),
            ));
        }
        Ok(())
    }
}
