//! Access control and tenant limits, checked before anything is forwarded. Off unless
//! `access_keys_file` is set.
//!
//! The keys file (TOML) maps bearer tokens to principals, their tenant and the buckets they may
//! read or write (`"*"` for all), and sets each tenant's limits:
//!
//! ```toml
//! [[keys]]
//! token = "s3cret"
//! principal = "alice"
//! tenant = "acme"
//! read = ["*"]
//! write = ["demo"]
//!
//! [[tenants]]
//! name = "acme"
//! requests_per_second = 100.0   # sustained, with a burst of `request_burst`
//! request_burst = 200
//! write_bytes_per_second = 1048576.0
//! write_byte_burst = 4194304
//! write_byte_quota = 1073741824  # total write bytes through this gateway; 402 once spent
//! ```
//!
//! Instead of (or beside) static keys, `[[jwt_keys]]` (`kid`, `secret`) accept HS256 JWTs
//! whose claims carry `sub`, `tenant`, `read`, `write`, `exp` and `nbf`.
//!
//! Refusals: 401 without a valid token, 403 for a bucket the principal may not use, 429 over a
//! rate, 402 once the quota is spent. Nothing is forwarded for any of them. Limits are kept
//! per gateway process; with several gateways each enforces them separately.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use parking_lot::Mutex;
use serde::Deserialize;
use ursula_wire::ErrorToken;

use crate::jwt::{self, JwtKey};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    keys: Vec<Key>,
    #[serde(default)]
    tenants: Vec<TenantLimits>,
    #[serde(default)]
    jwt_keys: Vec<JwtKey>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Key {
    token: String,
    principal: String,
    tenant: String,
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    write: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantLimits {
    name: String,
    requests_per_second: Option<f64>,
    request_burst: Option<f64>,
    write_bytes_per_second: Option<f64>,
    write_byte_burst: Option<f64>,
    write_byte_quota: Option<u64>,
}

/// Why a request was refused before forwarding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub token: ErrorToken,
    pub message: String,
}

fn denied(token: ErrorToken, message: impl Into<String>) -> Denied {
    Denied {
        token,
        message: message.into(),
    }
}

struct Bucket {
    rate: f64,
    burst: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: f64, burst: Option<f64>, now: Instant) -> Self {
        let burst = burst.unwrap_or(rate).max(1.0);
        Self {
            rate,
            burst,
            level: burst,
            at: now,
        }
    }

    fn take(&mut self, amount: f64, now: Instant) -> bool {
        let elapsed = now.duration_since(self.at).as_secs_f64();
        self.level = (self.level + elapsed * self.rate).min(self.burst);
        self.at = now;
        if self.level >= amount.min(self.burst) {
            self.level -= amount;
            true
        } else {
            false
        }
    }
}

#[derive(Default)]
struct TenantState {
    requests: Option<Bucket>,
    bytes: Option<Bucket>,
    written: u64,
}

pub struct Access {
    keys: HashMap<String, Key>,
    jwt_keys: Vec<JwtKey>,
    limits: HashMap<String, TenantLimits>,
    state: Mutex<HashMap<String, TenantState>>,
}

