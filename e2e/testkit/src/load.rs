//! Producer load on a cluster, and its check: producers append throughout and retry with the
//! same (Id, Epoch, Seq) whenever an answer is lost; afterwards every acknowledged append must
//! be readable, once and in order, and every running voter's own copy byte-identical.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::cluster::TestCluster;

/// Buckets (one stream each); a bucket decides the group, so these spread over groups.
pub const BUCKETS: [&str; 4] = ["fault-a", "fault-b", "fault-c", "fault-d"];
pub const WRITERS_PER_STREAM: usize = 2;

pub struct Load {
    stop: Arc<AtomicBool>,
    writers: Vec<tokio::task::JoinHandle<(usize, u64)>>,
}

/// One stream per bucket (buckets are implicit: the create brings each into being).
pub async fn create_streams(cluster: &TestCluster) {
    for bucket in BUCKETS {
        create_stream(cluster, &format!("/{bucket}/s")).await;
    }
}

/// Creates a text stream through any voter (201, or 200 if a retry finds it made).
pub async fn create_stream(cluster: &TestCluster, path: &str) {
    let reply = cluster
        .send(
            0,
            Method::PUT,
            path,
            &[("content-type", "text/plain")],
            Bytes::new(),
            Duration::from_secs(20),
        )
        .await
        .expect("an answer");
    assert!(
        reply.status == StatusCode::CREATED || reply.status == StatusCode::OK,
        "{path}: {} {}",
        reply.status,
        reply.text()
    );
}

/// Starts producers: writer `w` appends `w<w>:<seq>\n` to stream `w % BUCKETS.len()`, moving to
/// the next sequence number only once an append is acknowledged (200 new, 204 duplicate).
/// Each returns (writer, number of acknowledged appends).
pub fn start_load(cluster: &Arc<TestCluster>, seed: u64) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let writers = (0..BUCKETS.len() * WRITERS_PER_STREAM)
        .map(|writer| {
            let cluster = cluster.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let bucket = BUCKETS[writer % BUCKETS.len()];
                let path = format!("/{bucket}/s");
                let producer = format!("w{writer}");
                let mut seq = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let seq_text = seq.to_string();
                    let headers = [
                        ("content-type", "text/plain"),
                        ("producer-id", producer.as_str()),
                        ("producer-epoch", "0"),
                        ("producer-seq", seq_text.as_str()),
                    ];
                    let body = Bytes::from(format!("w{writer}:{seq}\n"));
                    let first = (writer + seed as usize) % cluster.voters.len();
                    let reply = cluster
                        .send(
                            first,
                            Method::POST,
                            &path,
                            &headers,
                            body,
                            Duration::from_secs(30),
                        )
                        .await;
                    match reply.map(|r| (r.status, r)) {
                        Some((StatusCode::OK | StatusCode::NO_CONTENT, _)) => seq += 1,
                        Some((status, reply)) => {
                            panic!("writer {writer} seq {seq}: {status} {}", reply.text())
                        }
                        None => panic!("writer {writer} seq {seq}: no voter answered"),
                    }
                }
                (writer, seq)
            })
        })
        .collect();
    Load { stop, writers }
}

impl Load {
    pub async fn finish(self) -> HashMap<usize, u64> {
        self.stop.store(true, Ordering::Relaxed);
        let mut acked = HashMap::new();
        for writer in self.writers {
            let (writer, count) = writer.await.expect("writer");
            acked.insert(writer, count);
        }
        acked
    }
}

/// Every acknowledged append is there once, in order, and nothing else is; every running
/// voter's copy is the same bytes.
pub async fn verify(cluster: &TestCluster, acked: &HashMap<usize, u64>) {
    let total: u64 = acked.values().sum();
    eprintln!("acknowledged appends: {total}");
    assert!(total >= 20, "too little load: {acked:?}");
    for (s, bucket) in BUCKETS.iter().enumerate() {
        let bytes = cluster.read_all(&format!("/{bucket}/s")).await;
        let text = String::from_utf8(bytes.clone()).expect("utf-8");
        let mut seen: HashMap<usize, Vec<u64>> = HashMap::new();
        for line in text.lines() {
            let (writer, seq) = line
                .strip_prefix('w')
                .and_then(|l| l.split_once(':'))
                .unwrap_or_else(|| panic!("a torn or foreign line: {line:?}"));
            let writer: usize = writer.parse().expect("writer");
            assert_eq!(writer % BUCKETS.len(), s, "an append in another stream");
            seen.entry(writer)
                .or_default()
                .push(seq.parse().expect("seq"));
        }
        for (writer, count) in acked.iter().filter(|(w, _)| *w % BUCKETS.len() == s) {
            let expected: Vec<u64> = (0..*count).collect();
            assert_eq!(
                seen.get(writer).cloned().unwrap_or_default(),
                expected,
                "writer {writer}: acknowledged appends missing, repeated or reordered"
            );
        }
        cluster.wait_replicas_equal(bucket, "s", &bytes).await;
    }
    // Every request was answered within the deadline (`server.request_timeout`, 5 s; a second
    // more for reading a body and writing the answer), however slow the machine.
    for (i, voter) in cluster.voters.iter().enumerate() {
        if !voter.is_running() {
            continue;
        }
        let slowest = cluster
            .slowest_request(i)
            .await
            .expect("the voter's metrics");
        assert!(
            slowest <= 6.0,
            "voter {} answered a request after {slowest:.2} s",
            voter.id
        );
    }
}
