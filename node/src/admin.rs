//! The admin listener: health, readiness, metrics, drain and bucket purges. It is a separate socket from the client
//! listener, so nothing here is reachable through the client port.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use ursula_wire::ErrorToken;
use ursula_wire::admin::PurgeResponse;

use crate::engine::EngineError;
use crate::groups::Groups;
use crate::http::error::ApiError;
use crate::http::response::{Body, Reply, add_common_headers};
use crate::machine::{Command, Outcome};

pub struct Admin {
    pub groups: Arc<Groups>,
    /// Set once the client listener is serving.
    pub ready: AtomicBool,
    /// How long a drain waits for the groups' leadership to move.
    pub drain_wait: std::time::Duration,
    /// For purges forwarded to the leader's cluster listener.
    pub peers: crate::cluster::network::HttpClient,
}

pub async fn serve(listener: TcpListener, admin: Arc<Admin>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(admin.clone(), request));
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    admin: Arc<Admin>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let mut response = route(&admin, &request)
        .await
        .unwrap_or_else(ApiError::into_response);
    add_common_headers(response.headers_mut(), false);
    Ok(response)
}

async fn route(admin: &Admin, request: &Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = request.uri().path();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (request.method(), segments.as_slice()) {
        (&Method::GET, ["healthz"]) => Ok(json(StatusCode::OK, r#"{"status":"ok"}"#.into())),
        (&Method::GET, ["readyz"]) => {
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
        (&Method::POST, ["admin", "drain"]) => {
            let wait = admin.drain_wait;
            let still_led = admin.groups.drain(wait).await;
            Ok(json(
                StatusCode::OK,
                format!(r#"{{"draining":true,"groups_led":{still_led}}}"#),
            ))
        }
        (&Method::DELETE, ["admin", "drain"]) => {
            admin.groups.undrain();
            Ok(json(StatusCode::OK, r#"{"draining":false}"#.into()))
        }
        (&Method::GET, ["metrics"]) => {
            let mut text = String::with_capacity(4096);
            crate::metrics::render(&admin.groups, &mut text);
            Ok(Reply::new(StatusCode::OK)
                .header("content-type", "text/plain; version=0.0.4")
                .body(text)
                .build())
        }
        (&Method::POST, ["admin", "buckets", bucket, "purge"]) => purge(admin, bucket).await,
        (&Method::GET, ["admin", "replica", bucket, stream]) => {
            replica(admin, bucket, stream).await
        }
        (
            _,
            ["healthz" | "readyz" | "metrics"]
            | ["admin", "buckets", _, "purge"]
            | ["admin", "drain"],
        ) => Err(ApiError::new(
            ErrorToken::MethodNotAllowed,
            format!("{} is not allowed on {path}", request.method()),
        )),
        _ => Err(ApiError::new(
            ErrorToken::NotFound,
            format!("no admin route {path:?}"),
        )),
    }
}

/// This node's own copy of a stream, whether or not it leads the stream's group: its applied
/// position, tail and a SHA-256 of its bytes. Comparing the answers of every voter checks that
/// the replicas agree (the client API always answers from the leader).
async fn replica(admin: &Admin, bucket: &str, stream: &str) -> Result<Response<Body>, ApiError> {
    use sha2::Digest;
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
        .raft()
        .and_then(|raft| raft.metrics().borrow().last_applied)
        .map_or(0, |id| id.index);
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
    let Some(cluster) = &admin.groups.cluster else {
        return Err(ApiError::new(
            ErrorToken::Internal,
            "no cluster to forward to",
        ));
    };
    let Some(peer) = cluster.peers.get(&target) else {
        return Err(ApiError::not_leader(None));
    };
    let group = crate::cluster::placement::group_of(bucket, admin.groups.group_count());
    crate::cluster::network::forward_purge(&admin.peers, &peer.cluster_url, group, bucket)
        .await
        .map_err(|reason| {
            ApiError::new(
                ErrorToken::Unavailable,
                format!("node {target} could not purge the bucket: {reason}"),
            )
        })
}

/// Deletes every stream of the bucket and fences the bucket ID for good. Purging a bucket that
/// is already purged (or never existed) succeeds and fences it.
async fn purge(admin: &Admin, bucket: &str) -> Result<Response<Body>, ApiError> {
    if !crate::http::names::is_valid_bucket(bucket) {
        return Err(ApiError::new(
            ErrorToken::InvalidBucketId,
            format!("{bucket:?} is not a bucket ID"),
        ));
    }
    let streams = purge_anywhere(admin, bucket).await?;
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
