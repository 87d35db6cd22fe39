//! JSON Web Tokens signed with HS256 by keys the gateway holds (`[[jwt_keys]]` in the keys
//! file). Claims: `sub` (principal), `tenant`, `read` and `write` (bucket IDs or `"*"`), and
//! the usual `exp` / `nbf` (seconds since the epoch).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtKey {
    /// Matched against the token's `kid` header when both are present.
    pub kid: Option<String>,
    /// The shared secret, as written.
    pub secret: String,
}

#[derive(Debug, Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub tenant: String,
    #[serde(default)]
    pub read: Vec<String>,
    #[serde(default)]
    pub write: Vec<String>,
    pub exp: Option<u64>,
    pub nbf: Option<u64>,
}

/// Verifies `token` against `keys` at `now` (seconds since the epoch).
pub fn verify(token: &str, keys: &[JwtKey], now: u64) -> Result<Claims, String> {
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not a JWT".into());
    };
    let decode = |part: &str| {
        URL_SAFE_NO_PAD
            .decode(part)
            .map_err(|_| "bad base64url".to_owned())
    };
    let parsed: Header =
        serde_json::from_slice(&decode(header)?).map_err(|e| format!("bad JWT header: {e}"))?;
    if parsed.alg != "HS256" {
        return Err(format!("algorithm {} is not accepted", parsed.alg));
    }
    let signature = decode(signature)?;
    let signed = &token[..header.len() + 1 + payload.len()];
    let valid = keys
        .iter()
        .filter(|key| match (&key.kid, &parsed.kid) {
            (Some(want), Some(got)) => want == got,
            _ => true,
        })
        .any(|key| {
            Hmac::<Sha256>::new_from_slice(key.secret.as_bytes())
                .map(|mut mac| {
                    mac.update(signed.as_bytes());
                    mac.verify_slice(&signature).is_ok()
                })
                .unwrap_or(false)
        });
    if !valid {
        return Err("the JWT signature does not verify".into());
    }
    let claims: Claims =
        serde_json::from_slice(&decode(payload)?).map_err(|e| format!("bad JWT claims: {e}"))?;
    if claims.exp.is_some_and(|exp| now >= exp) {
        return Err("the JWT has expired".into());
    }
    if claims.nbf.is_some_and(|nbf| now < nbf) {
        return Err("the JWT is not valid yet".into());
    }
    Ok(claims)
}

#[cfg(test)]
pub fn sign(claims: &serde_json::Value, secret: &str, kid: Option<&str>) -> String {
    let header = match kid {
        Some(kid) => serde_json::json!({"alg": "HS256", "typ": "JWT", "kid": kid}),
        None => serde_json::json!({"alg": "HS256", "typ": "JWT"}),
    };
    let head = URL_SAFE_NO_PAD.encode(header.to_string());
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key size");
    mac.update(format!("{head}.{body}").as_bytes());
    let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{head}.{body}.{signature}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Vec<JwtKey> {
        vec![JwtKey {
            kid: Some("k1".into()),
            secret: "top secret".into(),
        }]
    }

    #[test]
    fn verifies_signature_algorithm_and_times() {
        let claims = serde_json::json!({"sub": "alice", "tenant": "acme", "read": ["*"], "exp": 2000, "nbf": 1000});
        let token = sign(&claims, "top secret", Some("k1"));
        let verified = verify(&token, &keys(), 1500).unwrap();
        assert_eq!(verified.sub, "alice");
        assert_eq!(verified.read, vec!["*".to_owned()]);
        assert!(
            verify(&token, &keys(), 2000)
                .unwrap_err()
                .contains("expired")
        );
        assert!(
            verify(&token, &keys(), 999)
                .unwrap_err()
                .contains("not valid yet")
        );
        let forged = sign(&claims, "guess", Some("k1"));
        assert!(
            verify(&forged, &keys(), 1500)
                .unwrap_err()
                .contains("signature")
        );
        let other_kid = sign(&claims, "top secret", Some("k2"));
        assert!(verify(&other_kid, &keys(), 1500).is_err());
        let none_alg = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        assert!(
            verify(&none_alg, &keys(), 1500)
                .unwrap_err()
                .contains("not accepted")
        );
        assert!(verify("a.b", &keys(), 1500).is_err());
    }
}
