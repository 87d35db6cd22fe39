//! A webhook receiver on loopback, as a subscriber runs one: it records every request (its
//! `Webhook-Signature` and raw body) and answers each with the JSON it is set to answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Debug, Clone)]
pub struct Delivery {
    pub signature: Option<String>,
    pub raw: Bytes,
    pub body: serde_json::Value,
}

struct Shared {
    received: Mutex<Vec<Delivery>>,
    answer: Mutex<(u16, serde_json::Value)>,
    arrived: Notify,
}

pub struct Receiver {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Listens on 127.0.0.1 (a port of its own) and answers 200 `{}` until told otherwise.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the receiver");
        let addr = listener.local_addr().expect("its address");
        let shared = Arc::new(Shared {
            received: Mutex::new(Vec::new()),
            answer: Mutex::new((200, serde_json::json!({}))),
            arrived: Notify::new(),
        });
        let state = shared.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = state.clone();
                tokio::spawn(async move {
                    let service =
                        service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                            let state = state.clone();
                            async move {
                                let signature = request
                                    .headers()
                                    .get("webhook-signature")
                                    .and_then(|v| v.to_str().ok())
                                    .map(str::to_owned);
                                let raw = request.into_body().collect().await?.to_bytes();
                                let body = serde_json::from_slice(&raw).unwrap_or_default();
                                state.received.lock().push(Delivery {
                                    signature,
                                    raw,
                                    body,
                                });
                                state.arrived.notify_waiters();
                                let (status, answer) = state.answer.lock().clone();
                                let mut response = hyper::Response::new(Full::new(Bytes::from(
                                    answer.to_string(),
                                )));
                                *response.status_mut() = http::StatusCode::from_u16(status)
                                    .unwrap_or(http::StatusCode::OK);
                                Ok::<_, hyper::Error>(response)
                            }
                        });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            shared,
            server,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/webhook", self.addr)
    }

    /// What every later request is answered with.
    pub fn answer(&self, status: u16, body: serde_json::Value) {
        *self.shared.answer.lock() = (status, body);
    }

    pub fn received(&self) -> Vec<Delivery> {
        self.shared.received.lock().clone()
    }

    /// Waits up to `patience` for a request that `matches`, among those received so far too.
    pub async fn wait_for(
        &self,
        patience: Duration,
        matches: impl Fn(&Delivery) -> bool,
    ) -> Option<Delivery> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let arrived = self.shared.arrived.notified();
            if let Some(found) = self.received().into_iter().rev().find(|d| matches(d)) {
                return Some(found);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return None;
            }
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The `Authorization` a consumer sends to acknowledge `wake`: a webhook body's
/// `callback_token`, or a claim answer's `token`.
pub fn bearer(wake: &serde_json::Value) -> String {
    let token = wake["callback_token"].as_str().or(wake["token"].as_str());
    format!("Bearer {}", token.unwrap_or_default())
}

/// A consumer's acknowledgement of `wake` that it is done: `stream` read up to `offset`.
pub fn done_ack(wake: &serde_json::Value, stream: &str, offset: &str) -> serde_json::Value {
    serde_json::json!({
        "wake_id": wake["wake_id"],
        "generation": wake["generation"],
        "acks": [{ "stream": stream, "offset": offset }],
        "done": true,
    })
}
