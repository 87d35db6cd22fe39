//! The cluster listener: Raft RPCs from peers, and nothing else. A connection that opens with
//! `frame::MAGIC` is a peer link, whose frames are batches of calls (`peer_link`); any other
//! speaks HTTP, one call per request at `/raft/{group}/{kind}` (snapshots, forwarded purges).
//! Clients never reach it; it listens on its own address (`server.cluster_listen`).

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
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use std::sync::atomic::Ordering;

use openraft::raft::AppendEntriesRequest;

use super::frame;
use super::peer_link::{BatchAnswer, BatchCall, CallKind};
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
            () = crate::shutdown::until_stopping(&mut stopping) => return,
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
        tokio::spawn(async move {
            if opens_a_link(&stream).await {
                if let Err(error) = serve_link(stream, &rafts, &metrics).await {
                    tracing::debug!(%error, "peer link ended");
                }
                return;
            }
            let service =
                service_fn(move |request| handle(rafts.clone(), metrics.clone(), request));
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

/// Whether the connection starts with a peer link's `frame::MAGIC` (left unread).
async fn opens_a_link(stream: &TcpStream) -> bool {
    let mut seen = [0u8; frame::MAGIC.len()];
    // The magic comes in one small write; peeking again is for the rare split delivery.
    for _ in 0..100 {
        match stream.peek(&mut seen).await {
            Ok(0) | Err(_) => return false,
            Ok(n) if seen[..n] != frame::MAGIC[..n] => return false,
            Ok(n) if n == seen.len() => return true,
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(1)).await,
        }
    }
    false
}

/// A peer link: each frame is a batch of calls, answered in a frame of the same exchange
/// number before the next is read (the link has one exchange in flight).
async fn serve_link(
    stream: TcpStream,
    rafts: &[Option<Raft>],
    metrics: &Metrics,
) -> std::io::Result<()> {
    let mut stream = BufReader::with_capacity(64 * 1024, stream);
    let mut magic = [0u8; frame::MAGIC.len()];
    stream.read_exact(&mut magic).await?;
    while let Some((exchange, payload)) = frame::read(&mut stream, MAX_RPC_BYTES).await? {
        let answers = batch(rafts, metrics, &payload)
            .await
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let answer = postcard::to_extend(&answers, frame::start())
            .map_err(std::io::Error::other)
            .and_then(|frame| frame::finish(frame, exchange))?;
        frame::write(stream.get_mut(), &answer).await?;
    }
    Ok(())
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

async fn handle(
    rafts: Arc<Vec<Option<Raft>>>,
    metrics: Arc<Metrics>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_owned();
    let mut parts = path.trim_start_matches('/').split('/');
    let (group, kind) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("raft"), Some(group), Some(route), None) => {
            let Some(kind) = CallKind::from_route(route) else {
                return Ok(answer(
                    StatusCode::NOT_FOUND,
                    b"no such cluster route".to_vec(),
                ));
            };
            match group.parse::<usize>() {
                Ok(group) => (group, kind),
                Err(_) => return Ok(answer(StatusCode::NOT_FOUND, b"no such group".to_vec())),
            }
        }
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
    let (status, body) = call(&rafts, &metrics, group, kind, body).await;
    Ok(answer(status, body))
}

/// A peer link's coalesced calls (`peer_link`), each run as its own route would run it, all
/// at once; the answers in the calls' order. A batch that does not decode is an error.
async fn batch(
    rafts: &[Option<Raft>],
    metrics: &Metrics,
    body: &[u8],
) -> Result<Vec<BatchAnswer>, String> {
    let calls: Vec<BatchCall> =
        postcard::from_bytes(body).map_err(|e| format!("a batch of calls: {e}"))?;
    let answers: Vec<BatchAnswer> =
        futures_util::future::join_all(calls.into_iter().map(|c| async move {
            let (status, body) = call(rafts, metrics, c.group as usize, c.kind, c.body).await;
            if status.is_success() {
                Ok(Bytes::from(body))
            } else {
                Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
            }
        }))
        .await;
    Ok(answers)
}

/// One Raft call to `group`: its status and encoded answer.
async fn call(
    rafts: &[Option<Raft>],
    metrics: &Metrics,
    group: usize,
    kind: CallKind,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    let Some(raft) = rafts.get(group).and_then(Option::clone) else {
        return (StatusCode::NOT_FOUND, b"no such group".to_vec());
    };
    let bad = |error: postcard::Error| (StatusCode::BAD_REQUEST, error.to_string().into_bytes());
    match kind {
        CallKind::Append => match postcard::from_bytes::<AppendEntriesRequest<TypeConfig>>(&body) {
            Ok(rpc) => {
                metrics.append_rpcs.fetch_add(1, Ordering::Relaxed);
                metrics
                    .append_rpc_entries
                    .fetch_add(rpc.entries.len() as u64, Ordering::Relaxed);
                encode(&raft.append_entries(rpc).await)
            }
            Err(error) => bad(error),
        },
        CallKind::Vote => match postcard::from_bytes(&body) {
            Ok(rpc) => encode(&raft.vote(rpc).await),
            Err(error) => bad(error),
        },
        CallKind::Snapshot => match postcard::from_bytes(&body) {
            Ok(rpc) => encode(&raft.install_snapshot(rpc).await),
            Err(error) => bad(error),
        },
        // A peer's admin listener was asked to purge a bucket of a group this node leads.
        CallKind::Purge => match std::str::from_utf8(&body) {
            Ok(bucket) => encode(&purge_here(&raft, bucket).await),
            Err(_) => (StatusCode::BAD_REQUEST, b"the bucket is not UTF-8".to_vec()),
        },
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
        let answers = batch(&[None], &metrics, &body).await.unwrap();
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
    async fn a_batch_that_does_not_decode_is_refused() {
        let metrics = Metrics::default();
        let error = batch(&[None], &metrics, b"\xff\xff\xff").await.unwrap_err();
        assert!(error.contains("a batch of calls"), "{error}");
    }

    /// One listener, two protocols: a link's frames and HTTP/2, told apart by the magic.
    #[tokio::test]
    async fn the_cluster_listener_serves_links_and_http_on_one_port() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (_stop, stopping) = watch::channel(false);
        let rafts: Arc<Vec<Option<Raft>>> = Arc::new(vec![None]);
        tokio::spawn(serve(listener, rafts, Arc::default(), stopping));

        let link = crate::cluster::peer_link::PeerLink::start(&url);
        for _ in 0..3 {
            let error = link
                .call(
                    0,
                    CallKind::Vote,
                    Bytes::new(),
                    std::time::Duration::from_secs(5),
                )
                .await
                .expect_err("group 0 is not hosted");
            assert!(
                matches!(&error, crate::cluster::call_error::PostError::Other(m) if m.contains("no such group")),
                "{error:?}"
            );
        }

        let client = crate::cluster::network::http2_client();
        let error = crate::cluster::network::post(
            &client,
            &format!("{url}/raft/0/snapshot"),
            Vec::new(),
            std::time::Duration::from_secs(5),
        )
        .await
        .expect_err("group 0 is not hosted");
        assert!(
            matches!(&error, crate::cluster::call_error::PostError::Other(m) if m.contains("404")),
            "{error:?}"
        );
    }
}
