//! The cluster listener: Raft RPCs from peers (one per request, or a peer link's batch at
//! `/raft/batch`), and nothing else. Clients never reach it; it
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

use super::peer_link::{BatchAnswer, BatchCall};
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

fn encode<T: Serialize>(value: &T) -> (StatusCode, Vec<u8>) {
    match postcard::to_allocvec(value) {
        Ok(body) => (StatusCode::OK, body),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            error.to_string().into_bytes(),
        ),
    }
}

fn encoded<T: Serialize>(value: &T) -> Response<Full<Bytes>> {
    let (status, body) = encode(value);
    answer(status, body)
}

async fn handle(
    rafts: Arc<Vec<Option<Raft>>>,
    metrics: Arc<Metrics>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_owned();
    let mut parts = path.trim_start_matches('/').split('/');
    let route = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("raft"), Some("batch"), None, None) => None,
        (Some("raft"), Some(group), Some(kind), None) => match group.parse::<usize>() {
            Ok(group) => Some((group, kind.to_owned())),
            Err(_) => return Ok(answer(StatusCode::NOT_FOUND, b"no such group".to_vec())),
        },
        _ => {
            return Ok(answer(
                StatusCode::NOT_FOUND,
                b"no such cluster route".to_vec(),
            ));
        }
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
    let Some((group, kind)) = route else {
        return Ok(batch(&rafts, &metrics, &body).await);
    };
    let (status, body) = call(&rafts, &metrics, group, &kind, body).await;
    Ok(answer(status, body))
}

/// A peer link's coalesced calls (`peer_link`), each run as its own route would run it, all
/// at once; the answers in the calls' order.
async fn batch(rafts: &[Option<Raft>], metrics: &Metrics, body: &[u8]) -> Response<Full<Bytes>> {
    let calls: Vec<BatchCall> = match postcard::from_bytes(body) {
        Ok(calls) => calls,
        Err(error) => return answer(StatusCode::BAD_REQUEST, error.to_string().into_bytes()),
    };
    let answers: Vec<BatchAnswer> =
        futures_util::future::join_all(calls.into_iter().map(|c| async move {
            let (status, body) =
                call(rafts, metrics, c.group as usize, c.kind.route(), c.body).await;
            if status.is_success() {
                Ok(Bytes::from(body))
            } else {
                Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
            }
        }))
        .await;
    encoded(&answers)
}

/// One Raft call to `group`: its status and encoded answer.
async fn call(
    rafts: &[Option<Raft>],
    metrics: &Metrics,
    group: usize,
    kind: &str,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    let Some(raft) = rafts.get(group).and_then(Option::clone) else {
        return (StatusCode::NOT_FOUND, b"no such group".to_vec());
    };
    let bad = |error: postcard::Error| (StatusCode::BAD_REQUEST, error.to_string().into_bytes());
    match kind {
        "append" => match postcard::from_bytes::<AppendEntriesRequest<TypeConfig>>(&body) {
            Ok(rpc) => {
                metrics.append_rpcs.fetch_add(1, Ordering::Relaxed);
                metrics
                    .append_rpc_entries
                    .fetch_add(rpc.entries.len() as u64, Ordering::Relaxed);
                encode(&raft.append_entries(rpc).await)
            }
            Err(error) => bad(error),
        },
        "vote" => match postcard::from_bytes(&body) {
            Ok(rpc) => encode(&raft.vote(rpc).await),
            Err(error) => bad(error),
        },
        "snapshot" => match postcard::from_bytes(&body) {
            Ok(rpc) => encode(&raft.install_snapshot(rpc).await),
            Err(error) => bad(error),
        },
        // A peer's admin listener was asked to purge a bucket of a group this node leads.
        "purge" => match std::str::from_utf8(&body) {
            Ok(bucket) => encode(&purge_here(&raft, bucket).await),
            Err(_) => (StatusCode::BAD_REQUEST, b"the bucket is not UTF-8".to_vec()),
        },
        _ => (StatusCode::NOT_FOUND, b"no such cluster route".to_vec()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::peer_link::CallKind;

    fn answers(response: Response<Full<Bytes>>) -> (StatusCode, Vec<BatchAnswer>) {
        let status = response.status();
        let body = futures_util::FutureExt::now_or_never(response.into_body().collect())
            .and_then(Result::ok)
            .map(|collected| collected.to_bytes())
            .unwrap_or_default();
        (status, postcard::from_bytes(&body).unwrap_or_default())
    }

    #[tokio::test]
    async fn every_call_of_a_batch_gets_its_own_answer() {
        let metrics = Metrics::default();
        let calls = vec![
            BatchCall {
                group: 7,
                kind: CallKind::Append,
                body: Bytes::from_static(b"x"),
            },
            BatchCall {
                group: 0,
                kind: CallKind::Vote,
                body: Bytes::new(),
            },
        ];
        let body = postcard::to_allocvec(&calls).unwrap();
        // No group is hosted here: each call gets its own refusal.
        let (status, answers) = answers(batch(&[None], &metrics, &body).await);
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answers.len(), 2);
        for answer in answers {
            let error = answer.expect_err("no group is hosted");
            assert!(
                error.contains("404") && error.contains("no such group"),
                "{error}"
            );
        }
    }

    #[tokio::test]
    async fn a_batch_that_does_not_decode_is_a_bad_request() {
        let metrics = Metrics::default();
        let response = batch(&[None], &metrics, b"\xff\xff\xff").await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
}
