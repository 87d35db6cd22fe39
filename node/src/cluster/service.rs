//! The cluster listener: Raft RPCs from peers, and nothing else. Clients never reach it; it
//! listens on its own address (`server.cluster_listen`).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use std::sync::atomic::Ordering;

use openraft::raft::AppendEntriesRequest;

use super::types::{Raft, TypeConfig};
use crate::engine::Metrics;

/// Largest RPC body accepted: entries are batched, and snapshots come in chunks.
const MAX_RPC_BYTES: usize = 256 * 1024 * 1024;

pub async fn serve(
    listener: TcpListener,
    rafts: Arc<Vec<Option<Raft>>>,
    metrics: Arc<Metrics>,
    mut stopping: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = crate::http::until_stopping(&mut stopping) => return,
        };
        let (stream, _) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "cluster accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let rafts = rafts.clone();
        let metrics = metrics.clone();
        let service = service_fn(move |request| handle(rafts.clone(), metrics.clone(), request));
        tokio::spawn(async move {
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http2()
                .max_concurrent_streams(4096)
                .initial_connection_window_size(16 * 1024 * 1024)
                .initial_stream_window_size(4 * 1024 * 1024);
            if let Err(error) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "cluster connection ended");
            }
        });
    }
}

fn answer(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

fn encoded<T: Serialize>(value: &T) -> Response<Full<Bytes>> {
    match postcard::to_allocvec(value) {
        Ok(body) => answer(StatusCode::OK, body),
        Err(error) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            error.to_string().into_bytes(),
        ),
    }
}

async fn handle(
    rafts: Arc<Vec<Option<Raft>>>,
    metrics: Arc<Metrics>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_owned();
    let mut parts = path.trim_start_matches('/').split('/');
    let (Some("raft"), Some(group), Some(kind), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Ok(answer(
            StatusCode::NOT_FOUND,
            b"no such cluster route".to_vec(),
        ));
    };
    let Some(raft) = group
        .parse::<usize>()
        .ok()
        .and_then(|g| rafts.get(g))
        .and_then(Option::clone)
    else {
        return Ok(answer(StatusCode::NOT_FOUND, b"no such group".to_vec()));
    };
    if request.method() != Method::POST {
        return Ok(answer(StatusCode::METHOD_NOT_ALLOWED, Vec::new()));
    }
    let body = match Limited::new(request.into_body(), MAX_RPC_BYTES)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(error) => {
            return Ok(answer(
                StatusCode::BAD_REQUEST,
                error.to_string().into_bytes(),
            ));
        }
    };
    let bad =
        |error: postcard::Error| answer(StatusCode::BAD_REQUEST, error.to_string().into_bytes());
    let response = match kind {
        "append" => match postcard::from_bytes::<AppendEntriesRequest<TypeConfig>>(&body) {
            Ok(rpc) => {
                metrics.append_rpcs.fetch_add(1, Ordering::Relaxed);
                metrics
                    .append_rpc_entries
                    .fetch_add(rpc.entries.len() as u64, Ordering::Relaxed);
                encoded(&raft.append_entries(rpc).await)
            }
            Err(error) => bad(error),
        },
        "vote" => match postcard::from_bytes(&body) {
            Ok(rpc) => encoded(&raft.vote(rpc).await),
            Err(error) => bad(error),
        },
        "snapshot" => match postcard::from_bytes(&body) {
            Ok(rpc) => encoded(&raft.install_snapshot(rpc).await),
            Err(error) => bad(error),
        },
        // A peer's admin listener was asked to purge a bucket of a group this node leads.
        "purge" => match std::str::from_utf8(&body) {
            Ok(bucket) => encoded(&purge_here(&raft, bucket).await),
            Err(_) => answer(StatusCode::BAD_REQUEST, b"the bucket is not UTF-8".to_vec()),
        },
        _ => answer(StatusCode::NOT_FOUND, b"no such cluster route".to_vec()),
    };
    Ok(response)
}

/// Proposes the purge of `bucket` here: the streams it deleted, or why it could not.
async fn purge_here(raft: &Raft, bucket: &str) -> Result<u64, String> {
    let command = crate::machine::Command::PurgeBucket {
        bucket: bucket.to_owned(),
    };
    match super::propose(raft, command).await {
        Ok(crate::machine::Outcome::BucketPurged { streams }) => Ok(streams as u64),
        Ok(_) => Err("unexpected outcome of a purge".into()),
        Err(error) => Err(error.to_string()),
    }
}
