//! Subscriptions under load (the compat family's `__ds` APIs): a webhook receiver in this
//! process that acknowledges every wake (`{"done": true}`), subscriptions that each follow one
//! of the bench's streams by name, and the wake latency: from an append's acknowledgement to
//! the webhook that tells a subscriber of it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Full};
use std::sync::Mutex;

use crate::client::{Client, Error};
use crate::lean::Connections;
use crate::stats::Latencies;

/// The lock, whether or not a task panicked holding it (a panic ends the bench anyway).
fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

const COMPAT: &str = "/v1/stream/";

/// One webhook request as it arrived: which subscription, and the tail of each stream it named.
struct Arrival {
    at: Instant,
    subscription: String,
    tails: Vec<(String, u64)>,
}

pub struct Receiver {
    pub url: String,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    pub deliveries: Arc<AtomicU64>,
}

fn parse_offset(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('_')?;
    high.parse::<u64>()
        .ok()?
        .checked_mul(10_000_000_000_000_000)?
        .checked_add(low.parse().ok()?)
}

/// Listens on loopback and answers every webhook `{"done": true}` (`done`: the consumer
/// handled the wake at once) or `{}` (it is still at work: the wake stays open, and new data
/// wakes nobody until its lease lapses).
pub async fn start_receiver(done: bool) -> Result<Receiver, Error> {
    let answer: &'static [u8] = if done { br#"{"done":true}"# } else { b"{}" };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/webhook", listener.local_addr()?);
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let deliveries = Arc::new(AtomicU64::new(0));
    let (log, count) = (arrivals.clone(), deliveries.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (log, count) = (log.clone(), count.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        let (log, count) = (log.clone(), count.clone());
                        async move {
                            let raw = request.into_body().collect().await?.to_bytes();
                            let at = Instant::now();
                            count.fetch_add(1, Ordering::Relaxed);
                            let body: serde_json::Value =
                                serde_json::from_slice(&raw).unwrap_or_default();
                            let tails = body["streams"]
                                .as_array()
                                .map(|streams| {
                                    streams
                                        .iter()
                                        .filter_map(|s| {
                                            let tail = parse_offset(s["tail_offset"].as_str()?)?;
                                            Some((s["path"].as_str()?.to_owned(), tail))
                                        })
                                        .collect()
                                })
                                .unwrap_or_default();
                            let subscription = body["subscription_id"]
                                .as_str()
                                .unwrap_or_default()
                                .to_owned();
                            locked(&log).push(Arrival {
                                at,
                                subscription,
                                tails,
                            });
                            Ok::<_, hyper::Error>(hyper::Response::new(Full::new(
                                Bytes::from_static(answer),
                            )))
                        }
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            });
        }
    });
    Ok(Receiver {
        url,
        arrivals,
        deliveries,
    })
}

/// The stream name of a compat-family path.
fn name_of(path: &str) -> Result<&str, Error> {
    path.strip_prefix(COMPAT).ok_or_else(|| {
        format!("subscriptions need the compat family: {path} is not under {COMPAT}").into()
    })
}

/// `count` webhook subscriptions, the `j`-th following stream `j % paths.len()`; answers
/// their IDs.
pub async fn subscribe(
    client: &Client,
    paths: &[String],
    count: usize,
    receiver: &Receiver,
) -> Result<Vec<String>, Error> {
    let run = crate::client::run_id();
    let mut ids = Vec::with_capacity(count);
    for j in 0..count {
        let id = format!("bench-{run}-{j}");
        let spec = serde_json::json!({
            "type": "webhook",
            "streams": [name_of(&paths[j % paths.len()])?],
            "webhook": { "url": receiver.url },
            "lease_ttl_ms": 30_000,
        });
        let path = format!("{COMPAT}__ds/subscriptions/{id}");
        let status = client
            .send(
                Method::PUT,
                &path,
                Some("application/json"),
                Bytes::from(spec.to_string()),
            )
            .await?;
        if !status.is_success() {
            return Err(format!("create subscription {id}: {status}").into());
        }
        ids.push(id);
    }
    Ok(ids)
}

