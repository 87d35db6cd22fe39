use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;

use crate::client::{Client, Error};
use crate::lean::Connections;
use crate::stats::Latencies;

pub struct Options {
    pub streams: usize,
    pub writers: usize,
    pub size: usize,
    pub duration: Duration,
    pub warmup: Duration,
    /// Spread the streams over this many buckets (`{prefix}-{run}-{b}/s{i}`), which spreads
    /// them over a cluster's Raft groups; 0 keeps them under `prefix`.
    pub buckets: usize,
    /// The server's processes, for CPU time per append; none to skip it.
    pub server_pids: Vec<u32>,
    /// Webhook subscriptions following the streams while they are appended to.
    pub subscriptions: usize,
    /// Their consumer acknowledges every wake at once (else it keeps each wake open).
    pub consumers_done: bool,
}

pub async fn run(client: Client, prefix: &str, label: &str, o: Options) -> Result<String, Error> {
    let run_id = crate::client::run_id();
    let paths: Arc<Vec<String>> = Arc::new(
        (0..o.streams)
            .map(|i| match o.buckets {
                0 => format!("{prefix}-{run_id}-{i}"),
                n => format!("{prefix}-{run_id}-{}/s{i}", i % n),
            })
            .collect(),
    );
    // Buckets are implicit on this build; the PUT keeps the bench usable against builds and
    // servers from before that, for A/B runs.
    for b in 0..o.buckets {
        let bucket = format!("{prefix}-{run_id}-{b}");
        let status = client
            .send(Method::PUT, &bucket, None, Bytes::new())
            .await?;
        if !status.is_success() {
            return Err(format!("create bucket {bucket}: {status}").into());
        }
    }
    for path in paths.iter() {
        client.create(path, "application/octet-stream").await?;
    }
    let receiver = match o.subscriptions {
        0 => None,
        count => {
            let receiver = crate::wake::start_receiver(o.consumers_done).await?;
            crate::wake::subscribe(&client, &paths, count, &receiver).await?;
            Some(receiver)
        }
    };
    let webhooks = || {
        receiver.as_ref().map_or(0, |r| {
            r.deliveries.load(std::sync::atomic::Ordering::Relaxed)
        })
    };
    let body = Bytes::from(vec![b'x'; o.size]);
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..o.writers {
        let client = client.clone();
        let paths = paths.clone();
        let body = body.clone();
        let measuring = measuring.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(1 << 16);
            let mut errors = 0u64;
            let mut connections = Connections::new(client.tls());
            let mut i = w;
            while !stop.load(Ordering::Relaxed) {
                let path = &paths[i % paths.len()];
                i += stride(paths.len());
                let started = Instant::now();
                let ok = matches!(
                    append(&client, &mut connections, path, &body).await,
                    Ok(status) if (200..300).contains(&status)
                );
                if measuring.load(Ordering::Relaxed) {
                    if ok {
                        samples.push(started.elapsed().as_nanos() as u64);
                    } else {
                        errors += 1;
                    }
                }
            }
            (samples, errors)
        }));
    }
    tokio::time::sleep(o.warmup).await;
    measuring.store(true, Ordering::Relaxed);
    let webhooks_before = webhooks();
    let started = Instant::now();
    let cpu_before = crate::cpu::seconds(&o.server_pids);
    let threads_before = crate::cpu::by_thread(&o.server_pids);
    tokio::time::sleep(o.duration).await;
    measuring.store(false, Ordering::Relaxed);
    let cpu_after = crate::cpu::seconds(&o.server_pids);
    let threads_after = crate::cpu::by_thread(&o.server_pids);
    let elapsed = started.elapsed().as_secs_f64();
    let webhooks_during = webhooks() - webhooks_before;
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (s, e) = task.await?;
        samples.extend(s);
        errors += e;
    }
    let latencies = Latencies::new(samples);
    let rate = latencies.count() as f64 / elapsed;
    let server_cpu_us = match (cpu_before, cpu_after) {
        (Some(before), Some(after)) if !o.server_pids.is_empty() && latencies.count() > 0 => {
            Some((after - before) * 1e6 / latencies.count() as f64)
        }
        _ => None,
    };
    eprintln!(
        "{label}: {rate:.0} appends/s over {elapsed:.1}s; latency ms p50 {:.3} p99 {:.3} p99.9 {:.3} max {:.3}; errors {errors}",
        latencies.percentile(50.0),
        latencies.percentile(99.0),
        latencies.percentile(99.9),
        latencies.max()
    );
    // Per thread name, for threads alive at both ends of the measurement.
    let count = latencies.count().max(1) as f64;
    let by_thread: std::collections::BTreeMap<String, f64> = threads_after
        .iter()
        .filter_map(|(name, after)| {
            let before = threads_before.get(name)?;
            Some((name.clone(), (after - before) * 1e6 / count))
        })
        .collect();
    if let Some(us) = server_cpu_us {
        let parts: Vec<String> = by_thread
            .iter()
            .map(|(name, us)| format!("{name} {us:.1}"))
            .collect();
        eprintln!(
            "{label}: server CPU {us:.1} µs per append ({})",
            parts.join(", ")
        );
    }
    Ok(serde_json::json!({
        "bench": "append",
        "label": label,
        "streams": o.streams,
        "writers": o.writers,
        "size": o.size,
        "appends_per_sec": rate,
        "p50_ms": latencies.percentile(50.0),
        "p99_ms": latencies.percentile(99.0),
        "p999_ms": latencies.percentile(99.9),
        "max_ms": latencies.max(),
        "errors": errors,
        "server_cpu_us_per_append": server_cpu_us,
        "server_cpu_us_per_append_by_thread": by_thread,
        "subscriptions": o.subscriptions,
        "webhooks_per_sec": webhooks_during as f64 / elapsed,
    })
    .to_string())
}

/// One append, following leader redirects as a cluster's clients do; returns the final status.
async fn append(
    client: &Client,
    connections: &mut Connections,
    path: &str,
    body: &[u8],
) -> Result<u16, Error> {
    let mut url = client.target(path);
    for _ in 0..4 {
        let answer = connections
            .send("POST", &url, "application/octet-stream", body)
            .await?;
        match answer.location {
            Some(location) if answer.status == 307 => {
                client.remember_leader(path, &location);
                url = location;
            }
            _ => return Ok(answer.status),
        }
    }
    Err(format!("{path}: too many redirects").into())
}

/// Writers step through the streams so that concurrent writers hit different streams.
fn stride(streams: usize) -> usize {
    if streams > 1 {
        7 % streams.max(1) + 1
    } else {
        1
    }
}
