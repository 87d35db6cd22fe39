//! The cluster's credentials, kept in Secrets the cluster owns:
//!
//! - `{cluster}-admin-token`: the bearer token the voters' admin routes ask for (drain,
//!   purge), which the operator sends. Made once; replace its `token` to rotate it (the voters
//!   read it from its file on every call).
//! - `{cluster}-signing-key`: the Ed25519 key every voter signs subscription webhooks and
//!   wake tokens with (its public half is the voters' `__ds/jwks.json`). Made once.
//! - `{cluster}-ca`: the cluster's CA, certificate and key. Never mounted into a pod.
//! - `{cluster}-cluster-tls`: the CA's certificate and each voter's certificate and key, each
//!   naming its node ID (`ursula_wire::identity`). Issued again before they expire, and when
//!   the number of voters changes; the voters pick new files up without a restart.
//!
//! With `spec.tls.issuerRef` cert-manager issues the certificates instead (`cert_manager`),
//! and neither of the last two Secrets is made.
//!
//! What to issue is decided by the pure `reissue`; building the Secrets is pure too, given
//! the random material. The controller reads, decides and applies (`ensure`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use ursula_wire::issue::Authority;

use crate::crd::UrsulaCluster;
use crate::mounts::{
    CA_FILE, SIGNING_KEY, TOKEN_KEY, admin_token_secret, ca_secret, cert_file, key_file,
    signing_key_secret, tls_secret,
};
use crate::workloads::{NODE, meta};

/// How long a voter's certificate is valid, and how long before it expires it is renewed.
pub const CERT_LIFETIME: Duration = Duration::from_secs(90 * 86_400);
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 86_400);
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 86_400);

/// Annotations of the TLS Secret: when its first certificate expires, and for how many voters
/// it was issued.
pub const NOT_AFTER: &str = "ursula.io/not-after";
pub const ISSUED_FOR: &str = "ursula.io/voters";

/// Why the voters' certificates are issued (again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reissue {
    Missing,
    VotersChanged,
    Expiring,
    /// The annotations are not what the operator writes: issued again rather than trusted.
    Unreadable,
}

/// Whether the TLS Secret (as found) has to be issued again at `now`, for `voters` voters.
pub fn reissue(existing: Option<&Secret>, voters: u8, now: Timestamp) -> Option<Reissue> {
    let Some(secret) = existing else {
        return Some(Reissue::Missing);
    };
    let annotations = secret.metadata.annotations.clone().unwrap_or_default();
    let data = secret.data.clone().unwrap_or_default();
    let has_files = (0..voters)
        .all(|i| data.contains_key(&cert_file(i)) && data.contains_key(&key_file(i)))
        && data.contains_key(CA_FILE);
    let issued_for = annotations
        .get(ISSUED_FOR)
        .and_then(|v| v.parse::<u8>().ok());
    let not_after = annotations
        .get(NOT_AFTER)
        .and_then(|v| v.parse::<Timestamp>().ok());
    match (issued_for, not_after) {
        (Some(issued), _) if issued != voters => Some(Reissue::VotersChanged),
        (Some(_), Some(not_after)) if has_files => {
            let renew_at = not_after
                .checked_sub(k8s_openapi::jiff::SignedDuration::try_from(RENEW_BEFORE).ok()?)
                .ok()?;
            (now >= renew_at).then_some(Reissue::Expiring)
        }
        _ => Some(Reissue::Unreadable),
    }
}

