//! The admin listener: health, readiness, metrics, drain and bucket purges. It is a separate socket from the client
//! listener, so nothing here is reachable through the client port.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path, State};
use axum::routing::{get, post, put};
use http::request::Parts;
use http::{Method, Response, StatusCode, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use ursula_wire::ErrorToken;
use ursula_wire::admin::PurgeResponse;

use crate::admin_token::{AdminToken, Denied};
use crate::engine::EngineError;
use crate::groups::Groups;
use crate::http::add_common_headers;
use crate::http::error::ApiError;
use crate::http::response::{Body, Reply};
use crate::machine::{Command, Outcome};

mod membership;

type Answer = Result<Response<Body>, ApiError>;

pub struct Admin {
    /// What drains, purges and replica reads ask for (`server.admin_token_file`).
    pub token: Option<AdminToken>,
    /// `/metrics` asks for the token too.
    pub metrics_require_token: bool,
    pub groups: Arc<Groups>,
    /// Set once the client listener is serving.
    pub ready: AtomicBool,
    /// How long a drain waits for the groups' leadership to move.
    pub drain_wait: std::time::Duration,
    /// The Raft membership, and the way to the other voters' cluster listeners for purges
    /// and membership changes forwarded to a group's leader (on a voter).
    pub members: Option<Arc<crate::cluster::membership::Members>>,
    /// Its webhook counters are in `/metrics`.
    pub subscriptions: Arc<crate::subscriptions::Subscriptions>,
}

/// The admin listener's routes.
fn router(admin: Arc<Admin>) -> Router {
    Router::new()
        // axum would answer a HEAD with the GET handler: the admin routes take no HEAD.
        .route("/healthz", get(healthz).head(method_not_allowed))
        .route("/readyz", get(readyz).head(method_not_allowed))
        .route("/metrics", get(metrics).head(method_not_allowed))
        .route("/admin/drain", post(drain).delete(undrain))
        .route("/admin/buckets/{bucket}/purge", post(purge))
        .route(
            "/admin/membership",
            get(membership::report).head(method_not_allowed),
        )
        .route(
            "/admin/membership/learners/{id}",
            put(membership::add_learner).delete(membership::remove),
        )
        .route(
            "/admin/membership/voters/{id}",
            put(membership::promote).delete(membership::demote),
        )
        .route(
            "/admin/leadership/claim",
            post(membership::claim_leadership),
        )
        .route(
            "/admin/replica/{bucket}/{stream}",
            get(replica).head(method_not_allowed),
        )
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::map_response(
            |mut response: Response<Body>| async {
                add_common_headers(response.headers_mut(), false);
                response
            },
        ))
        .with_state(admin)
}

