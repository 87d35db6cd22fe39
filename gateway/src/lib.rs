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
pub mod jwt;
pub mod link;
pub mod proxy;
pub mod tails;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
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
    let serving = gateway.clone();
    tokio::spawn(serve(listener, move |request| {
        serving.clone().handle(request)
    }));
    let watched = gateway.clone();
    tokio::spawn(serve(admin, move |request| {
        admin_route(watched.clone(), request)
    }));
    Ok(Running {
        addr,
        admin_addr,
        gateway,
    })
}

async fn serve<F, Fut>(listener: TcpListener, handler: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Response<proxy::Body>, std::convert::Infallible>>
        + Send
        + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = service_fn(handler);
            if let Err(error) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
}

async fn admin_route(
    gateway: Arc<Gateway>,
    request: Request<Incoming>,
) -> Result<Response<proxy::Body>, std::convert::Infallible> {
    let body = |text: String| {
        use http_body_util::BodyExt;
        http_body_util::Full::new(bytes::Bytes::from(text))
            .map_err(|never: std::convert::Infallible| match never {})
            .boxed_unsync()
    };
    let (status, text) = match request.uri().path() {
        "/healthz" | "/readyz" => (StatusCode::OK, r#"{"status":"ok"}"#.to_owned()),
        "/metrics" => {
            let m = &gateway.metrics;
            let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
            let (tails_open, tail_clients) = gateway.shared_tails();
            (
                StatusCode::OK,
                format!(
                    "# TYPE ursula_gateway_requests_total counter\nursula_gateway_requests_total {}\n\
                     # TYPE ursula_gateway_redirects_followed_total counter\nursula_gateway_redirects_followed_total {}\n\
                     # TYPE ursula_gateway_refusals_total counter\nursula_gateway_refusals_total {}\n\
                     # TYPE ursula_gateway_link_requests_total counter\nursula_gateway_link_requests_total {}\n\
                     # TYPE ursula_gateway_shared_tails_opened_total counter\nursula_gateway_shared_tails_opened_total {}\n\
                     # TYPE ursula_gateway_shared_tail_joins_total counter\nursula_gateway_shared_tail_joins_total {}\n\
                     # TYPE ursula_gateway_shared_tails_open gauge\nursula_gateway_shared_tails_open {tails_open}\n\
                     # TYPE ursula_gateway_shared_tail_clients gauge\nursula_gateway_shared_tail_clients {tail_clients}\n\
                     # TYPE ursula_gateway_collapsed_long_polls_total counter\nursula_gateway_collapsed_long_polls_total {}\n",
                    get(&m.requests),
                    get(&m.redirects_followed),
                    get(&m.refusals),
                    get(&m.link_requests),
                    get(&m.shared_tails_opened),
                    get(&m.shared_tail_joins),
                    get(&m.collapsed_long_polls)
                ),
            )
        }
        other => (
            StatusCode::NOT_FOUND,
            String::from_utf8_lossy(
                &ursula_wire::ErrorBody::new(
                    ursula_wire::ErrorToken::NotFound,
                    format!("no admin route {other:?}"),
                )
                .to_json(),
            )
            .into_owned(),
        ),
    };
    let mut response = Response::new(body(text));
    *response.status_mut() = status;
    Ok(response)
}
