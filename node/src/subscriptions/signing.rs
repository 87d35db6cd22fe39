//! The node's Ed25519 key for subscriptions: it signs webhook requests
//! (`Webhook-Signature: t=<unix seconds>,kid=<key ID>,ed25519=<base64url signature of
//! "<t>.<raw body>">`) and its public half is served as a JWKS. The bearer tokens of wakes are
//! HMACs under a key derived from it (a tenth of a signature's cost; only voters check them),
//! so that any voter that leads the group later checks a token without a table of them.
//! Every voter of a cluster must hold the same key (the operator mounts one Secret); a single
//! node makes its own on first start.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::hmac;
use ring::signature::{Ed25519KeyPair, KeyPair};
use sha2::Digest;

use crate::machine::Subscription;
use crate::machine::subscription::WakeRef;

const PEM_LABEL: &str = "PRIVATE KEY";

pub struct SigningKey {
    pair: Ed25519KeyPair,
    kid: String,
    /// Derived from the private key: wake tokens.
    tokens: hmac::Key,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read the webhook signing key {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the webhook signing key {path} is not an Ed25519 PKCS#8 PEM key: {reason}")]
    Invalid { path: String, reason: String },
    #[error("cannot write the webhook signing key {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// A new key as a PKCS#8 PEM file's text (the shape `openssl genpkey -algorithm ed25519`
/// writes, and the operator's Secret holds).
pub fn generate_pem() -> Result<String, KeyError> {
    ursula_wire::issue::signing_key_pem().map_err(|e| KeyError::Invalid {
        path: "(new key)".into(),
        reason: e.to_string(),
    })
}

impl SigningKey {
    /// Reads the key at `path`; with `create`, a missing file is first written with a new key
    /// (readable by its owner alone).
    pub fn load(path: &Path, create: bool) -> Result<Self, KeyError> {
        let name = path.display().to_string();
        if create && !path.exists() {
            let pem = generate_pem()?;
            write_private(path, pem.as_bytes()).map_err(|source| KeyError::Write {
                path: name.clone(),
                source,
            })?;
        }
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Read {
            path: name.clone(),
            source,
        })?;
        Self::from_pem(&text).map_err(|reason| KeyError::Invalid { path: name, reason })
    }

    pub fn from_pem(text: &str) -> Result<Self, String> {
        let begin = format!("-----BEGIN {PEM_LABEL}-----");
        let end = format!("-----END {PEM_LABEL}-----");
        let start = text.find(&begin).ok_or("no PRIVATE KEY block")? + begin.len();
        let stop = text[start..]
            .find(&end)
            .ok_or("the PRIVATE KEY block does not end")?
            + start;
        let body: String = text[start..stop].split_whitespace().collect();
        let der = STANDARD.decode(body).map_err(|e| e.to_string())?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| e.to_string())?;
        let digest = sha2::Sha256::digest(pair.public_key().as_ref());
        let kid = format!("ds_{}", &URL_SAFE_NO_PAD.encode(digest)[..16]);
        let mut derived = sha2::Sha256::new();
        derived.update(b"ursula wake tokens\n");
        derived.update(&der);
        let tokens = hmac::Key::new(hmac::HMAC_SHA256, &derived.finalize());
        Ok(Self { pair, kid, tokens })
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key as the JWKS that `__ds/jwks.json` serves.
    pub fn jwks(&self) -> serde_json::Value {
        serde_json::json!({
            "keys": [{
                "kty": "OKP",
                "crv": "Ed25519",
                "alg": "EdDSA",
                "use": "sig",
                "kid": self.kid,
                "x": URL_SAFE_NO_PAD.encode(self.pair.public_key().as_ref()),
            }]
        })
    }

    /// The `Webhook-Signature` header of a request with this body, sent at `unix_secs`.
    pub fn webhook_signature(&self, unix_secs: u64, body: &[u8]) -> String {
        let mut signed = format!("{unix_secs}.").into_bytes();
        signed.extend_from_slice(body);
        let signature = URL_SAFE_NO_PAD.encode(self.pair.sign(&signed).as_ref());
        format!("t={unix_secs},kid={},ed25519={signature}", self.kid)
    }

    /// The bearer token of one wake of one incarnation of a subscription.
    pub fn wake_token(&self, sub: &Subscription, wake: &WakeRef) -> String {
        URL_SAFE_NO_PAD.encode(hmac::sign(&self.tokens, &token_claims(sub, wake)).as_ref())
    }

    /// Whether `token` is this key's token for that wake. A token of another wake, another
    /// subscription or a deleted and re-created one is not; a stale wake's own token is, and
    /// the state machine fences it.
    pub fn check_wake_token(&self, sub: &Subscription, wake: &WakeRef, token: &str) -> bool {
        let Ok(tag) = URL_SAFE_NO_PAD.decode(token) else {
            return false;
        };
        hmac::verify(&self.tokens, &token_claims(sub, wake), &tag).is_ok()
    }
}

fn token_claims(sub: &Subscription, wake: &WakeRef) -> Vec<u8> {
    format!(
        "ursula-wake-token\n{}\n{}\n{}\n{}\n{}",
        sub.bucket, sub.id, sub.created_ms, wake.wake_id, wake.generation
    )
    .into_bytes()
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_round_trips_signs_and_checks_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/signing.pem");
        let key = SigningKey::load(&path, true).unwrap();
        let again = SigningKey::load(&path, false).unwrap();
        assert_eq!(key.kid(), again.kid());
        assert!(key.kid().starts_with("ds_"));
        assert_eq!(key.jwks()["keys"][0]["kid"], key.kid());

        let header = key.webhook_signature(1_700_000_000, b"{}");
        assert!(header.starts_with(&format!("t=1700000000,kid={},ed25519=", key.kid())));

        let sub: Subscription = Subscription {
            bucket: "b".into(),
            id: "s".into(),
            spec: crate::machine::SubscriptionSpec {
                delivery: crate::machine::subscription::Delivery::Webhook {
                    url: "https://x".into(),
                },
                pattern: None,
                streams: vec![],
                lease_ttl_ms: 1000,
                description: None,
            },
            root: String::new(),
            links: Default::default(),
            generation: 1,
            wake: None,
            created_ms: 5,
        };
        let wake = WakeRef {
            wake_id: "5-1".into(),
            generation: 1,
        };
        let token = key.wake_token(&sub, &wake);
        assert!(again.check_wake_token(&sub, &wake, &token));
        let other_wake = WakeRef {
            generation: 2,
            ..wake.clone()
        };
        assert!(!key.check_wake_token(&sub, &other_wake, &token));
        let recreated = Subscription {
            created_ms: 6,
            ..sub.clone()
        };
        assert!(!key.check_wake_token(&recreated, &wake, &token));
        assert!(!key.check_wake_token(&sub, &wake, "not a token"));
        // Another node's key is another key.
        let stranger = SigningKey::from_pem(&generate_pem().unwrap()).unwrap();
        assert!(!stranger.check_wake_token(&sub, &wake, &token));
        assert!(SigningKey::from_pem("nonsense").is_err());
    }
}
