//! The clients of a run, each recording what it saw (`history`): idempotent producers that retry
//! an append of unknown fate with the same seq until it is answered, writers of plain appends
//! that never retry, catch-up readers and SSE followers. Each enters through a voter (following
//! redirects, trying the next voter when one does not answer) or through the gateway.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use ursula_testkit::cluster::TestCluster;
use ursula_testkit::{Client, Reply};

use crate::history::{FollowLog, Outcome, PlainLog, ProducerLog, ReadLog};
use crate::schedule::Entry;

/// Where the clients send requests, and the run's clock.
pub struct Entries {
    pub cluster: Arc<TestCluster>,
    pub gateways: Vec<std::net::SocketAddr>,
    pub started: Instant,
}

/// A text stream per index, each in its own bucket (so they spread over groups).
pub fn stream_path(stream: usize) -> String {
    format!("/chaos-{stream}/s")
}

pub fn bucket(stream: usize) -> String {
    format!("chaos-{stream}")
}

const TEXT: (&str, &str) = ("content-type", "text/plain");
/// One attempt's patience: a request not answered by then has an unknown fate.
const ATTEMPT: Duration = Duration::from_secs(6);

impl Entries {
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// One attempt of a request: through the gateway, or to voter `v`, following its
    /// redirects (a 307 applies nothing). `None`: no answer, fate unknown.
    pub async fn attempt(
        &self,
        entry: Entry,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Option<Reply> {
        Some(
            self.attempt_via(entry, method, path, headers, body)
                .await?
                .0,
        )
    }

    /// `attempt`, also naming who answered: `gateway` or `voter N`.
    pub async fn attempt_via(
        &self,
        entry: Entry,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Option<(Reply, String)> {
        let mut at = match entry {
            Entry::Gateway(g) => {
                let client = Client::new(self.gateways[g]);
                let reply =
                    tokio::time::timeout(ATTEMPT, client.try_send(method, path, headers, body))
                        .await
                        .ok()?
                        .ok()?;
                return Some((reply, "gateway".into()));
            }
            Entry::Voter(v) => v,
        };
        for _ in 0..4 {
            let client = self.cluster.voters[at].client();
            let reply = tokio::time::timeout(
                ATTEMPT,
                client.try_send(method.clone(), path, headers, body.clone()),
            )
            .await
            .ok()?
            .ok()?;
            if reply.status != StatusCode::TEMPORARY_REDIRECT {
                return Some((reply, format!("voter {}", at + 1)));
            }
            at = reply
                .header("x-ursula-leader-id")
                .and_then(|id| id.parse::<usize>().ok())
                .filter(|id| (1..=self.cluster.voters.len()).contains(id))?
                - 1;
        }
        None
    }

    /// The next voter to try after `entry` did not answer (the gateway stays the gateway).
    pub fn next(&self, entry: Entry) -> Entry {
        match entry {
            Entry::Gateway(g) => Entry::Gateway(g),
            Entry::Voter(v) => Entry::Voter((v + 1) % self.cluster.voters.len()),
        }
    }
}

fn outcome_of(reply: &Option<Reply>) -> (Outcome, Option<String>) {
    let Some(reply) = reply else {
        return (Outcome::Unknown, None);
    };
    let marked = reply.header("x-ursula-not-applied").is_some();
    match reply.status {
        StatusCode::OK | StatusCode::CREATED => (Outcome::Applied, None),
        StatusCode::NO_CONTENT => (Outcome::Duplicate, None),
        StatusCode::SERVICE_UNAVAILABLE if marked => (Outcome::MarkedRefusal, None),
        StatusCode::SERVICE_UNAVAILABLE => (Outcome::Unknown, None),
        // A seq that overtook the one before it (several in flight): sent again, as the
        // official client does.
        StatusCode::CONFLICT if reply.header("producer-expected-seq").is_some() => {
            (Outcome::Unknown, None)
        }
        other => (
            if marked {
                Outcome::MarkedRefusal
            } else {
                Outcome::Unknown
            },
            Some(format!("{other} {}", reply.text())),
        ),
    }
}

/// Producer `id` appends `p{id}:{seq}` to `stream` until `stop`, with up to `in_flight`
/// seqs sent at once, each sent again until it is answered; after `stop` it finishes the seqs
/// it has taken. Unexpected answers are pushed to `unexpected`.
pub async fn produce(
    entries: Arc<Entries>,
    id: usize,
    stream: usize,
    entry: Entry,
    in_flight: usize,
    stop: Arc<AtomicBool>,
    unexpected: Arc<parking_lot::Mutex<Vec<String>>>,
) -> ProducerLog {
    let log = Arc::new(parking_lot::Mutex::new(ProducerLog {
        stream,
        id,
        ..ProducerLog::default()
    }));
    let next_seq = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let senders: Vec<_> = (0..in_flight)
        .map(|_| {
            let sender = Sender {
                entries: entries.clone(),
                id,
                stream,
                log: log.clone(),
                unexpected: unexpected.clone(),
            };
            let (next_seq, stop) = (next_seq.clone(), stop.clone());
            tokio::spawn(async move {
                let mut entry = entry;
                while !stop.load(Ordering::Relaxed) {
                    let seq = next_seq.fetch_add(1, Ordering::Relaxed);
                    entry = sender.send_until_answered(seq, entry, &stop).await;
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.expect("producer sender");
    }
    let mut log = std::mem::take(&mut *log.lock());
    log.acked.sort_unstable();
    log
}

/// One of a producer's requests in flight.
struct Sender {
    entries: Arc<Entries>,
    id: usize,
    stream: usize,
    log: Arc<parking_lot::Mutex<ProducerLog>>,
    unexpected: Arc<parking_lot::Mutex<Vec<String>>>,
}

impl Sender {
    /// Sends `seq` until it is answered as applied or duplicate (giving up 60 s after `stop`);
    /// returns the entry to use next.
    async fn send_until_answered(&self, seq: u64, mut entry: Entry, stop: &AtomicBool) -> Entry {
        let (entries, id) = (&self.entries, self.id);
        let path = stream_path(self.stream);
        let producer = format!("p{id}");
        let mut stopped_at = None;
        loop {
            if stop.load(Ordering::Relaxed)
                && stopped_at.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(60)
            {
                self.unexpected.lock().push(format!(
                    "producer {id}: seq {seq} unanswered 60 s after the faults healed"
                ));
                return entry;
            }
            let seq_text = seq.to_string();
            let headers = [
                TEXT,
                ("producer-id", producer.as_str()),
                ("producer-epoch", "0"),
                ("producer-seq", seq_text.as_str()),
            ];
            let body = Bytes::from(format!("p{id}:{seq}\n"));
            let reply = entries
                .attempt(entry, Method::POST, &path, &headers, body)
                .await;
            let (outcome, odd) = outcome_of(&reply);
            if let Some(odd) = odd {
                self.unexpected
                    .lock()
                    .push(format!("producer {id} seq {seq}: {odd}"));
            }
            {
                let mut log = self.log.lock();
                log.attempts.push((seq, outcome));
                if matches!(outcome, Outcome::Applied | Outcome::Duplicate) {
                    log.acked.push((seq, entries.now_ms()));
                    return entry;
                }
            }
            // Not applied, or not known to be: sent again (a seq that overtook the one before
            // it soon, to the same place).
            let overtook = reply
                .as_ref()
                .is_some_and(|r| r.status == StatusCode::CONFLICT);
            if !overtook {
                entry = entries.next(entry);
            }
            let pause = if overtook { 10 } else { 50 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }
}

/// Plain appends `q{id}:{n}`, each sent once, whatever its answer.
pub async fn write_plain(
    entries: Arc<Entries>,
    id: usize,
    stream: usize,
    mut entry: Entry,
    stop: Arc<AtomicBool>,
    unexpected: Arc<parking_lot::Mutex<Vec<String>>>,
) -> PlainLog {
    let mut log = PlainLog {
        stream,
        id,
        writes: Vec::new(),
    };
    let path = stream_path(stream);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let body = Bytes::from(format!("q{id}:{n}\n"));
        let reply = entries
            .attempt(entry, Method::POST, &path, &[TEXT], body)
            .await;
        let (outcome, odd) = outcome_of(&reply);
        if let Some(odd) = odd {
            unexpected.lock().push(format!("plain {id} n {n}: {odd}"));
        }
        log.writes.push((n, outcome, entries.now_ms()));
        if outcome != Outcome::Applied {
            entry = entries.next(entry);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    log
}

/// Whole-stream catch-up reads, one after the other; a read that meets a fault (no answer, a
/// 503) is dropped, not recorded.
pub async fn read(
    entries: Arc<Entries>,
    stream: usize,
    mut entry: Entry,
    stop: Arc<AtomicBool>,
) -> Vec<ReadLog> {
    let mut reads = Vec::new();
    let path = stream_path(stream);
    while !stop.load(Ordering::Relaxed) {
        let started_at = entries.now_ms();
        let mut offset = "-1".to_owned();
        let mut bytes = Vec::new();
        let mut via = Vec::new();
        let complete = loop {
            let target = format!("{path}?offset={offset}");
            let Some((reply, answered_by)) = entries
                .attempt_via(entry, Method::GET, &target, &[], Bytes::new())
                .await
            else {
                break false;
            };
            via.push(answered_by);
            if reply.status != StatusCode::OK {
                break false;
            }
            bytes.extend_from_slice(&reply.body);
            let Some(next) = reply.header("stream-next-offset") else {
                break false;
            };
            offset = next.to_owned();
            if reply.header("stream-up-to-date") == Some("true") {
                break true;
            }
        };
        if complete {
            via.dedup();
            reads.push(ReadLog {
                stream,
                started_at,
                bytes: String::from_utf8_lossy(&bytes).into_owned(),
                via: via.join(", "),
            });
        } else {
            entry = entries.next(entry);
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    reads
}

/// A long-poll follower from the stream's start: each answer's bytes appended, its next offset
/// the next request's, until `stop`.
pub async fn poll(
    entries: Arc<Entries>,
    stream: usize,
    mut entry: Entry,
    stop: Arc<AtomicBool>,
) -> FollowLog {
    let path = stream_path(stream);
    let mut log = FollowLog::new(stream);
    let mut offset = "-1".to_owned();
    while !stop.load(Ordering::Relaxed) {
        let target = format!("{path}?offset={offset}&live=long-poll");
        let reply = entries
            .attempt(entry, Method::GET, &target, &[], Bytes::new())
            .await;
        let next = reply.as_ref().and_then(|reply| {
            let answered = matches!(reply.status, StatusCode::OK | StatusCode::NO_CONTENT);
            answered.then(|| reply.header("stream-next-offset"))?
        });
        match (reply.as_ref(), next) {
            (Some(reply), Some(next)) => {
                log.data.push_str(&String::from_utf8_lossy(&reply.body));
                offset = next.to_owned();
            }
            _ => {
                entry = entries.next(entry);
                log.reconnects += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    log
}

/// An SSE follower from the stream's start, reconnecting from the last offset it was given
/// whenever its response ends or fails, until `stop`.
pub async fn follow(
    entries: Arc<Entries>,
    stream: usize,
    mut entry: Entry,
    stop: Arc<AtomicBool>,
) -> FollowLog {
    let path = stream_path(stream);
    let mut log = FollowLog::new(stream);
    let mut offset = "-1".to_owned();
    while !stop.load(Ordering::Relaxed) {
        let target = format!("{path}?offset={offset}&live=sse");
        let voters: Vec<std::net::SocketAddr> = entries
            .cluster
            .voters
            .iter()
            .map(|v| (v.ip, v.client_port).into())
            .collect();
        let first = match entry {
            Entry::Gateway(g) => entries.gateways[g],
            Entry::Voter(v) => voters[v],
        };
        match crate::sse::subscribe(first, &voters, &target, &stop).await {
            Ok(mut events) => {
                // A data event counts once its control event came: a client that loses the
                // connection between the two resumes from the previous offset and reads it
                // again.
                let mut pending = String::new();
                while let Some(event) = events.next(&stop).await {
                    match event {
                        crate::sse::Event::Data(text) => pending = text,
                        crate::sse::Event::Control { next } => {
                            log.data.push_str(&pending);
                            pending.clear();
                            offset = next;
                        }
                    }
                }
            }
            Err(_) => entry = entries.next(entry),
        }
        log.reconnects += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    log
}
