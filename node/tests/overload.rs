//! Sustained overload: more writers with large bodies than the node's body budget and disk
//! keep up with. The node stays up, its memory stays bounded, every refusal is marked, and every
//! acknowledged append survives a SIGKILL (real process, producers with exactly-once retries).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use ursula_testkit::Client;
use ursula_testkit::node::NodeProcess as Process;

const WRITERS: usize = 48;
const BODY: usize = 64 * 1024;
/// Bodies held at once: far fewer than the writers send.
const BUDGET: u64 = 1024 * 1024;
/// Appends each writer gets acknowledged before it stops (bounds the test's run time).
const PER_WRITER: u64 = 30;

fn body(writer: usize, seq: u64) -> Bytes {
    let mut text = format!("w{writer}:{seq}:").into_bytes();
    text.resize(BODY, b'.');
    Bytes::from(text)
}

async fn append(client: &Client, writer: usize, seq: u64) -> Result<ursula_testkit::Reply, String> {
    let seq_text = seq.to_string();
    let producer = format!("w{writer}");
    let headers = [
        ("content-type", "application/octet-stream"),
        ("producer-id", producer.as_str()),
        ("producer-epoch", "0"),
        ("producer-seq", seq_text.as_str()),
    ];
    client
        .try_send(
            Method::POST,
            &format!("/load/s{writer}"),
            &headers,
            body(writer, seq),
        )
        .await
}

#[test]
fn overload_is_refused_marked_memory_stays_bounded_and_acks_survive_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let node = Process::start_with(
        dir.path(),
        &format!("http_inflight_body_size = {BUDGET}"),
        &[],
    );
    let client = node.client();
    let refused = Arc::new(AtomicU64::new(0));
    let (acked, peak_rss) = runtime.block_on(async {
        client
            .create_streams("load", WRITERS, "application/octet-stream")
            .await;
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let client = client.clone();
                let stop = stop.clone();
                let refused = refused.clone();
                tokio::spawn(async move {
                    let mut seq = 0u64;
                    while !stop.load(Ordering::Relaxed) && seq < PER_WRITER {
                        let Ok(reply) = append(&client, writer, seq).await else {
                            break;
                        };
                        match reply.status {
                            StatusCode::OK | StatusCode::NO_CONTENT => seq += 1,
                            StatusCode::SERVICE_UNAVAILABLE => {
                                // Refused before anything was proposed: marked, and retried
                                // with the same sequence number.
                                assert_eq!(
                                    reply.header("x-ursula-not-applied"),
                                    Some("IngressBodyBytesLimitReached"),
                                    "{}",
                                    reply.text()
                                );
                                assert_eq!(reply.header("retry-after"), Some("1"));
                                refused.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            other => panic!("writer {writer}: {other} {}", reply.text()),
                        }
                    }
                    seq
                })
            })
            .collect();
        let mut peak = 0;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            peak = peak.max(node.rss_bytes());
            if writers.iter().all(|w| w.is_finished()) {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let mut acked = Vec::new();
        for writer in writers {
            acked.push(writer.await.expect("writer"));
        }
        (acked, peak)
    });
    let refused = refused.load(Ordering::Relaxed);
    let total: u64 = acked.iter().sum();
    assert!(refused > 0, "the load never exceeded the body budget");
    assert!(
        total > WRITERS as u64,
        "too few appends acknowledged: {acked:?}"
    );
    // Bodies in flight are capped by the budget; the rest is the redb cache (256 MiB) and
    // tail caches. Unbounded buffering of 48 writers' bodies would pass this quickly.
    assert!(
        peak_rss < 900 * 1024 * 1024,
        "resident memory peaked at {} MiB",
        peak_rss >> 20
    );
    eprintln!(
        "overload: {total} appends acknowledged, {refused} refused (marked), peak RSS {} MiB",
        peak_rss >> 20
    );

    // SIGKILL, restart: every acknowledged append is there once and in order.
    node.kill();
    let node = Process::start(dir.path(), &[]);
    let client = node.client();
    runtime.block_on(async {
        for (writer, count) in acked.iter().enumerate() {
            let (bytes, _) = client.read_all(&format!("/load/s{writer}")).await;
            assert_eq!(bytes.len() % BODY, 0, "writer {writer}: a torn append");
            let found = (bytes.len() / BODY) as u64;
            // Writers stopped before the kill: nothing was in flight, and refused (marked)
            // appends never landed.
            assert_eq!(found, *count, "writer {writer}: acknowledged vs found");
            for (seq, chunk) in bytes.chunks(BODY).enumerate() {
                assert_eq!(
                    chunk,
                    &body(writer, seq as u64)[..],
                    "writer {writer} seq {seq}"
                );
            }
        }
    });
}
