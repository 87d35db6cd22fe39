//! The client listener: routes, handlers, and the mapping of every error to a JSON response.

pub mod error;
mod extract;
mod handlers;
mod layers;
mod link;
pub mod marking;
pub mod request;
pub mod response;
pub mod route;
mod routes;
mod sse;

use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use ursula_wire::ErrorToken;

use crate::admission::Admission;
use crate::config::Config;
use crate::engine::{Engine, Leadership};
use crate::groups::Groups;
use crate::shutdown::until_stopping;
use error::ApiError;
pub use layers::add_common_headers;
use marking::Stage;
use route::Target;

pub struct App {
    pub groups: Arc<Groups>,
    pub config: Arc<Config>,
    pub admission: Arc<Admission>,
    pub subscriptions: Arc<crate::subscriptions::Subscriptions>,
    /// The way to the other voters' cluster listeners, on a voter.
    pub members: Option<Arc<crate::cluster::membership::Members>>,
    /// Turns true when the node shuts down: live reads end.
    pub stopping: watch::Receiver<bool>,
    /// The node's counters (every group shares them); none on a node that hosts no group.
    pub metrics: Option<Arc<crate::engine::Metrics>>,
    /// Gateway links still open; the listener's shutdown waits for them.
    links: link::Links,
}

impl App {
    pub fn new(
        groups: Arc<Groups>,
        config: Arc<Config>,
        admission: Arc<Admission>,
        subscriptions: Arc<crate::subscriptions::Subscriptions>,
        members: Option<Arc<crate::cluster::membership::Members>>,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        let metrics = groups.all().next().map(|engine| engine.metrics.clone());
        Self {
            metrics,
            groups,
            config,
            admission,
            subscriptions,
            members,
            stopping,
            links: link::Links::default(),
        }
    }

    /// The engine of the group that holds `bucket`'s streams.
    pub fn engine(&self, bucket: &str) -> Result<&Arc<Engine>, ApiError> {
        self.groups.for_bucket(bucket).map_err(not_hosted)
    }

    /// The resource `path` names, refused unless this node hosts its group.
    fn target(&self, path: &str) -> Result<Target, ApiError> {
        let target = route::parse(path, &self.config.server.compat_bucket)?;
        self.engine(target.bucket())?;
        Ok(target)
    }

    /// Refuses a request for a group this node does not lead.
    fn require_leader(&self, bucket: &str) -> Result<(), ApiError> {
        match self.engine(bucket)?.leadership() {
            Leadership::Here => Ok(()),
            Leadership::Elsewhere(id) => Err(ApiError::not_leader(Some(id))),
            Leadership::Unknown => Err(ApiError::not_leader(None)),
        }
    }
}

pub(crate) fn not_hosted(not_hosted: crate::groups::NotHosted) -> ApiError {
    let message = format!(
        "this node does not host the stream's Raft group {}; voters {:?} do",
        not_hosted.group, not_hosted.voters
    );
    ApiError {
        leader: not_hosted.voters.first().copied(),
        ..ApiError::new(ErrorToken::GroupNotHosted, message).at(Stage::BeforeProposal)
    }
}

/// How long a client may take over its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Accepts connections until `stopping` turns true; each connection speaks HTTP/1.1 or
/// HTTP/2 (and may upgrade to a gateway link), over TLS with `tls`. Then waits for open
/// connections to finish their requests, and links their answers, up to the grace.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut stopping: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let service = TowerToHyperService::new(routes::service(app.clone()));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = until_stopping(&mut stopping) => break,
        };
        let (stream, _) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Some(tls) = &tls else {
            tokio::spawn(serve_connection(
                stream,
                service.clone(),
                graceful.watcher(),
            ));
            continue;
        };
        let (tls, service, watcher) = (tls.clone(), service.clone(), graceful.watcher());
        tokio::spawn(async move {
            match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                Ok(Ok(stream)) => serve_connection(stream, service, watcher).await,
                Ok(Err(error)) => tracing::debug!(%error, "a client's TLS handshake failed"),
                Err(_) => tracing::debug!("a client's TLS handshake timed out"),
            }
        });
    }
    drop(listener);
    let grace = app.config.server.shutdown_grace;
    let connections_done = async {
        graceful.shutdown().await;
        // Each link ends at the stop (see `link`).
        app.links.all_closed().await;
    };
    if tokio::time::timeout(grace, connections_done).await.is_err() {
        tracing::warn!("connections still open after the shutdown grace");
    }
}

/// One client connection, TCP or TLS, until it ends or the stop's grace runs out.
async fn serve_connection<I, S>(io: I, service: S, watcher: hyper_util::server::graceful::Watcher)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<axum::body::Body>,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Without half-close, hyper reads the socket while a request is being answered, to
    // notice a client that hung up; each such read takes a fresh 8 KiB buffer, since the
    // request's head still holds the last one: a large allocation per request (3% of the
    // appends/s). A client that hangs up is noticed when its answer is written instead; a
    // long-poll's wait is bounded by `server.long_poll_timeout`.
    builder.http1().half_close(true);
    let connection = builder
        .serve_connection_with_upgrades(TokioIo::new(io), service)
        .into_owned();
    if let Err(error) = watcher.watch(connection).await {
        tracing::debug!(%error, "connection ended with an error");
    }
}
