//! Ursula gateway: one stable front door for a cluster. It forwards each request to a node's
//! client listener, follows Raft leader redirects itself under the redirect rule, passes a
//! node's `x-ursula-not-applied` marker on only when the rule allows, marks its own refusals,
//! and vouches for every answer with `x-ursula-not-applied-checked: 1`.
//!
//! It never imports the node: everything it knows of nodes is HTTP and `ursula-wire`.

pub mod access;
pub mod collapse;
pub mod config;
pub mod follow;
mod front;
pub mod jwt;
pub mod link;
pub mod metrics;
mod prepared;
pub mod proxy;
mod refusal;
pub mod tails;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use config::{Config, ConfigError};
use proxy::Gateway;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
}

pub struct Running {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub gateway: Arc<Gateway>,
    /// Dropped, the TLS files are no longer watched.
    _stop_watching: tokio::sync::watch::Sender<bool>,
}

pub async fn start(config: Config) -> Result<Running, StartError> {
    config.validate()?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| StartError::Listen(config.listen, e))?;
    let admin = TcpListener::bind(config.admin_listen)
        .await
        .map_err(|e| StartError::Listen(config.admin_listen, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| StartError::Listen(config.listen, e))?;
    let admin_addr = admin
        .local_addr()
        .map_err(|e| StartError::Listen(config.admin_listen, e))?;
    let access = match &config.access_keys_file {
        Some(path) => Some(access::Access::load(path).map_err(ConfigError::Invalid)?),
        None => None,
    };
    // `https://` upstreams are checked against `upstream_ca_file` (`validate` makes sure
    // there is one); without it no server is trusted, and none is reached over TLS.
    let upstream_tls = match &config.upstream_ca_file {
        Some(ca) => ursula_tls::client_trusting(ca, &[]),
        None => ursula_tls::client_trusting_none(),
    }
    .map_err(ConfigError::Invalid)?;
    let (stop_watching, watching) = tokio::sync::watch::channel(false);
    let client_tls = match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(cert_file), Some(key_file)) => {
            let files = ursula_tls::Tls::load(ursula_tls::TlsFiles {
                ca_file: None,
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
            })
            .map_err(ConfigError::Invalid)?;
            let server = files
                .server_config(&[b"h2", b"http/1.1"])
                .map_err(ConfigError::Invalid)?;
            tokio::spawn(files.watch(TLS_RELOAD_INTERVAL, watching));
            Some(tokio_rustls::TlsAcceptor::from(server))
        }
        _ => None,
    };
    let gateway = Arc::new(Gateway::new(config, access, Arc::new(upstream_tls)));
    tokio::spawn(serve(listener, client_tls, front::client(gateway.clone())));
    tokio::spawn(serve(admin, None, front::admin(gateway.clone())));
    Ok(Running {
        addr,
        admin_addr,
        gateway,
        _stop_watching: stop_watching,
    })
}

/// How often the client listener's certificate files are read again.
const TLS_RELOAD_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a client may take over its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn serve<S>(listener: TcpListener, tls: Option<tokio_rustls::TlsAcceptor>, service: S)
where
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<axum::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let service = TowerToHyperService::new(service);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let served = match tls {
                None => {
                    auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                }
                Some(tls) => {
                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            auto::Builder::new(TokioExecutor::new())
                                .serve_connection(TokioIo::new(stream), service)
                                .await
                        }
                        Ok(Err(error)) => Err(error.into()),
                        Err(_) => Err("the TLS handshake timed out".into()),
                    }
                }
            };
            if let Err(error) = served {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
}
