//! Write admission: checks that run before a write reaches the stream. Each refusal here
//! happens before anything is proposed (`http::marking` decides which carry the marker).
//!
//! - `WalDiskPressure` (503): free space on the log's filesystem fell below
//!   `raft.wal.min_available_size`, or could not be read; writes pass again once it is back to
//!   `raft.wal.resume_available_size`. Sampled with statvfs every
//!   `raft.wal.free_space_check_interval` (100 ms by default: at 1 GB/s of writes that is
//!   100 MB between samples, well inside the default 256 MiB margin).
//! - `RaftLogPressure` (503): log bytes not covered by a checkpoint exceed twice
//!   `raft.snapshot_log_budget`; writes with a body pass again below 1.5 times. Writes without
//!   a body always pass.
//! - `IngressBodyBytesLimitReached` (503): the write bodies in flight leave too little of
//!   `server.http_inflight_body_size` for this one.
//! - `RequestBodyTooLarge` (413): the body is over the route's limit.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ursula_wire::ErrorToken;

use crate::config::Config;

pub struct Admission {
    disk_refusing: AtomicBool,
    log_refusing: AtomicBool,
    /// Log bytes not yet covered by a checkpoint, kept by the writer.
    pub unsnapshotted_log_bytes: Arc<AtomicU64>,
    log_budget: u64,
    inflight: AtomicU64,
    inflight_limit: u64,
}

/// A write's share of the in-flight body budget, returned when dropped.
pub struct BodyPermit {
    admission: Arc<Admission>,
    bytes: u64,
}

impl BodyPermit {
    /// Takes `more` bytes for a body whose length was not known up front.
    pub fn grow(&mut self, more: u64) -> Result<(), Refused> {
        self.admission.reserve(more)?;
        self.bytes += more;
        Ok(())
    }
}

impl Drop for BodyPermit {
    fn drop(&mut self) {
        self.admission
            .inflight
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A write admission refused, before anything of it was read or proposed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    pub token: ErrorToken,
    pub message: String,
}

fn refused(token: ErrorToken, message: impl Into<String>) -> Refused {
    Refused {
        token,
        message: message.into(),
    }
}

/// A body over the route's limit: refused when its length is declared, or once it has grown
/// past the limit while being read.
pub fn too_large(limit: u64) -> Refused {
    refused(
        ErrorToken::RequestBodyTooLarge,
        format!("the request body is over this route's limit of {limit} bytes"),
    )
}

impl Admission {
    pub fn new(config: &Config, unsnapshotted_log_bytes: Arc<AtomicU64>) -> Arc<Self> {
        Arc::new(Self {
            disk_refusing: AtomicBool::new(false),
            log_refusing: AtomicBool::new(false),
            unsnapshotted_log_bytes,
            log_budget: config.raft.snapshot_log_budget,
            inflight: AtomicU64::new(0),
            inflight_limit: config.server.http_inflight_body_size,
        })
    }

    /// Admits a write whose body is `declared_len` bytes long (when known) and at most `limit`.
    pub fn admit(
        self: &Arc<Self>,
        has_body: bool,
        declared_len: Option<u64>,
        limit: u64,
    ) -> Result<BodyPermit, Refused> {
        if declared_len.is_some_and(|len| len > limit) {
            return Err(too_large(limit));
        }
        if self.disk_refusing.load(Ordering::Acquire) {
            return Err(refused(
                ErrorToken::WalDiskPressure,
                "the log's disk is nearly full; writes resume when space is freed",
            ));
        }
        if has_body && self.log_under_pressure() {
            return Err(refused(
                ErrorToken::RaftLogPressure,
                "the log is too far ahead of its last checkpoint; writes with a body resume shortly",
            ));
        }
        let bytes = declared_len.unwrap_or(0);
        self.reserve(bytes)?;
        Ok(BodyPermit {
            admission: self.clone(),
            bytes,
        })
    }