impl Access {
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let file: KeysFile = toml::from_str(text).map_err(|e| e.to_string())?;
        Ok(Self {
            keys: file
                .keys
                .into_iter()
                .map(|k| (k.token.clone(), k))
                .collect(),
            jwt_keys: file.jwt_keys,
            limits: file
                .tenants
                .into_iter()
                .map(|t| (t.name.clone(), t))
                .collect(),
            state: Mutex::new(HashMap::new()),
        })
    }

    /// Whether the `Authorization` header names a known key or carries a valid JWT (checked
    /// before reading a body).
    pub fn authenticated(&self, authorization: Option<&str>) -> bool {
        self.identify(authorization).is_ok()
    }

    /// The key a bearer token names: a static key, else a JWT signed by one of `jwt_keys`.
    fn identify(&self, authorization: Option<&str>) -> Result<Key, Denied> {
        let token = authorization
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or_else(|| denied(ErrorToken::Unauthenticated, "a bearer token is required"))?;
        if let Some(key) = self.keys.get(token) {
            return Ok(key.clone());
        }
        if self.jwt_keys.is_empty() {
            return Err(denied(
                ErrorToken::Unauthenticated,
                "the bearer token is not known",
            ));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let claims = jwt::verify(token, &self.jwt_keys, now)
            .map_err(|reason| denied(ErrorToken::Unauthenticated, reason))?;
        Ok(Key {
            token: String::new(),
            principal: claims.sub,
            tenant: claims.tenant,
            read: claims.read,
            write: claims.write,
        })
    }

    /// Checks a request: its `Authorization` header, the bucket it addresses, and whether it
    /// is a write of `write_bytes` bytes.
    pub fn check(
        &self,
        authorization: Option<&str>,
        bucket: Option<&str>,
        write: bool,
        write_bytes: u64,
        now: Instant,
    ) -> Result<(), Denied> {
        let key = self.identify(authorization)?;
        if let Some(bucket) = bucket {
            let allowed = if write { &key.write } else { &key.read };
            if !allowed.iter().any(|b| b == "*" || b == bucket) {
                let verb = if write { "write" } else { "read" };
                return Err(denied(
                    ErrorToken::Forbidden,
                    format!("{} may not {verb} bucket {bucket}", key.principal),
                ));
            }
        }
        let Some(limits) = self.limits.get(&key.tenant) else {
            return Ok(());
        };
        let mut state = self.state.lock();
        let tenant = state.entry(key.tenant.clone()).or_default();
        if let Some(quota) = limits.write_byte_quota
            && write
            && tenant.written + write_bytes > quota
        {
            return Err(denied(
                ErrorToken::QuotaExhausted,
                format!(
                    "tenant {} has used its write quota of {quota} bytes",
                    key.tenant
                ),
            ));
        }
        if let Some(rate) = limits.requests_per_second {
            let bucket = tenant
                .requests
                .get_or_insert_with(|| Bucket::new(rate, limits.request_burst, now));
            if !bucket.take(1.0, now) {
                return Err(denied(
                    ErrorToken::RateLimited,
                    format!("tenant {} is over {rate} requests per second", key.tenant),
                ));
            }
        }
        if let Some(rate) = limits.write_bytes_per_second
            && write
        {
            let bucket = tenant
                .bytes
                .get_or_insert_with(|| Bucket::new(rate, limits.write_byte_burst, now));
            if !bucket.take(write_bytes as f64, now) {
                return Err(denied(
                    ErrorToken::RateLimited,
                    format!(
                        "tenant {} is over {rate} write bytes per second",
                        key.tenant
                    ),
                ));
            }
        }
        if write {
            tenant.written += write_bytes;
        }
        Ok(())
    }
}

