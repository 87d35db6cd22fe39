//! Durability under SIGKILL: real `ursula-node` processes, concurrent producers, a kill at a
//! different moment each round, a restart on the same data directory. Every acknowledged
//! append must be there, in order, exactly once; nothing unacknowledged may be half visible;
//! retries of in-flight appends with the same producer triple must never duplicate.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Method, StatusCode};
use ursula_testkit::Client;
use ursula_testkit::node::NodeProcess as Process;

const STREAMS: usize = 6;
const WRITERS: usize = 18;

fn produce_headers(writer: usize, seq: u64) -> Vec<(String, String)> {
    vec![
        ("content-type".into(), "text/plain".into()),
        ("producer-id".into(), format!("w{writer}")),
        ("producer-epoch".into(), "0".into()),
        ("producer-seq".into(), seq.to_string()),
    ]
}

async fn append(client: &Client, writer: usize, seq: u64) -> Result<StatusCode, String> {
    let headers = produce_headers(writer, seq);
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let body = format!("w{writer}:{seq}\n");
    let path = format!("/crash/s{}", writer % STREAMS);
    client
        .try_send(Method::POST, &path, &headers, body)
        .await
        .map(|reply| reply.status)
}

/// Each writer's sequence numbers found in the streams, in stream order.
async fn found(client: &Client) -> HashMap<usize, Vec<u64>> {
    let mut seen: HashMap<usize, Vec<u64>> = HashMap::new();
    for s in 0..STREAMS {
        let (bytes, _) = client.read_all(&format!("/crash/s{s}")).await;
        let text = String::from_utf8(bytes).expect("utf-8");
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "a torn append is visible: {text:?}"
        );
        for line in text.lines() {
            let (writer, seq) = line
                .strip_prefix('w')
                .and_then(|l| l.split_once(':'))
                .unwrap_or_else(|| panic!("a torn or foreign line: {line:?}"));
            let writer: usize = writer.parse().expect("writer");
            assert_eq!(writer % STREAMS, s, "an append landed in another stream");
            seen.entry(writer)
                .or_default()
                .push(seq.parse().expect("seq"));
        }
    }
    seen
}

fn round(seed: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let node = Process::start(dir.path(), &[]);
    let client = node.client();
    let acked: Vec<i64> = runtime.block_on(async {
        client.create_streams("crash", STREAMS, "text/plain").await;
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let client = client.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut last_acked: i64 = -1;
                    let mut seq = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        match append(&client, writer, seq).await {
                            Ok(StatusCode::OK) => {
                                last_acked = seq as i64;
                                seq += 1;
                            }
                            Ok(other) => panic!("writer {writer} seq {seq}: unexpected {other}"),
                            Err(_) => break,
                        }
                    }
                    last_acked
                })
            })
            .collect();
        // Let load build, then kill at a moment that differs per round.
        tokio::time::sleep(Duration::from_millis(250 + seed * 173 % 400)).await;
        let killer = tokio::task::spawn_blocking(move || node.kill());
        killer.await.expect("kill");
        stop.store(true, Ordering::Relaxed);
        let mut acked = Vec::new();
        for writer in writers {
            acked.push(writer.await.expect("writer"));
        }
        acked
    });
    assert!(
        acked.iter().sum::<i64>() > WRITERS as i64,
        "too little load before the kill: {acked:?}"
    );

    let node = Process::start(dir.path(), &[]);
    let client = node.client();
    runtime.block_on(async {
        let seen = found(&client).await;
        for (writer, last_acked) in acked.iter().enumerate() {
            let seqs = seen.get(&writer).cloned().unwrap_or_default();
            let expected: Vec<u64> = (0..seqs.len() as u64).collect();
            assert_eq!(
                seqs, expected,
                "writer {writer}: appends missing, repeated or reordered"
            );
            let n = seqs.len() as i64 - 1;
            assert!(
                n >= *last_acked,
                "writer {writer}: acknowledged {last_acked} but found up to {n}"
            );
            assert!(
                n <= last_acked + 1,
                "writer {writer}: found {n}, beyond the one in flight"
            );
            // Retry the append that was in flight: applied once, whatever happened to it.
            let retry = append(&client, writer, (last_acked + 1) as u64)
                .await
                .expect("retry");
            let applied_before = n == last_acked + 1;
            let expected_status = if applied_before {
                StatusCode::NO_CONTENT
            } else {
                StatusCode::OK
            };
            assert_eq!(
                retry,
                expected_status,
                "writer {writer}: retry of seq {}",
                last_acked + 1
            );
        }
        let seen = found(&client).await;
        for (writer, last_acked) in acked.iter().enumerate() {
            let expected: Vec<u64> = (0..=(last_acked + 1) as u64).collect();
            assert_eq!(
                seen.get(&writer).cloned().unwrap_or_default(),
                expected,
                "writer {writer}"
            );
        }
    });
    drop(node);
}

#[test]
fn acknowledged_appends_survive_sigkill() {
    for seed in 1..=3 {
        round(seed);
    }
}

#[test]
fn closure_producers_and_ttl_survive_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let node = Process::start(dir.path(), &[]);
    let client = node.client();
    runtime.block_on(async {
        client.put("/keep", &[], "").await;
        let ttl = [("content-type", "text/plain"), ("stream-ttl", "3600")];
        assert_eq!(
            client.put("/keep/c", &ttl, "data").await.status,
            StatusCode::CREATED
        );
        assert_eq!(append_to(&client, "/keep/c", 0).await, StatusCode::OK);
        let close = client
            .post("/keep/c", &[("stream-closed", "true")], "")
            .await;
        assert_eq!(close.status, StatusCode::NO_CONTENT);
    });
    node.kill();
    let node = Process::start(dir.path(), &[]);
    let client = node.client();
    runtime.block_on(async {
        let head = client.send(Method::HEAD, "/keep/c", &[], "").await;
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.header("stream-closed"), Some("true"));
        assert_eq!(head.header("stream-ttl"), Some("3600"));
        let (bytes, last) = client.read_all("/keep/c").await;
        assert_eq!(bytes, b"datap0");
        assert_eq!(last.header("stream-closed"), Some("true"));
        // The producer's state survived: its retry is a duplicate, not a second append.
        let retry = client
            .post(
                "/keep/c",
                &[
                    ("content-type", "text/plain"),
                    ("producer-id", "p"),
                    ("producer-epoch", "0"),
                    ("producer-seq", "0"),
                ],
                "p0",
            )
            .await;
        assert_eq!(retry.status, StatusCode::NO_CONTENT);
    });
}

async fn append_to(client: &Client, path: &str, seq: u64) -> StatusCode {
    let seq = seq.to_string();
    let headers = [
        ("content-type", "text/plain"),
        ("producer-id", "p"),
        ("producer-epoch", "0"),
        ("producer-seq", seq.as_str()),
    ];
    client.post(path, &headers, format!("p{seq}")).await.status
}
