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
    let gateway = Arc::new(Gateway::new(config, access));
    tokio::spawn(serve(listener, front::client(gateway.clone())));
    tokio::spawn(serve(admin, front::admin(gateway.clone())));
    Ok(Running {
        addr,
        admin_addr,
        gateway,
    })
}

async fn serve<S>(listener: TcpListener, service: S)
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
        tokio::spawn(async move {
            if let Err(error) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
}