fn secret(cluster: &UrsulaCluster, name: String, data: BTreeMap<String, ByteString>) -> Secret {
    Secret {
        metadata: meta(cluster, name, NODE),
        type_: Some("Opaque".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

fn bytes(text: &str) -> ByteString {
    ByteString(text.as_bytes().to_vec())
}

/// The admin token Secret holding `token`.
pub fn admin_token(cluster: &UrsulaCluster, token: &str) -> Secret {
    let data = BTreeMap::from([(TOKEN_KEY.to_owned(), bytes(token))]);
    secret(cluster, admin_token_secret(cluster), data)
}

/// The signing key Secret holding `pem`.
pub fn signing_key(cluster: &UrsulaCluster, pem: &str) -> Secret {
    let data = BTreeMap::from([(SIGNING_KEY.to_owned(), bytes(pem))]);
    secret(cluster, signing_key_secret(cluster), data)
}

/// The CA Secret of `authority`.
pub fn authority_secret(cluster: &UrsulaCluster, authority: &Authority) -> Secret {
    let data = BTreeMap::from([
        ("ca.crt".to_owned(), bytes(authority.cert_pem())),
        ("ca.key".to_owned(), bytes(authority.key_pem())),
    ]);
    secret(cluster, ca_secret(cluster), data)
}

/// The voters' TLS Secret: a certificate from `authority` for each voter, valid for
/// `CERT_LIFETIME`, with the pod's stable DNS name too.
pub fn voter_certificates(
    cluster: &UrsulaCluster,
    authority: &Authority,
) -> Result<Secret, ursula_wire::issue::Error> {
    let mut data = BTreeMap::from([(CA_FILE.to_owned(), bytes(authority.cert_pem()))]);
    let mut first_expiry = None;
    for ordinal in 0..crate::objects::voter_pods(cluster) {
        let host = crate::objects::voter_host(cluster, ordinal);
        let issued = authority.issue_node(u64::from(ordinal) + 1, &[host], CERT_LIFETIME)?;
        data.insert(cert_file(ordinal), bytes(&issued.cert_pem));
        data.insert(key_file(ordinal), bytes(&issued.key_pem));
        let expiry = issued.not_after.unix_timestamp();
        first_expiry = Some(first_expiry.map_or(expiry, |e: i64| e.min(expiry)));
    }
    let mut secret = secret(cluster, tls_secret(cluster), data);
    let not_after = first_expiry
        .and_then(|seconds| Timestamp::from_second(seconds).ok())
        .map(|t| t.to_string())
        .unwrap_or_default();
    secret.metadata.annotations = Some(BTreeMap::from([
        (NOT_AFTER.to_owned(), not_after),
        (
            ISSUED_FOR.to_owned(),
            crate::objects::voter_pods(cluster).to_string(),
        ),
    ]));
    Ok(secret)
}

/// 256 random bits, in hex.
fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot make the cluster's credentials: {0}")]
    Issue(String),
    #[error("Secret {0} is not as the operator wrote it: {1}")]
    Damaged(String, String),
    #[error(
        "spec.tls.issuerRef needs cert-manager, and the Kubernetes API has no \
         certificates.cert-manager.io: install cert-manager, or leave spec.tls out for the \
         operator's own CA"
    )]
    CertManagerMissing,
}

fn text_of(secret: &Secret, key: &str) -> Result<String, CredentialsError> {
    let name = secret.name_any();
    let value = secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .ok_or_else(|| CredentialsError::Damaged(name.clone(), format!("no key {key}")))?;
    String::from_utf8(value.0.clone())
        .map(|text| text.trim().to_owned())
        .map_err(|_| CredentialsError::Damaged(name, format!("{key} is not UTF-8")))
}

/// Creates `secret` unless it exists; answers the one that is there either way.
async fn create_once(api: &Api<Secret>, secret: Secret) -> Result<Secret, CredentialsError> {
    let name = secret.name_any();
    match api.create(&PostParams::default(), &secret).await {
        Ok(created) => Ok(created),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(api.get(&name).await?),
        Err(error) => Err(error.into()),
    }
}

/// The admin token of `cluster`, as its Secret holds it (for a purge: the cluster's own
/// reconciler makes the Secret).
pub async fn admin_token_of(
    client: &kube::Client,
    ns: &str,
    cluster: &UrsulaCluster,
) -> Result<String, CredentialsError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    text_of(&api.get(&admin_token_secret(cluster)).await?, TOKEN_KEY)
}

