//! How voters reach each other and prove who they are. With `server.cluster_tls` every cluster
//! connection is mutual TLS: both ends present a certificate from the cluster's CA, a
//! connecting voter accepts only the certificate of the node it meant to reach, and the
//! listener keeps the certificate of the voter that connected (`PeerIdentity`) to check the
//! sender each message claims. ALPN tells a peer link (`LINK_ALPN`) from HTTP/2 (`h2`).
//! Without it the cluster port speaks plain TCP, and the link's magic tells them apart.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::types::NodeId;
use ursula_tls::{Tls, TlsFiles};

/// The ALPN protocol of a peer link (`peer_link`, `frame`).
pub const LINK_ALPN: &[u8] = b"ursula-link/1";
const H2_ALPN: &[u8] = b"h2";
/// The header that names the voter an HTTP call comes from (a forwarded purge's sender).
pub const FROM_HEADER: &str = "x-ursula-node";

/// How long a connection attempt to a peer may take, TLS handshake included.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an accepted connection may take to finish its handshake: a peer that opens one
/// and sends nothing, or half a ClientHello, does not hold a task for longer.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);

/// A cluster connection's byte stream: TCP, or TLS over it.
pub trait Wire: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Wire for T {}

/// The mutual TLS of the cluster listener and of the connections to peers.
pub struct ClusterTls {
    tls: Arc<Tls>,
    acceptor: TlsAcceptor,
    link: TlsConnector,
    http: rustls::ClientConfig,
}

impl ClusterTls {
    /// Loads `files` and checks that the certificate names `this_node` and chains to the CA.
    pub fn open(files: TlsFiles, this_node: NodeId) -> Result<Arc<Self>, String> {
        let tls = Tls::load(files)?;
        tls.check_own_name(&ursula_wire::identity::node_name(this_node))?;
        let acceptor = TlsAcceptor::from(tls.server_config(&[LINK_ALPN, H2_ALPN])?);
        let link = TlsConnector::from(Arc::new(tls.client_config(&[LINK_ALPN])?));
        // hyper-rustls offers `h2` itself (`enable_http2`).
        let http = tls.client_config(&[])?;
        Ok(Arc::new(Self {
            tls,
            acceptor,
            link,
            http,
        }))
    }

    /// The files' material, to watch for rotations.
    pub fn files(&self) -> Arc<Tls> {
        self.tls.clone()
    }

    /// Counts rotations: a connection opened under an older one is opened again.
    pub fn generation(&self) -> u64 {
        self.tls.generation()
    }

    /// Opens a peer link's TLS to node `target`, refusing any certificate but its own.
    pub async fn connect_link(
        &self,
        stream: TcpStream,
        target: NodeId,
    ) -> std::io::Result<Box<dyn Wire>> {
        let name = server_name(target)?;
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, self.link.connect(name, stream))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        Ok(Box::new(stream))
    }

    /// Finishes an accepted connection's handshake: the stream, whether it is a peer link,
    /// and the certificate of the voter at the other end.
    pub async fn accept(
        &self,
        stream: TcpStream,
    ) -> std::io::Result<(Box<dyn Wire>, bool, Arc<PeerIdentity>)> {
        let stream = tokio::time::timeout(ACCEPT_TIMEOUT, self.acceptor.accept(stream))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        let (_, session) = stream.get_ref();
        let is_link = session.alpn_protocol() == Some(LINK_ALPN);
        let cert = session
            .peer_certificates()
            .and_then(|chain| chain.first())
            .cloned()
            .ok_or_else(|| std::io::Error::other("the peer presented no certificate"))?;
        Ok((Box::new(stream), is_link, Arc::new(PeerIdentity::new(cert))))
    }
}

fn server_name(target: NodeId) -> std::io::Result<ServerName<'static>> {
    ServerName::try_from(ursula_wire::identity::node_name(target))
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// The certificate a connected voter presented; it was verified against the CA in the
/// handshake. A message that claims to come from node N is taken only if the certificate
/// names node N.
pub struct PeerIdentity {
    cert: CertificateDer<'static>,
    /// The node ID last found in the certificate, plus one (0: none yet).
    confirmed: AtomicU64,
}

impl PeerIdentity {
    fn new(cert: CertificateDer<'static>) -> Self {
        Self {
            cert,
            confirmed: AtomicU64::new(0),
        }
    }

    /// Whether the certificate is node `id`'s.
    pub fn is(&self, id: NodeId) -> bool {
        if self.confirmed.load(Ordering::Relaxed) == id.wrapping_add(1) {
            return true;
        }
        let named = Tls::names(&self.cert, &ursula_wire::identity::node_name(id));
        if named {
            self.confirmed.store(id.wrapping_add(1), Ordering::Relaxed);
        }
        named
    }
}

pub type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The HTTP/2 client of snapshots and forwarded calls. With TLS it connects to `https://`
/// cluster URLs only, and accepts the certificate of the node that `node_at` says the URL's
/// `host:port` is.
pub fn http2_client(
    tls: Option<&ClusterTls>,
    node_at: impl Fn(&str) -> Option<NodeId> + Send + Sync + 'static,
) -> Result<HttpClient, String> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    connector.enforce_http(false);
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let https = match tls {
        Some(tls) => builder
            .with_tls_config(tls.http.clone())
            .https_only()
            .with_server_name_resolver(move |uri: &http::Uri| {
                let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
                match node_at(authority) {
                    Some(id) => server_name(id),
                    None => Err(std::io::Error::other(format!(
                        "{authority} is not a voter's cluster address"
                    ))),
                }
            })
            .enable_http2()
            .wrap_connector(connector),
        // Never used for TLS: cluster URLs are `http://` without `server.cluster_tls`.
        None => builder
            .with_tls_config(ursula_tls::client_trusting_none()?)
            .https_or_http()
            .enable_http2()
            .wrap_connector(connector),
    };
    Ok(Client::builder(TokioExecutor::new())
        .http2_only(true)
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(Some(Duration::from_secs(5)))
        .build(https))
}

/// `host:port` of a cluster URL; a URL without a scheme is taken as `host:port` already.
pub fn authority_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// What this voter's connections to its peers share: its ID, the mutual TLS, and the HTTP/2
/// client.
#[derive(Clone)]
pub struct Transport {
    pub this_node: NodeId,
    pub tls: Option<Arc<ClusterTls>>,
    pub http: HttpClient,
}

impl Transport {
    /// The transport of the voter `view` is of, with `server.cluster_tls` when it is set.
    pub fn open(
        view: &super::ClusterView,
        tls: Option<&crate::config::ClusterTlsConfig>,
    ) -> Result<Self, String> {
        let tls = tls
            .map(|tls| ClusterTls::open(tls.files(), view.node_id))
            .transpose()?;
        view.book.use_tls(tls.clone());
        let book = view.book.clone();
        let http = http2_client(tls.as_deref(), move |authority| book.node_at(authority))?;
        Ok(Self {
            this_node: view.node_id,
            tls,
            http,
        })
    }
}
