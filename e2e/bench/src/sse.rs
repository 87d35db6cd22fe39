use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use tokio::sync::mpsc;

use crate::client::{Client, Error};
use crate::lean::EventStream;
use crate::stats::Latencies;

pub struct Options {
    pub subscribers: usize,
    pub rate: u64,
    pub duration: Duration,
}

pub async fn run(client: Client, prefix: &str, label: &str, o: Options) -> Result<String, Error> {
    let path = format!("{prefix}-sse-{}", crate::client::run_id());
    client.create(&path, "text/plain").await?;
    let origin = Instant::now();
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u64>>();
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<()>();
    let expected = (o.rate as f64 * o.duration.as_secs_f64()).round() as usize;
    for _ in 0..o.subscribers {
        let url = client.url(&format!("{path}?offset=now&live=sse"));
        let tx = tx.clone();
        let ready = ready_tx.clone();
        tokio::spawn(async move {
            let mut samples = Vec::with_capacity(expected);
            if let Ok(mut stream) = EventStream::open(&url).await {
                let mut events = Events::default();
                let mut announced = false;
                let mut data = Vec::with_capacity(4096);
                while samples.len() < expected {
                    data.clear();
                    if !matches!(stream.next(&mut data).await, Ok(true)) {
                        break;
                    }
                    let now = origin.elapsed().as_nanos() as u64;
                    events.read(&data, |event| {
                        if !announced && event.starts_with(b"event: control") {
                            announced = true;
                            let _ = ready.send(());
                        }
                        if event.starts_with(b"event: data") {
                            for sent in stamps(event) {
                                samples.push(now.saturating_sub(sent));
                            }
                        }
                    });
                }
            }
            let _ = tx.send(samples);
        });
    }
    drop(tx);
    drop(ready_tx);
    for _ in 0..o.subscribers {
        if ready_rx.recv().await.is_none() {
            return Err("a subscriber failed to connect".into());
        }
    }
    let interval = Duration::from_nanos(1_000_000_000 / o.rate.max(1));
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for _ in 0..expected {
        tick.tick().await;
        let stamp = format!("{} ", origin.elapsed().as_nanos());
        client
            .send(Method::POST, &path, Some("text/plain"), Bytes::from(stamp))
            .await?;
    }
    let mut samples = Vec::new();
    let mut complete = 0;
    let collect = async {
        while let Some(s) = rx.recv().await {
            if s.len() >= expected {
                complete += 1;
            }
            samples.extend(s);
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), collect).await;
    let latencies = Latencies::new(samples);
    let deliveries = latencies.count();
    eprintln!(
        "{label}: SSE {} subscribers x {expected} messages at {}/s: delivered {deliveries} of {} ({complete} complete); latency ms p50 {:.3} p99 {:.3} max {:.3}",
        o.subscribers,
        o.rate,
        expected * o.subscribers,
        latencies.percentile(50.0),
        latencies.percentile(99.0),
        latencies.max()
    );
    Ok(serde_json::json!({
        "bench": "sse",
        "label": label,
        "subscribers": o.subscribers,
        "rate": o.rate,
        "expected_deliveries": expected * o.subscribers,
        "deliveries": deliveries,
        "p50_ms": latencies.percentile(50.0),
        "p99_ms": latencies.percentile(99.0),
        "max_ms": latencies.max(),
    })
    .to_string())
}

/// Splits an event stream into events without copying them into strings: with 1,000
/// subscribers on two cores, the load generator's own parsing was half of the machine's CPU
/// and so part of every latency it measured.
#[derive(Default)]
struct Events {
    buffer: Vec<u8>,
}

impl Events {
    fn read(&mut self, data: &[u8], mut each: impl FnMut(&[u8])) {
        self.buffer.extend_from_slice(data);
        let mut start = 0;
        while let Some(length) = self.buffer[start..]
            .windows(2)
            .position(|w| w == b"\n\n")
            .map(|at| at + 2)
        {
            each(&self.buffer[start..start + length]);
            start += length;
        }
        self.buffer.drain(..start);
    }
}

/// The send times (ns since the run's origin) in a data event's `data:` lines.
fn stamps(event: &[u8]) -> impl Iterator<Item = u64> + '_ {
    event
        .split(|&b| b == b'\n')
        .filter_map(|line| line.strip_prefix(b"data:"))
        .flat_map(|line| line.split(|b| b.is_ascii_whitespace()))
        .filter(|word| !word.is_empty() && word.iter().all(u8::is_ascii_digit))
        .filter_map(|word| std::str::from_utf8(word).ok()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_stamps_are_read_across_frames() {
        let stream = b"event: data\ndata:12 34 \n\nevent: control\ndata:{}\n\n";
        let mut events = Events::default();
        let mut seen = Vec::new();
        for piece in stream.chunks(5) {
            events.read(piece, |e| seen.push(e.to_vec()));
        }
        assert_eq!(seen.len(), 2);
        assert_eq!(stamps(&seen[0]).collect::<Vec<_>>(), vec![12, 34]);
        assert!(seen[1].starts_with(b"event: control"));
        assert_eq!(stamps(&seen[1]).count(), 0);
    }
}
