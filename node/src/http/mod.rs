//! The client listener: routes, handlers, and the mapping of every error to a JSON response.

pub mod error;
mod handlers;
mod link;
pub mod marking;
pub mod names;
pub mod request;
pub mod response;
pub mod route;
mod sse;

use std::convert::Infallible;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use ursula_wire::ErrorToken;

use crate::admission::Admission;
use crate::config::Config;
use crate::engine::{Engine, Leadership};
use crate::groups::Groups;
use error::ApiError;
use marking::LeaderCheck;
use request::RequestBody;
use response::{ALLOWED_HEADERS, ALLOWED_METHODS, Body, Reply, add_common_headers};
use route::Target;

pub struct App {
    pub groups: Arc<Groups>,
    pub config: Arc<Config>,
    pub admission: Arc<Admission>,
    /// Turns true when the node shuts down: live reads end.
    pub stopping: watch::Receiver<bool>,
    /// The node's counters (every group shares them); none on a node that hosts no group.
    pub metrics: Option<Arc<crate::engine::Metrics>>,
}

impl App {
    /// The engine of the group that holds `bucket`'s streams. `dispatch` refuses requests
    /// for groups this node does not host before any handler runs.
    pub fn engine(&self, bucket: &str) -> Result<&Arc<Engine>, ApiError> {
        self.groups.for_bucket(bucket).map_err(not_hosted)
    }

    /// Refuses a request for a group this node does not lead.
    fn require_leader(&self, bucket: &str) -> Result<(), ApiError> {
        match self.engine(bucket)?.leadership() {
            Leadership::Here => Ok(()),
            Leadership::Elsewhere(id) => Err(ApiError::not_leader(Some(id))),
            Leadership::Unknown => Err(ApiError::not_leader(None)),
        }
    }

    /// A `NotLeader` refusal that names a leader, or a `GroupNotHosted` one that names a voter
    /// of the group, becomes a redirect to that node: 307 to its client URL with the same path
    /// and query, naming it in `x-ursula-leader-id` (which gateways follow).
    fn redirect(&self, mut error: ApiError, uri: &http::Uri) -> ApiError {
        let (Some(leader), Some(cluster)) = (error.leader, &self.groups.cluster) else {
            return error;
        };
        let Some(base) = cluster.client_url(leader) else {
            return error;
        };
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        error.status = Some(StatusCode::TEMPORARY_REDIRECT);
        error
            .with_header("location", format!("{}{path}", base.trim_end_matches('/')))
            .with_header(ursula_wire::headers::LEADER_ID, leader.to_string())
    }
}

pub(crate) fn not_hosted(not_hosted: crate::groups::NotHosted) -> ApiError {
    let message = format!(
        "this node does not host the stream's Raft group {}; voters {:?} do",
        not_hosted.group, not_hosted.voters
    );
    ApiError {
        leader: not_hosted.voters.first().copied(),
        ..ApiError::new(ErrorToken::GroupNotHosted, message)
    }
}

/// Accepts connections until `stopping` turns true; each connection speaks HTTP/1.1 or
/// HTTP/2. Then waits for open connections to finish their requests, up to the grace.
pub async fn serve(listener: TcpListener, app: Arc<App>, mut stopping: watch::Receiver<bool>) {
    let graceful = GracefulShutdown::new();
    // Gateway links hold a clone until their last answer is written; shutdown waits for them.
    let (link_alive, mut links_done) = tokio::sync::mpsc::channel::<()>(1);
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
        let app_for_service = app.clone();
        let link_alive = link_alive.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let link = link::is_upgrade(&request).then(|| link_alive.clone());
            serve_request(app_for_service.clone(), request, link)
        });
        let connection = auto::Builder::new(TokioExecutor::new())
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    drop(link_alive);
    let grace = app.config.server.shutdown_grace;
    let connections_done = async {
        graceful.shutdown().await;
        // Each link ends at the stop (see `link`); `None` once the last one has.
        links_done.recv().await;
    };
    if tokio::time::timeout(grace, connections_done).await.is_err() {
        tracing::warn!("connections still open after the shutdown grace");
    }
}

