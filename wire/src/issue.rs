//! Issuing a cluster's certificates (feature `issue`): a CA, a certificate for each voter that
//! names its node ID (`identity::node_name`), and server certificates for client TLS. The
//! operator keeps its CA in a Secret and issues from it again after a restart, so an authority
//! is rebuilt from its key and name alone: certificates issued before and after chain to the
//! same CA certificate.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::OffsetDateTime;

pub use rcgen::Error;

/// A certificate and its private key, PEM-encoded, and when the certificate expires.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_after: OffsetDateTime,
}

/// A certificate authority that can issue the cluster's certificates.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
}

fn authority_params(name: &str, not_after: OffsetDateTime) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished(name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = OffsetDateTime::now_utc() - Duration::from_secs(3600);
    params.not_after = not_after;
    params
}

fn distinguished(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "Ursula");
    name.push(DnType::CommonName, common_name);
    name
}

impl Authority {
    /// A new CA named `name`, valid for `valid_for` from now.
    pub fn new(name: &str, valid_for: Duration) -> Result<Self, Error> {
        let key = KeyPair::generate()?;
        let params = authority_params(name, OffsetDateTime::now_utc() + valid_for);
        let cert_pem = params.self_signed(&key)?.pem();
        let key_pem = key.serialize_pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_pem,
            key_pem,
        })
    }

    /// The CA that `Authority::new(name, ..)` made, from its certificate and key.
    pub fn from_pem(name: &str, cert_pem: &str, key_pem: &str) -> Result<Self, Error> {
        let key = KeyPair::from_pem(key_pem)?;
        // Only the name, key usages and key identifier of an issuer go into what it signs.
        let params = authority_params(name, OffsetDateTime::now_utc());
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A voter's certificate: it names node `id` and any `dns_names`, and serves as both the
    /// server and the client certificate of the cluster listener's mutual TLS.
    pub fn issue_node(
        &self,
        id: u64,
        dns_names: &[String],
        valid_for: Duration,
    ) -> Result<Issued, Error> {
        let mut names = vec![crate::identity::node_name(id)];
        names.extend(dns_names.iter().cloned());
        self.issue(
            &format!("ursula node {id}"),
            names,
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            valid_for,
        )
    }

    /// A server certificate for `dns_names` (names or IP addresses), for client TLS.
    pub fn issue_server(&self, dns_names: &[String], valid_for: Duration) -> Result<Issued, Error> {
        let common = dns_names.first().map_or("ursula", String::as_str);
        self.issue(
            common,
            dns_names.to_vec(),
            &[ExtendedKeyUsagePurpose::ServerAuth],
            valid_for,
        )
    }

    fn issue(
        &self,
        common_name: &str,
        names: Vec<String>,
        usages: &[ExtendedKeyUsagePurpose],
        valid_for: Duration,
    ) -> Result<Issued, Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params.distinguished_name = distinguished(common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = usages.to_vec();
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        // An hour of slack for clocks that run behind.
        params.not_before = now - Duration::from_secs(3600);
        params.not_after = now + valid_for;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_after: params.not_after,
        })
    }
}

/// A new Ed25519 key as PKCS#8 PEM: what every voter of a cluster signs subscription webhooks
/// and wake tokens with (`subscriptions.signing_key_file`).
pub fn signing_key_pem() -> Result<String, Error> {
    Ok(KeyPair::generate_for(&rcgen::PKCS_ED25519)?.serialize_pem())
}

/// A cluster's certificates as files in one directory: `ca.pem` (the CA's certificate),
/// `ca.key`, and for each voter `node-{id}.pem` and `node-{id}.key`. Keys are readable by
/// their owner only. The layout `dev-cluster`, `ursula-node certs` and the tests share.
pub struct ClusterFiles {
    pub dir: std::path::PathBuf,
}

impl ClusterFiles {
    pub fn ca_file(&self) -> std::path::PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn cert_file(&self, id: u64) -> std::path::PathBuf {
        self.dir.join(format!("node-{id}.pem"))
    }

    pub fn key_file(&self, id: u64) -> std::path::PathBuf {
        self.dir.join(format!("node-{id}.key"))
    }

    /// The `[server]` key that points a voter at its files.
    pub fn toml(&self, id: u64) -> String {
        format!(
            "cluster_tls = {{ ca_file = {:?}, cert_file = {:?}, key_file = {:?} }}\n",
            self.ca_file(),
            self.cert_file(id),
            self.key_file(id)
        )
    }

    /// Writes a new CA named `name` and a certificate for each of `ids` (which names
    /// `dns_names` too), valid for `valid_for`. Files already there are replaced.
    pub fn write(
        &self,
        name: &str,
        ids: &[u64],
        dns_names: &[String],
        valid_for: Duration,
    ) -> std::io::Result<Authority> {
        let authority = Authority::new(name, valid_for).map_err(std::io::Error::other)?;
        std::fs::create_dir_all(&self.dir)?;
        write_file(&self.ca_file(), authority.cert_pem(), 0o644)?;
        write_file(&self.dir.join("ca.key"), authority.key_pem(), 0o600)?;
        for &id in ids {
            self.write_node(&authority, id, dns_names, valid_for)?;
        }
        Ok(authority)
    }

    /// Issues node `id` a new certificate from `authority` and writes it (a rotation).
    pub fn write_node(
        &self,
        authority: &Authority,
        id: u64,
        dns_names: &[String],
        valid_for: Duration,
    ) -> std::io::Result<()> {
        let issued = authority
            .issue_node(id, dns_names, valid_for)
            .map_err(std::io::Error::other)?;
        write_file(&self.key_file(id), &issued.key_pem, 0o600)?;
        write_file(&self.cert_file(id), &issued.cert_pem, 0o644)
    }
}

/// Writes `text` whole under a temporary name and renames it into place, so that a reader
/// sees the old file or the new one, never half of it.
fn write_file(path: &std::path::Path, text: &str, mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let partial = path.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&partial)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn an_authority_rebuilt_from_its_pem_issues_to_the_same_name() {
        let first = Authority::new("demo", DAY).unwrap();
        let again = Authority::from_pem("demo", first.cert_pem(), first.key_pem()).unwrap();
        assert_eq!(again.cert_pem(), first.cert_pem());
        let node = again.issue_node(2, &["voter-1.demo".into()], DAY).unwrap();
        assert!(node.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(node.key_pem.contains("PRIVATE KEY"));
        assert!(node.not_after > OffsetDateTime::now_utc() + Duration::from_secs(3600));
    }

    #[test]
    fn a_key_that_is_not_pem_is_refused() {
        let first = Authority::new("demo", DAY).unwrap();
        assert!(Authority::from_pem("demo", first.cert_pem(), "not a key").is_err());
    }
}