/// Makes sure the cluster's Secrets exist and, unless cert-manager issues them, that its
/// certificates are fresh; answers the admin token, which the operator sends on drains and
/// purges.
pub async fn ensure(
    client: &kube::Client,
    ns: &str,
    cluster: &UrsulaCluster,
) -> Result<String, CredentialsError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let token = match api.get_opt(&admin_token_secret(cluster)).await? {
        Some(existing) => existing,
        None => {
            let token = random_token().map_err(|e| CredentialsError::Issue(e.to_string()))?;
            create_once(&api, admin_token(cluster, &token)).await?
        }
    };
    let admin_token = text_of(&token, TOKEN_KEY)?;
    if api.get_opt(&signing_key_secret(cluster)).await?.is_none() {
        let pem = ursula_wire::issue::signing_key_pem()
            .map_err(|e| CredentialsError::Issue(e.to_string()))?;
        create_once(&api, signing_key(cluster, &pem)).await?;
    }
    if cluster.spec.tls.is_none() {
        ensure_own_ca(client, &api, ns, cluster).await?;
    }
    Ok(admin_token)
}

/// The operator's own CA and the voters' certificates it issues.
async fn ensure_own_ca(
    client: &kube::Client,
    api: &Api<Secret>,
    ns: &str,
    cluster: &UrsulaCluster,
) -> Result<(), CredentialsError> {
    let name = format!("{} cluster CA", cluster.name_any());
    let authority = match api.get_opt(&ca_secret(cluster)).await? {
        Some(existing) => existing,
        None => {
            let authority = Authority::new(&name, CA_LIFETIME)
                .map_err(|e| CredentialsError::Issue(e.to_string()))?;
            create_once(api, authority_secret(cluster, &authority)).await?
        }
    };
    let authority = Authority::from_pem(
        &name,
        &text_of(&authority, "ca.crt")?,
        &text_of(&authority, "ca.key")?,
    )
    .map_err(|e| CredentialsError::Damaged(ca_secret(cluster), e.to_string()))?;

    let existing = api.get_opt(&tls_secret(cluster)).await?;
    if let Some(why) = reissue(
        existing.as_ref(),
        crate::objects::voter_pods(cluster),
        Timestamp::now(),
    ) {
        tracing::info!(cluster = %cluster.name_any(), ?why, "issuing the voters' certificates");
        let secret = voter_certificates(cluster, &authority)
            .map_err(|e| CredentialsError::Issue(e.to_string()))?;
        crate::apply::apply(client, ns, &secret).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::tests::cluster;

    fn issued(voters: u8) -> Secret {
        let authority = Authority::new("test", CA_LIFETIME).unwrap();
        voter_certificates(&cluster(voters, 1), &authority).unwrap()
    }

    #[test]
    fn certificates_are_issued_when_missing_stale_or_for_other_voters() {
        let now = Timestamp::now();
        let secret = issued(3);
        let day = k8s_openapi::jiff::SignedDuration::from_hours(24);
        let mut unannotated = secret.clone();
        unannotated.metadata.annotations = None;
        let mut short = secret.clone();
        if let Some(data) = short.data.as_mut() {
            data.remove(&key_file(2));
        }
        for (existing, voters, at, expected) in [
            (None, 3, now, Some(Reissue::Missing)),
            (Some(&secret), 3, now, None),
            (Some(&secret), 3, now + day * 59, None),
            (Some(&secret), 3, now + day * 61, Some(Reissue::Expiring)),
            (Some(&secret), 5, now, Some(Reissue::VotersChanged)),
            (Some(&unannotated), 3, now, Some(Reissue::Unreadable)),
            (Some(&short), 3, now, Some(Reissue::Unreadable)),
        ] {
            assert_eq!(
                reissue(existing, voters, at),
                expected,
                "{voters} voters at {at}"
            );
        }
    }

    #[test]
    fn each_voter_gets_its_own_certificate_and_key() {
        let secret = issued(3);
        let data = secret.data.unwrap();
        let mut keys: Vec<&str> = data.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "ca.crt",
                "node-1.crt",
                "node-1.key",
                "node-2.crt",
                "node-2.key",
                "node-3.crt",
                "node-3.key"
            ]
        );
        assert_ne!(data["node-1.crt"], data["node-2.crt"]);
        assert!(
            !data.contains_key("ca.key"),
            "the CA's key is never mounted"
        );
        let annotations = secret.metadata.annotations.unwrap();
        assert_eq!(annotations[ISSUED_FOR], "3");
        let not_after: Timestamp = annotations[NOT_AFTER].parse().unwrap();
        assert!(not_after > Timestamp::now());
    }

    #[test]
    fn tokens_are_random_hex() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