/// Completes once the node starts shutting down; never, if the signal's sender is gone.
pub async fn until_stopping(stopping: &mut watch::Receiver<bool>) {
    if stopping.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The client listener's service: a request for the gateway link (which comes with the
/// listener's link tracker) is answered by `link`, any other by `handle`.
async fn serve_request(
    app: Arc<App>,
    request: Request<Incoming>,
    link: Option<tokio::sync::mpsc::Sender<()>>,
) -> Result<Response<Body>, Infallible> {
    match link {
        Some(alive) => Ok(link::accept(app, request, alive)),
        None => handle(app, request).await,
    }
}

/// Answers one request, whether it came over HTTP or the gateway link.
pub async fn handle(
    app: Arc<App>,
    request: Request<impl RequestBody>,
) -> Result<Response<Body>, Infallible> {
    let started = std::time::Instant::now();
    let cors = request.headers().contains_key(http::header::ORIGIN);
    let uri = request.uri().clone();
    let live = request.method() == Method::GET && ursula_wire::is_live_read(uri.query());
    let mut response = dispatch(&app, request).await.unwrap_or_else(|error| {
        if matches!(
            error.token,
            ErrorToken::NotLeader | ErrorToken::GroupNotHosted
        ) {
            app.redirect(error, &uri).into_response()
        } else {
            error.into_response()
        }
    });
    add_common_headers(response.headers_mut(), cors);
    if !live && let Some(metrics) = &app.metrics {
        metrics.request_seconds.observe(started.elapsed());
    }
    Ok(response)
}

async fn dispatch(
    app: &App,
    request: Request<impl RequestBody>,
) -> Result<Response<Body>, ApiError> {
    if request.method() == Method::OPTIONS {
        return Ok(Reply::new(StatusCode::NO_CONTENT)
            .header("access-control-allow-origin", "*")
            .header("access-control-allow-methods", ALLOWED_METHODS)
            .header("access-control-allow-headers", ALLOWED_HEADERS)
            .header("access-control-max-age", "86400")
            .build());
    }
    let method = request.method().clone();
    let is_write = matches!(method, Method::PUT | Method::POST | Method::DELETE);
    let target =
        route::parse(request.uri().path(), &app.config.server.compat_bucket).map_err(|e| {
            if is_write {
                e.marked_if_unproposed()
            } else {
                e
            }
        })?;
    // A group this node does not host: sent to a node that does. Creates, appends, closes
    // and deletes of streams are the refusals the spec marks.
    if let Err(error) = app.engine(target.bucket()) {
        return Err(if marking::not_hosted_is_marked(&target, is_write) {
            error.marked_if_unproposed()
        } else {
            error.unmarked()
        });
    }
    if is_write {
        return write(app, request, target).await;
    }
    // Reads go to the group's leader, which has applied every acknowledged write.
    app.require_leader(target.bucket())
        .map_err(ApiError::unmarked)?;
    match (target, method) {
        (Target::Stream(path), Method::GET) => handlers::read::handle(app, request, path).await,
        (Target::Stream(path), Method::HEAD) => handlers::meta::head(app, &path),
        (Target::Bootstrap(path), Method::GET) => handlers::snapshot::bootstrap(app, &path).await,
        (Target::Snapshot(path, offset), Method::GET) => {
            handlers::snapshot::read(app, &path, &offset).await
        }
        (target, method) => Err(method_not_allowed(&target, &method)),
    }
}

/// Writes pass admission, then their body is read within the in-flight budget, which they
/// hold until their answer is ready.
async fn write(
    app: &App,
    request: Request<impl RequestBody>,
    target: Target,
) -> Result<Response<Body>, ApiError> {
    let limit = match target {
        Target::Snapshot(..) => app.config.server.max_snapshot_size,
        _ => app.config.server.max_append_size,
    };
    let declared = request::content_length(request.headers())?;
    let has_body = declared.map_or_else(
        || {
            request
                .headers()
                .contains_key(http::header::TRANSFER_ENCODING)
        },
        |len| len > 0,
    );
    let mut permit = app.admission.admit(has_body, declared, limit)?;
    let (parts, body) = request.into_parts();
    let body = request::body(&parts.headers, body, limit, &mut permit)
        .await
        .map_err(ApiError::marked_if_unproposed)?;
    // Leadership is checked before anything is proposed (see `marking`), once the body is in:
    // a client still sending a large body to a node that answered early gets a broken pipe
    // instead of the redirect.
    let staged_create = parts.method == Method::PUT
        && matches!(target, Target::Stream(_))
        && app
            .engine(target.bucket())
            .is_ok_and(|engine| engine.stages(body.len() as u64));
    match marking::leader_check(&target, &parts.method, staged_create) {
        LeaderCheck::Marked => app
            .require_leader(target.bucket())
            .map_err(ApiError::marked_if_unproposed)?,
        LeaderCheck::Unmarked => app
            .require_leader(target.bucket())
            .map_err(ApiError::unmarked)?,
        LeaderCheck::Unchecked => {}
    }
    let method = parts.method.clone();
    let answer = match (target, method) {
        (Target::Bucket(bucket), Method::PUT) => handlers::bucket::create(app, bucket).await,
        (Target::Stream(path), Method::PUT) => {
            handlers::create::handle(app, parts, body, path).await
        }
        (Target::Stream(path), Method::POST) => {
            handlers::append::handle(app, parts, body, path).await
        }
        (Target::Stream(path), Method::DELETE) => handlers::meta::delete(app, path).await,
        (Target::Snapshot(path, offset), Method::PUT) => {
            handlers::snapshot::publish(app, parts, body, path, &offset).await
        }
        (Target::Retention(path, offset), Method::PUT) => {
            handlers::snapshot::retain(app, path, &offset).await
        }
        (target, method) => Err(method_not_allowed(&target, &method)),
    };
    drop(permit);
    // A write refused while its request was read applied nothing: say so.
    answer.map_err(ApiError::marked_if_unproposed)
}

fn method_not_allowed(target: &Target, method: &Method) -> ApiError {
    let allowed = match target {
        Target::Bucket(_) => "PUT, OPTIONS",
        Target::Stream(_) => "PUT, POST, GET, HEAD, DELETE, OPTIONS",
        Target::Bootstrap(_) => "GET, OPTIONS",
        Target::Snapshot(..) => "GET, PUT, OPTIONS",
        Target::Retention(..) => "PUT, OPTIONS",
    };
    ApiError::new(
        ErrorToken::MethodNotAllowed,
        format!("{method} is not allowed here; allowed: {allowed}"),
    )
    .with_header("allow", allowed)
}
