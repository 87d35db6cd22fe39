use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use tokio::sync::mpsc;

use crate::client::{Client, Error};
use crate::lean::{Connections, EventStream};
use crate::stats::Latencies;

pub struct Options {
    pub subscribers: usize,
    pub rate: u64,
    pub duration: Duration,
    /// Bytes per message at least: the stamp, then filler.
    pub size: usize,
    pub live: Live,
    /// Process IDs of the server: reports their CPU time per delivery.
    pub server_pids: Vec<u32>,
}

/// How the subscribers follow the stream.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Live {
    Sse,
    /// One long-poll after another, each from the last `Stream-Next-Offset` with the last
    /// `Stream-Cursor`, as the Durable Streams client follows a stream by default.
    LongPoll,
}

pub async fn run(client: Client, prefix: &str, label: &str, o: Options) -> Result<String, Error> {
    let path = format!("{prefix}-live-{}", crate::client::run_id());
    client.create(&path, "text/plain").await?;
    let origin = Instant::now();
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u64>>();
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<()>();
    let expected = (o.rate as f64 * o.duration.as_secs_f64()).round() as usize;
    for _ in 0..o.subscribers {
        let stream = client.url(&path);
        let tx = tx.clone();
        let ready = ready_tx.clone();
        tokio::spawn(async move {
            let samples = match o.live {
                Live::Sse => follow_sse(&stream, origin, expected, ready).await,
                Live::LongPoll => follow_long_polls(&stream, origin, expected, ready).await,
            };
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
    let cpu_before = crate::cpu::seconds(&o.server_pids);
    let interval = Duration::from_nanos(1_000_000_000 / o.rate.max(1));
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for _ in 0..expected {
        tick.tick().await;
        let mut stamp = format!("{} ", origin.elapsed().as_nanos());
        if stamp.len() < o.size {
            // Filler the stamp reader skips: no digits.
            stamp.extend(std::iter::repeat_n('x', o.size - stamp.len() - 1));
            stamp.push(' ');
        }
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
    let cpu_after = crate::cpu::seconds(&o.server_pids);
    let latencies = Latencies::new(samples);
    let deliveries = latencies.count();
    // The appends' own cost is included; with many subscribers per append, deliveries dominate.
    let server_cpu_us = match (cpu_before, cpu_after) {
        (Some(before), Some(after)) if !o.server_pids.is_empty() && deliveries > 0 => {
            Some((after - before) * 1e6 / deliveries as f64)
        }
        _ => None,
    };
    let kind = match o.live {
        Live::Sse => "sse",
        Live::LongPoll => "long-poll",
    };
    eprintln!(
        "{label}: {kind} {} subscribers x {expected} messages at {}/s: delivered {deliveries} of {} ({complete} complete); latency ms p50 {:.3} p99 {:.3} max {:.3}",
        o.subscribers,
        o.rate,
        expected * o.subscribers,
        latencies.percentile(50.0),
        latencies.percentile(99.0),
        latencies.max()
    );
    Ok(serde_json::json!({
        "bench": kind,
        "label": label,
        "subscribers": o.subscribers,
        "rate": o.rate,
        "expected_deliveries": expected * o.subscribers,
        "deliveries": deliveries,
        "p50_ms": latencies.percentile(50.0),
        "p99_ms": latencies.percentile(99.0),
        "max_ms": latencies.max(),
        "server_cpu_us_per_delivery": server_cpu_us,
    })
    .to_string())
}

/// Follows the stream with one SSE response; the send times of what it delivered, as
/// latencies.
async fn follow_sse(
    stream: &str,
    origin: Instant,
    expected: usize,
    ready: mpsc::UnboundedSender<()>,
) -> Vec<u64> {
    let mut samples = Vec::with_capacity(expected);
    let Ok(mut events_in) = EventStream::open(&format!("{stream}?offset=now&live=sse")).await
    else {
        return samples;
    };
    let mut events = Events::default();
    let mut announced = false;
    let mut data = Vec::with_capacity(4096);
    while samples.len() < expected {
        data.clear();
        if !matches!(events_in.next(&mut data).await, Ok(true)) {
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
    samples
}

/// Follows the stream with long-polls from its tail.
async fn follow_long_polls(
    stream: &str,
    origin: Instant,
    expected: usize,
    ready: mpsc::UnboundedSender<()>,
) -> Vec<u64> {
    let mut samples = Vec::with_capacity(expected);
    let mut connections = Connections::default();
    let Ok(tail) = connections
        .send("GET", &format!("{stream}?offset=now"), "text/plain", b"")
        .await
    else {
        return samples;
    };
    let Some(mut at) = tail.next_offset else {
        return samples;
    };
    let mut cursor: Option<String> = None;
    let _ = ready.send(());
    while samples.len() < expected {
        let url = match &cursor {
            Some(cursor) => format!("{stream}?offset={at}&live=long-poll&cursor={cursor}"),
            None => format!("{stream}?offset={at}&live=long-poll"),
        };
        let Ok(answer) = connections.send("GET", &url, "text/plain", b"").await else {
            break;
        };
        let now = origin.elapsed().as_nanos() as u64;
        match answer.status {
            200 => samples.extend(body_stamps(&answer.body).map(|sent| now.saturating_sub(sent))),
            204 => {}
            _ => break,
        }
        if let Some(next) = answer.next_offset {
            at = next;
        }
        cursor = answer.cursor.or(cursor);
    }
    samples
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
        .flat_map(body_stamps)
}

/// The send times in a body of messages ("<ns> " each).
fn body_stamps(body: &[u8]) -> impl Iterator<Item = u64> + '_ {
    body.split(|b| b.is_ascii_whitespace())
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
