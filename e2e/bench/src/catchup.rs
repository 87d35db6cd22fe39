//! Catch-up read throughput: a stream is filled with `bytes` of `size`-byte records, the server
//! is given `settle` (time for a cold tier to move them to object storage), then `readers`
//! clients each read it from the start to its tail, page by page, as a client catching up does.
//!
//! The last record is appended after the wait: a stream's tail cache lets go of records only
//! as new ones arrive, and the point is to read what the server stores, not its memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::client::{Client, Error};
use crate::stats::Latencies;

pub struct Options {
    pub bytes: usize,
    pub size: usize,
    pub readers: usize,
    pub settle: Duration,
}

/// Writers filling the stream at once.
const FILLERS: usize = 16;

async fn append(client: &Client, path: &str, body: &Bytes) -> Result<(), Error> {
    let status = client
        .send(
            Method::POST,
            path,
            Some("application/octet-stream"),
            body.clone(),
        )
        .await?;
    if !status.is_success() {
        return Err(format!("append: {status}").into());
    }
    Ok(())
}

pub async fn run(client: Client, prefix: &str, label: &str, o: Options) -> Result<String, Error> {
    let path = Arc::new(format!("{prefix}-{}", crate::client::run_id()));
    client.create(&path, "application/octet-stream").await?;
    let records = o.bytes.div_ceil(o.size.max(1)).max(2);
    let body = Bytes::from(vec![b'r'; o.size.max(1)]);
    let mut fillers = Vec::new();
    for f in 0..FILLERS {
        let (client, path, body) = (client.clone(), path.clone(), body.clone());
        fillers.push(tokio::spawn(async move {
            for _ in (f..records - 1).step_by(FILLERS) {
                append(&client, &path, &body).await?;
            }
            Ok::<(), Error>(())
        }));
    }
    for filler in fillers {
        filler.await??;
    }
    tokio::time::sleep(o.settle).await;
    append(&client, &path, &body).await?;

    let started = Instant::now();
    let mut readers = Vec::new();
    for _ in 0..o.readers.max(1) {
        let (client, path) = (client.clone(), path.clone());
        readers.push(tokio::spawn(async move {
            let mut offset = "-1".to_owned();
            let mut read = 0usize;
            let mut pages = Vec::new();
            loop {
                let asked = Instant::now();
                let (status, next, up_to_date, len) =
                    client.read(&format!("{path}?offset={offset}")).await?;
                if status != StatusCode::OK {
                    return Err::<_, Error>(format!("read at {offset}: {status}").into());
                }
                pages.push(asked.elapsed().as_nanos() as u64);
                read += len;
                offset = next.ok_or("a read without Stream-Next-Offset")?;
                if up_to_date {
                    return Ok((read, pages));
                }
            }
        }));
    }
    let mut total = 0usize;
    let mut pages = Vec::new();
    for reader in readers {
        let (read, mut samples) = reader.await??;
        if read != records * o.size.max(1) {
            return Err(format!("read {read} bytes of {}", records * o.size.max(1)).into());
        }
        total += read;
        pages.append(&mut samples);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let pages = Latencies::new(pages);
    Ok(serde_json::json!({
        "label": label,
        "bench": "catch-up",
        "bytes": records * o.size.max(1),
        "readers": o.readers.max(1),
        "mib_per_s": (total as f64 / (1024.0 * 1024.0) / elapsed).round(),
        "pages": pages.count(),
        "page_p50_ms": pages.percentile(50.0),
        "page_p99_ms": pages.percentile(99.0),
    })
    .to_string())
}
