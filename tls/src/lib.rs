//! TLS material from files that may change on disk: a certificate chain and its key, and for
//! mutual TLS the CA that peers' certificates must chain to. Everything rustls asks for goes
//! through `Current`, which reads the material loaded last, so the configs built once at start
//! (`server_config`, `client_config`) pick up rotated files without being rebuilt. `watch`
//! polls the files and swaps in what they hold once it loads whole; a half-written rotation
//! (a new certificate, the old key) is kept out until the key follows.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use sha2::{Digest, Sha256};

/// Where the material is. Without `ca_file` it is a server's certificate only.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca_file: Option<PathBuf>,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// How peers' certificates are checked against the CA: a server's, and a client's.
struct Peers {
    server: Arc<WebPkiServerVerifier>,
    client: Arc<dyn ClientCertVerifier>,
}

/// What one reading of the files gave.
struct Material {
    certified: Arc<CertifiedKey>,
    /// With a CA: how a peer's certificate is checked, in each direction.
    peers: Option<Arc<Peers>>,
    /// A digest of the files' contents, to tell a rotation from an unchanged poll.
    digest: [u8; 32],
}

/// TLS material that follows its files.
pub struct Tls {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    material: RwLock<Arc<Material>>,
    /// Counts rotations, so that connections opened before one can be told apart.
    generation: AtomicU64,
}

/// The rustls side of `Tls`: resolves this process's certificate and verifies peers' with
/// the material loaded last.
#[derive(Debug)]
struct Current(Arc<Tls>);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

fn read(path: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

impl Tls {
    /// Loads the files once; an error names the file and what is wrong with it.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let material = load(&files, &provider)?;
        Ok(Arc::new(Self {
            files,
            provider,
            material: RwLock::new(Arc::new(material)),
            generation: AtomicU64::new(0),
        }))
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn current(&self) -> Arc<Material> {
        self.material.read().clone()
    }

    /// Reads the files again; swaps in what they hold when it differs and loads whole.
    /// Answers whether it rotated.
    pub fn reload(&self) -> Result<bool, String> {
        let digest = digest_of(&self.files)?;
        if digest == self.current().digest {
            return Ok(false);
        }
        let material = load(&self.files, &self.provider)?;
        *self.material.write() = Arc::new(material);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    /// Polls the files every `every` until `stopping` turns true (or its sender is gone).
    pub async fn watch(
        self: Arc<Self>,
        every: Duration,
        mut stopping: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut last_error = None;
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                _ = stopping.wait_for(|stop| *stop) => return,
            }
            match self.reload() {
                Ok(true) => {
                    last_error = None;
                    tracing::info!(cert = %self.files.cert_file.display(), "TLS files rotated");
                }
                Ok(false) => last_error = None,
                // Said once per distinct error: a rotation in progress fails alike every poll.
                Err(error) if last_error.as_ref() != Some(&error) => {
                    tracing::warn!(%error, "TLS files changed but do not load; keeping the ones loaded before");
                    last_error = Some(error);
                }
                Err(_) => {}
            }
        }
    }

    /// Whether `cert` (a peer's end-entity certificate, already verified) names `name`.
    pub fn names(cert: &CertificateDer<'_>, name: &str) -> bool {
        let Ok(name) = ServerName::try_from(name) else {
            return false;
        };
        webpki::EndEntityCert::try_from(cert)
            .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
    }

    /// Checks that this process's own certificate chains to the CA and names `name`: a
    /// misissued certificate fails at start, not at every peer's handshake.
    pub fn check_own_name(&self, name: &str) -> Result<(), String> {
        let material = self.current();
        let Some(peers) = &material.peers else {
            return Ok(());
        };
        let verifier = &peers.server;
        let server_name = ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?;
        let chain = &material.certified.cert;
        verifier
            .verify_server_cert(&chain[0], &chain[1..], &server_name, &[], UnixTime::now())
            .map(|_| ())
            .map_err(|e| {
                format!(
                    "{} is not a certificate for {name} from the CA in {}: {e}",
                    self.files.cert_file.display(),
                    self.files
                        .ca_file
                        .as_ref()
                        .map_or_else(String::new, |f| f.display().to_string())
                )
            })
    }

    /// A server config that presents the current certificate (and, with a CA, asks every
    /// client for one that chains to it), offering `alpn`.
    pub fn server_config(
        self: &Arc<Self>,
        alpn: &[&[u8]],
    ) -> Result<Arc<rustls::ServerConfig>, String> {
        let current = Arc::new(Current(self.clone()));
        let mutual = self.current().peers.is_some();
        let builder = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(versions(mutual))
            .map_err(|e| e.to_string())?;
        let builder = if mutual {
            builder.with_client_cert_verifier(current.clone())
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_cert_resolver(current);
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        if mutual {
            // A resumed session skips the certificates: after a rotation, a peer would be let
            // in on the trust of the files before it.
            config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
            config.send_tls13_tickets = 0;
        }
        Ok(Arc::new(config))
    }

    /// A client config for mutual TLS: it verifies the server against the CA and presents
    /// the current certificate, offering `alpn`. `None` without a CA.
    pub fn client_config(self: &Arc<Self>, alpn: &[&[u8]]) -> Result<rustls::ClientConfig, String> {
        if self.current().peers.is_none() {
            return Err(no_ca().to_string());
        }
        let current = Arc::new(Current(self.clone()));
        let mut config = rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(versions(true))
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(current.clone())
            .with_client_cert_resolver(current);
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        // Every connection is checked against the files as they are now (see `server_config`).
        config.resumption = rustls::client::Resumption::disabled();
        Ok(config)
    }
}

/// Mutual TLS is between voters of one release line: TLS 1.3 only. A server that clients
/// reach takes TLS 1.2 too.
fn versions(mutual: bool) -> &'static [&'static rustls::SupportedProtocolVersion] {
    const TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
    if mutual {
        TLS13_ONLY
    } else {
        rustls::ALL_VERSIONS
    }
}