pub async fn serve(listener: TcpListener, admin: Arc<Admin>) {
    let service = TowerToHyperService::new(router(admin));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let service = service.clone();
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn no_route(uri: Uri) -> ApiError {
    ApiError::new(
        ErrorToken::NotFound,
        format!("no admin route {:?}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        ErrorToken::MethodNotAllowed,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

fn path_error(rejection: PathRejection) -> ApiError {
    ApiError::new(ErrorToken::NotFound, rejection.body_text())
}

async fn healthz() -> Response<Body> {
    json(StatusCode::OK, r#"{"status":"ok"}"#.into())
}

async fn readyz(State(admin): State<Arc<Admin>>) -> Answer {
    if !admin.ready.load(Ordering::Acquire) {
        return Err(ApiError::new(
            ErrorToken::Unavailable,
            "the node is not serving",
        ));
    }
    admin
        .groups
        .caught_up()
        .map_err(|reason| ApiError::new(ErrorToken::Unavailable, reason))?;
    Ok(json(StatusCode::OK, r#"{"status":"ready"}"#.into()))
}

/// A request that carried the admin token, when the node has one. Without it: 401 with the
/// JSON error, before the route does anything.
struct Authorized;

impl FromRequestParts<Arc<Admin>> for Authorized {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, admin: &Arc<Admin>) -> Result<Self, ApiError> {
        authorize(admin, &parts.headers).map(|()| Self)
    }
}

fn authorize(admin: &Admin, headers: &http::HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &admin.token else {
        return Ok(());
    };
    let authorization = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    let message: &str = match token.check(authorization) {
        Ok(()) => return Ok(()),
        Err(Denied::Missing) => "this admin route needs Authorization: Bearer <admin token>",
        Err(Denied::Wrong) => "the bearer token is not this node's admin token",
        // The reason names a path on the node: it goes to the log, not to the caller.
        Err(Denied::Unreadable(why)) => {
            tracing::error!(%why, "the admin token file cannot be read; admin routes refuse every request");
            "the node cannot read its admin token; its log says why"
        }
    };
    Err(ApiError::new(ErrorToken::Unauthenticated, message)
        .with_header("www-authenticate", "Bearer"))
}

async fn metrics(State(admin): State<Arc<Admin>>, headers: http::HeaderMap) -> Answer {
    if admin.metrics_require_token {
        authorize(&admin, &headers)?;
    }
    let mut text = String::with_capacity(4096);
    crate::metrics::render(&admin.groups, &mut text);
    admin.subscriptions.metrics.render(&mut text);
    Ok(Reply::new(StatusCode::OK)
        .header("content-type", "text/plain; version=0.0.4")
        .body(text)
        .build())
}

async fn drain(State(admin): State<Arc<Admin>>, _: Authorized) -> Response<Body> {
    let still_led = admin.groups.drain(admin.drain_wait).await;
    json(
        StatusCode::OK,
        format!(r#"{{"draining":true,"groups_led":{still_led}}}"#),
    )
}

async fn undrain(State(admin): State<Arc<Admin>>, _: Authorized) -> Response<Body> {
    admin.groups.undrain();
    json(StatusCode::OK, r#"{"draining":false}"#.into())
}

/// This node's own copy of a stream, whether or not it leads the stream's group: its applied
/// position, tail and a SHA-256 of its bytes. Comparing the answers of every voter checks that
/// the replicas agree (the client API always answers from the leader).
async fn replica(
    State(admin): State<Arc<Admin>>,
    _: Authorized,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Answer {
    use sha2::Digest;
    let Path((bucket, stream)) = path.map_err(path_error)?;
    let (bucket, stream) = (bucket.as_str(), stream.as_str());
    let engine = admin
        .groups
        .for_bucket(bucket)
        .map_err(crate::http::not_hosted)?;
    let path = crate::machine::StreamPath::new(bucket, stream);
    let (handle, meta) = match engine.lookup(&path, crate::engine::now_ms()) {
        crate::engine::Lookup::Live(handle, meta) => (handle, meta),
        _ => {
            return Err(ApiError::new(
                ErrorToken::StreamNotFound,
                format!("this replica has no live stream {path}"),
            ));
        }
    };
    let mut digest = sha2::Sha256::new();
    let mut at = engine.first_offset(&meta);
    let mut bytes = 0u64;
    while at < meta.tail {
        let slices = engine.read(&handle, &meta, at, 4 * 1024 * 1024).await?;
        let Some(last) = slices.last() else { break };
        at = last.start + last.bytes.len() as u64;
        for slice in &slices {
            digest.update(&slice.bytes);
            bytes += slice.bytes.len() as u64;
        }
    }
    let applied = engine
        .group_status()
        .map_or(0, |status| status.applied_index);
    let body = serde_json::json!({
        "bucket": bucket,
        "stream": stream,
        "tail": crate::offset::format(meta.tail),
        "bytes": bytes,
        "sha256": format!("{:x}", digest.finalize()),
        "applied_index": applied,
    });
    Ok(json(StatusCode::OK, body.to_string()))
}

/// Proposes the purge in the bucket's group: here when this node leads it, else through the
/// cluster listener of its leader (or, when this node does not host the group, of a voter that
/// does, which forwards in turn), so a purge may be sent to any voter's admin listener.
async fn purge_anywhere(admin: &Admin, bucket: &str) -> Result<u64, ApiError> {
    let command = Command::PurgeBucket {
        bucket: bucket.to_owned(),
    };
    let target = match admin.groups.for_bucket(bucket) {
        Ok(engine) => match engine.propose(command).await {
            Ok(Outcome::BucketPurged { streams }) => return Ok(streams as u64),
            Ok(_) => {
                return Err(ApiError::new(
                    ErrorToken::Internal,
                    "unexpected outcome of a purge",
                ));
            }
            Err(EngineError::NotLeader { leader: Some(id) }) => id,
            Err(error) => return Err(error.into()),
        },
        Err(not_hosted) => match not_hosted.voters.first() {
            Some(id) => *id,
            None => return Err(crate::http::not_hosted(not_hosted)),
        },
    };
    let (Some(cluster), Some(members)) = (&admin.groups.cluster, &admin.members) else {
        return Err(ApiError::new(
            ErrorToken::Internal,
            "no cluster to forward to",
        ));
    };
    let Some(peer) = cluster.book.get(target) else {
        return Err(ApiError::not_leader(None));
    };
    let group = ursula_wire::placement::group_of(bucket, admin.groups.group_count());
    crate::cluster::network::forward::<Result<u64, String>>(
        &members.transport.http,
        members.transport.this_node,
        &peer.cluster_url,
        group,
        crate::cluster::peer_link::CallKind::Purge,
        bucket.as_bytes().to_vec(),
    )
    .await
    .and_then(|answer| answer)
    .map_err(|reason| {
        ApiError::new(
            ErrorToken::Unavailable,
            format!("node {target} could not purge the bucket: {reason}"),
        )
    })
}

/// Deletes every stream of the bucket and fences the bucket ID for good. Purging a bucket that
/// is already purged (or never existed) succeeds and fences it.
async fn purge(
    State(admin): State<Arc<Admin>>,
    _: Authorized,
    bucket: Result<Path<String>, PathRejection>,
) -> Answer {
    let Path(bucket) = bucket.map_err(path_error)?;
    let bucket = bucket.as_str();
    if !crate::names::is_valid_bucket(bucket) {
        return Err(ApiError::new(
            ErrorToken::InvalidBucketId,
            format!("{bucket:?} is not a bucket ID"),
        ));
    }
    let streams = purge_anywhere(&admin, bucket).await?;
    tracing::info!(bucket, streams, "bucket purged and fenced");
    let body = PurgeResponse {
        bucket: bucket.to_owned(),
        purged_streams: streams as u64,
        fenced: true,
    };
    Ok(json(
        StatusCode::OK,
        serde_json::to_string(&body).unwrap_or_default(),
    ))
}

fn json(status: StatusCode, body: String) -> Response<Body> {
    Reply::new(status)
        .header("content-type", "application/json")
        .body(body)
        .build()
}
