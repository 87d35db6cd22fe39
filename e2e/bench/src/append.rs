use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;

use crate::client::{Client, Error};
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
            let mut i = w;
            while !stop.load(Ordering::Relaxed) {
                let path = &paths[i % paths.len()];
                i += stride(paths.len());
                let started = Instant::now();
                let ok = matches!(
                    client
                        .send(Method::POST, path, Some("application/octet-stream"), body.clone())
                        .await,
                    Ok(status) if status.is_success()
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
    let started = Instant::now();
    tokio::time::sleep(o.duration).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
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
    eprintln!(
        "{label}: {rate:.0} appends/s over {elapsed:.1}s; latency ms p50 {:.3} p99 {:.3} p99.9 {:.3} max {:.3}; errors {errors}",
        latencies.percentile(50.0),
        latencies.percentile(99.0),
        latencies.percentile(99.9),
        latencies.max()
    );
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
    })
    .to_string())
}

/// Writers step through the streams so that concurrent writers hit different streams.
fn stride(streams: usize) -> usize {
    if streams > 1 {
        7 % streams.max(1) + 1
    } else {
        1
    }
}