fn digest_of(files: &TlsFiles) -> Result<[u8; 32], String> {
    let mut hasher = Sha256::new();
    for path in files
        .ca_file
        .iter()
        .chain([&files.cert_file, &files.key_file])
    {
        let bytes = read(path)?;
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    Ok(hasher.finalize().into())
}

fn load(files: &TlsFiles, provider: &Arc<CryptoProvider>) -> Result<Material, String> {
    let digest = digest_of(files)?;
    let chain = certificates(&files.cert_file)?;
    let key_bytes = read(&files.key_file)?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes)
        .map_err(|e| format!("{}: no private key ({e})", files.key_file.display()))?;
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(|e| {
        format!(
            "{} and {} do not go together: {e}",
            files.cert_file.display(),
            files.key_file.display()
        )
    })?;
    let peers = match &files.ca_file {
        None => None,
        Some(ca_file) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(ca_file)? {
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: not a CA certificate: {e}", ca_file.display()))?;
            }
            let roots = Arc::new(roots);
            let server =
                WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
                    .build()
                    .map_err(|e| format!("{}: {e}", ca_file.display()))?;
            let client = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| format!("{}: {e}", ca_file.display()))?;
            Some(Arc::new(Peers { server, client }))
        }
    };
    Ok(Material {
        certified: Arc::new(certified),
        peers,
        digest,
    })
}

fn certificates(path: &PathBuf) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

fn no_ca() -> rustls::Error {
    rustls::Error::General("no CA is configured to verify peers".into())
}

impl Current {
    fn peers(&self) -> Result<Arc<Peers>, rustls::Error> {
        self.0.current().peers.clone().ok_or_else(no_ca)
    }

    // A handshake signature is checked the same way in both directions, and without the CA.
    fn verify_tls12(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }
}

impl ResolvesServerCert for Current {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().certified.clone())
    }
}

impl ResolvesClientCert for Current {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().certified.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl ServerCertVerifier for Current {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.peers()?.server.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0
            .provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl ClientCertVerifier for Current {
    /// No hints: the CA can change under a config that lives on, and each voter has one
    /// certificate to present anyway.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.peers()?
            .client
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verify_tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0
            .provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A client config that trusts the CA certificates in `ca_file` (and presents none), for a
/// client of servers whose certificates that CA issued.
pub fn client_trusting(
    ca_file: &std::path::Path,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(&ca_file.to_path_buf())? {
        roots
            .add(cert)
            .map_err(|e| format!("{}: not a CA certificate: {e}", ca_file.display()))?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A client config that trusts no server: for a client that only ever speaks plain HTTP but
/// whose type has room for TLS.
pub fn client_trusting_none() -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth())
}