/// The bucket a path addresses: `/{bucket}/...`, or the compat bucket for `/v1/stream/...`.
pub fn bucket_of<'a>(path: &'a str, compat_bucket: &'a str) -> Option<&'a str> {
    if path.starts_with("/v1/stream/") {
        return Some(compat_bucket);
    }
    path.trim_start_matches('/')
        .split('/')
        .next()
        .filter(|b| !b.is_empty())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const KEYS: &str = r#"
        [[keys]]
        token = "alice-token"
        principal = "alice"
        tenant = "acme"
        read = ["*"]
        write = ["demo"]

        [[keys]]
        token = "bob-token"
        principal = "bob"
        tenant = "small"
        read = ["demo"]

        [[tenants]]
        name = "small"
        requests_per_second = 2.0
        request_burst = 2

        [[tenants]]
        name = "acme"
        write_bytes_per_second = 100.0
        write_byte_burst = 100
        write_byte_quota = 250
    "#;

    fn token(result: Result<(), Denied>) -> Option<ErrorToken> {
        result.err().map(|d| d.token)
    }

    #[test]
    fn tokens_buckets_rates_and_quotas() {
        let access = Access::parse(KEYS).unwrap();
        let t0 = Instant::now();
        let alice = Some("Bearer alice-token");
        let bob = Some("Bearer bob-token");
        assert_eq!(
            token(access.check(None, Some("demo"), false, 0, t0)),
            Some(ErrorToken::Unauthenticated)
        );
        assert_eq!(
            token(access.check(Some("Bearer nope"), Some("demo"), false, 0, t0)),
            Some(ErrorToken::Unauthenticated)
        );
        assert_eq!(
            token(access.check(alice, Some("other"), false, 0, t0)),
            None
        );
        assert_eq!(
            token(access.check(alice, Some("other"), true, 1, t0)),
            Some(ErrorToken::Forbidden)
        );
        assert_eq!(
            token(access.check(bob, Some("demo"), true, 1, t0)),
            Some(ErrorToken::Forbidden)
        );
        // Request rate: a burst of 2, then 2 per second.
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(token(access.check(bob, Some("demo"), false, 0, t1)), None);
        assert_eq!(token(access.check(bob, Some("demo"), false, 0, t1)), None);
        assert_eq!(
            token(access.check(bob, Some("demo"), false, 0, t1)),
            Some(ErrorToken::RateLimited)
        );
        assert_eq!(
            token(access.check(bob, Some("demo"), false, 0, t1 + Duration::from_millis(600))),
            None
        );
        // Byte rate: 100 B/s, burst 100; quota 250 bytes in all.
        assert_eq!(
            token(access.check(alice, Some("demo"), true, 100, t0)),
            None
        );
        assert_eq!(
            token(access.check(alice, Some("demo"), true, 50, t0)),
            Some(ErrorToken::RateLimited)
        );
        assert_eq!(
            token(access.check(alice, Some("demo"), true, 100, t0 + Duration::from_secs(1))),
            None
        );
        assert_eq!(
            token(access.check(alice, Some("demo"), true, 100, t0 + Duration::from_secs(2))),
            Some(ErrorToken::QuotaExhausted)
        );
    }

    #[test]
    fn jwts_signed_by_local_keys_are_accepted() {
        let access = Access::parse(
            "[[jwt_keys]]\nkid = \"k1\"\nsecret = \"shh\"\n[[tenants]]\nname = \"acme\"\nwrite_byte_quota = 5\n",
        )
        .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let claims = serde_json::json!({"sub": "svc", "tenant": "acme", "read": ["demo"], "write": ["demo"], "exp": now + 60});
        let good = format!("Bearer {}", jwt::sign(&claims, "shh", Some("k1")));
        let forged = format!("Bearer {}", jwt::sign(&claims, "nope", Some("k1")));
        let t0 = Instant::now();
        assert_eq!(
            token(access.check(Some(&good), Some("demo"), true, 5, t0)),
            None
        );
        assert_eq!(
            token(access.check(Some(&good), Some("demo"), true, 1, t0)),
            Some(ErrorToken::QuotaExhausted)
        );
        assert_eq!(
            token(access.check(Some(&good), Some("other"), false, 0, t0)),
            Some(ErrorToken::Forbidden)
        );
        assert_eq!(
            token(access.check(Some(&forged), Some("demo"), false, 0, t0)),
            Some(ErrorToken::Unauthenticated)
        );
        let expired =
            serde_json::json!({"sub": "svc", "tenant": "acme", "read": ["*"], "exp": now - 1});
        let expired = format!("Bearer {}", jwt::sign(&expired, "shh", None));
        assert_eq!(
            token(access.check(Some(&expired), Some("demo"), false, 0, t0)),
            Some(ErrorToken::Unauthenticated)
        );
    }

    #[test]
    fn buckets_of_paths() {
        assert_eq!(bucket_of("/demo/s", "default"), Some("demo"));
        assert_eq!(bucket_of("/demo", "default"), Some("demo"));
        assert_eq!(bucket_of("/v1/stream/a/b", "default"), Some("default"));
        assert_eq!(bucket_of("/", "default"), None);
    }
}