pub struct Options {
    pub streams: usize,
    pub subscriptions: usize,
    /// Appends per second, spread over the streams.
    pub rate: u64,
    pub size: usize,
    pub duration: Duration,
}

/// Appends at a fixed rate while the subscriptions are woken; reports the wake latency of every
/// (append, subscriber) pair.
pub async fn run(client: Client, prefix: &str, label: &str, o: Options) -> Result<String, Error> {
    let run = crate::client::run_id();
    let paths: Arc<Vec<String>> = Arc::new(
        (0..o.streams)
            .map(|i| format!("{prefix}-wake-{run}-{i}"))
            .collect(),
    );
    for path in paths.iter() {
        client.create(path, "application/octet-stream").await?;
    }
    let receiver = start_receiver(true).await?;
    let ids = subscribe(&client, &paths, o.subscriptions, &receiver).await?;
    // Appends, each with its stream, when it was acknowledged and the tail it made.
    let appended: Arc<Mutex<Vec<(usize, Instant, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(AtomicU64::new(0));
    let body = Bytes::from(vec![b'x'; o.size.max(1)]);
    let interval = Duration::from_secs_f64(1.0 / o.rate.max(1) as f64);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut sent = 0usize;
    let mut tasks = Vec::new();
    while started.elapsed() < o.duration {
        tick.tick().await;
        let stream = sent % o.streams;
        sent += 1;
        let (client, paths, body, appended, errors) = (
            client.clone(),
            paths.clone(),
            body.clone(),
            appended.clone(),
            errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut connections = Connections::new(client.tls());
            let url = client.target(&paths[stream]);
            match connections
                .send("POST", &url, "application/octet-stream", &body)
                .await
            {
                Ok(answer) if (200..300).contains(&answer.status) => {
                    if let Some(tail) = answer.next_offset.as_deref().and_then(parse_offset) {
                        locked(&appended).push((stream, Instant::now(), tail));
                    }
                }
                _ => {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    // Wakes of the last appends are still on their way.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut by_subscription: HashMap<&str, Vec<(Instant, u64)>> = HashMap::new();
    for arrival in locked(&receiver.arrivals).iter() {
        if let Some(id) = ids.iter().find(|id| **id == arrival.subscription) {
            let tail = arrival.tails.first().map_or(0, |(_, tail)| *tail);
            by_subscription
                .entry(id.as_str())
                .or_default()
                .push((arrival.at, tail));
        }
    }
    for arrivals in by_subscription.values_mut() {
        arrivals.sort_by_key(|(at, _)| *at);
    }
    let mut samples = Vec::new();
    let mut missed = 0u64;
    for &(stream, acked, tail) in locked(&appended).iter() {
        for (j, id) in ids.iter().enumerate() {
            if j % o.streams != stream {
                continue;
            }
            let told = by_subscription
                .get(id.as_str())
                .and_then(|arrivals| arrivals.iter().find(|(_, seen)| *seen >= tail));
            match told {
                Some((at, _)) => {
                    samples.push(at.saturating_duration_since(acked).as_nanos() as u64)
                }
                None => missed += 1,
            }
        }
    }
    let latencies = Latencies::new(samples);
    let appends = locked(&appended).len();
    let deliveries = receiver.deliveries.load(Ordering::Relaxed);
    eprintln!(
        "{label}: {appends} appends at {:.0}/s, {} subscriptions, {deliveries} webhooks; wake latency ms p50 {:.1} p99 {:.1} max {:.1}; never told {missed}; append errors {}",
        appends as f64 / elapsed,
        ids.len(),
        latencies.percentile(50.0),
        latencies.percentile(99.0),
        latencies.max(),
        errors.load(Ordering::Relaxed),
    );
    Ok(serde_json::json!({
        "bench": "wake",
        "label": label,
        "streams": o.streams,
        "subscriptions": ids.len(),
        "rate": o.rate,
        "appends": appends,
        "webhooks": deliveries,
        "wake_p50_ms": latencies.percentile(50.0),
        "wake_p99_ms": latencies.percentile(99.0),
        "wake_max_ms": latencies.max(),
        "never_told": missed,
    })
    .to_string())
}