    fn reserve(&self, bytes: u64) -> Result<(), Refused> {
        let limit = self.inflight_limit;
        self.inflight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + bytes <= limit).then_some(held + bytes)
            })
            .map(|_| ())
            .map_err(|_| {
                refused(
                    ErrorToken::IngressBodyBytesLimitReached,
                    format!(
                        "write bodies in flight leave no room for {bytes} more bytes \
                         (server.http_inflight_body_size is {limit})"
                    ),
                )
            })
    }

    /// Over twice the budget starts refusing; under 1.5 times stops.
    fn log_under_pressure(&self) -> bool {
        let bytes = self.unsnapshotted_log_bytes.load(Ordering::Acquire);
        let refusing = self.log_refusing.load(Ordering::Acquire);
        let now = if refusing {
            bytes.saturating_mul(2) >= self.log_budget.saturating_mul(3)
        } else {
            bytes > self.log_budget.saturating_mul(2)
        };
        if now != refusing {
            self.log_refusing.store(now, Ordering::Release);
        }
        now
    }

    /// Samples free space on the log's filesystem until the runtime stops.
    pub async fn watch_disk(self: Arc<Self>, dir: PathBuf, config: crate::config::WalConfig) {
        let mut tick = tokio::time::interval(config.free_space_check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let refusing = self.disk_refusing.load(Ordering::Acquire);
            let now = match available_bytes(&dir) {
                Ok(free) if refusing => free < config.resume_available_size,
                Ok(free) => free < config.min_available_size,
                Err(error) => {
                    if !refusing {
                        tracing::error!(%error, "cannot read the log disk's free space; refusing writes");
                    }
                    true
                }
            };
            if now != refusing {
                tracing::warn!(refusing = now, "log disk pressure changed");
                self.disk_refusing.store(now, Ordering::Release);
            }
        }
    }

    /// Runs one free-space sample now (start-up, tests).
    pub fn sample_disk(&self, dir: &std::path::Path, min: u64) {
        let refusing = available_bytes(dir).map_or(true, |free| free < min);
        self.disk_refusing.store(refusing, Ordering::Release);
    }
}

/// Bytes available to unprivileged writers on the filesystem holding `dir`.
pub fn available_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `stat` a valid out-pointer.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(log_budget: u64, inflight: u64) -> Arc<Admission> {
        let mut config = Config::default();
        config.raft.snapshot_log_budget = log_budget;
        config.server.http_inflight_body_size = inflight;
        Admission::new(&config, Arc::new(AtomicU64::new(0)))
    }

    fn token(result: Result<BodyPermit, Refused>) -> Option<ErrorToken> {
        result.err().map(|e| e.token)
    }

    #[test]
    fn log_pressure_has_hysteresis_and_spares_bodiless_writes() {
        let a = admission(100, u64::MAX);
        let log = a.unsnapshotted_log_bytes.clone();
        for (bytes, body, refused) in [
            (200, true, false),
            (201, true, true),
            (201, false, false),
            (160, true, true),
            (150, true, true),
            (149, true, false),
            (190, true, false),
        ] {
            log.store(bytes, Ordering::Release);
            let expected = refused.then_some(ErrorToken::RaftLogPressure);
            assert_eq!(
                token(a.admit(body, Some(1), 10)),
                expected,
                "{bytes} bytes, body {body}"
            );
        }
    }

    #[test]
    fn inflight_bodies_share_a_budget() {
        let a = admission(u64::MAX, 100);
        let first = a.admit(true, Some(60), 1000).unwrap();
        assert_eq!(
            token(a.admit(true, Some(50), 1000)),
            Some(ErrorToken::IngressBodyBytesLimitReached)
        );
        let mut second = a.admit(true, Some(40), 1000).unwrap();
        assert!(second.grow(1).is_err());
        drop(first);
        second.grow(50).unwrap();
        assert_eq!(
            token(a.admit(true, Some(2000), 1000)),
            Some(ErrorToken::RequestBodyTooLarge)
        );
    }

    #[test]
    fn free_space_is_read() {
        let dir = tempfile::tempdir().unwrap();
        assert!(available_bytes(dir.path()).unwrap() > 0);
        assert!(available_bytes(&dir.path().join("missing")).is_err());
    }
}
