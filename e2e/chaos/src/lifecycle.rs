//! A client of whole stream lifecycles, under the same faults as the appends: in a bucket of its
//! own, round after round, it creates a stream, appends three records to it with an idempotent
//! producer, forks it, appends to the fork, closes the source, tries one more append to the
//! closed source (which must be refused), and deletes one of the two (the source on even rounds:
//! a soft delete, as the fork still reads its data; the fork on odd ones). Before the close it
//! also writes the same three records to a third stream, publishes a snapshot there after the
//! second and advances its retention past the first. Each step is sent
//! again until it is answered, as a user's retrying client would: every step is idempotent, so
//! a retry of one whose fate was unknown is answered as done.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};

use ursula_testkit::cluster::TestCluster;

use crate::history::{LifecycleLog, Round, RoundRemains, Step};
use crate::schedule::Entry;
use crate::workload::Entries;

pub fn bucket(client: usize) -> String {
    format!("chaos-life-{client}")
}

pub fn source_path(client: usize, round: u64) -> String {
    format!("/{}/s{round}", bucket(client))
}

pub fn fork_path(client: usize, round: u64) -> String {
    format!("/{}/f{round}", bucket(client))
}

/// The stream with a snapshot and a retention point.
pub fn retained_path(client: usize, round: u64) -> String {
    format!("/{}/r{round}", bucket(client))
}

/// The snapshot's body, published at `snapshot_offset`.
pub const SNAPSHOT: &str = "snapshot\n";

/// The offset after the first `records` of a round's records, as the API spells it.
pub fn offset_after(client: usize, round: u64, records: usize) -> String {
    let bytes: usize = source_records(client, round)
        .lines()
        .take(records)
        .map(|line| line.len() + 1)
        .sum();
    format!("0000000000000000_{bytes:016}")
}

/// The records of a round: three in the source, one of the fork's own.
pub fn source_records(client: usize, round: u64) -> String {
    (0..3).map(|i| format!("l{client}.{round}.{i}\n")).collect()
}

pub fn fork_record(client: usize, round: u64) -> String {
    format!("l{client}.{round}.f\n")
}

const TEXT: (&str, &str) = ("content-type", "text/plain");

/// What round `round` of `client` left, read from the leaders once everything healed.
pub async fn remains(cluster: &TestCluster, client: usize, round: u64) -> RoundRemains {
    let stream = async |path: String| {
        let (bytes, last) = cluster.read_if_there(&path, "-1").await?;
        let closed = last.header("stream-closed") == Some("true");
        Some((String::from_utf8_lossy(&bytes).into_owned(), closed))
    };
    let get = async |path: String| cluster.get_from_leader(&path).await;
    let retained = retained_path(client, round);
    let retained_from = cluster
        .read_if_there(&retained, &offset_after(client, round, 1))
        .await
        .map(|(bytes, _)| String::from_utf8_lossy(&bytes).into_owned());
    let below = get(format!(
        "{retained}?offset={}",
        offset_after(client, round, 0)
    ))
    .await;
    let snapshot = get(format!(
        "{retained}/snapshot/{}",
        offset_after(client, round, 2)
    ))
    .await;
    RoundRemains {
        source: stream(source_path(client, round)).await,
        fork: stream(fork_path(client, round)).await,
        retained_from,
        below_retention: (
            below.status.as_u16(),
            below.header("stream-retained-offset").map(str::to_owned),
        ),
        snapshot: (snapshot.status.as_u16(), snapshot.text()),
    }
}

/// One step of a round, as it is sent.
struct Request {
    step: Step,
    method: Method,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Bytes,
}

impl Request {
    fn new(step: Step, method: Method, path: &str) -> Self {
        Self {
            step,
            method,
            path: path.to_owned(),
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// An append of `line` as seq `seq` of `producer`.
    fn produced(step: Step, path: &str, producer: &str, seq: usize, line: String) -> Self {
        Self::new(step, Method::POST, path)
            .header("producer-id", producer)
            .header("producer-epoch", "0")
            .header("producer-seq", seq.to_string())
            .body(line)
    }
}

/// Round `n` of `client`, step by step.
fn plan(client: usize, n: u64) -> Vec<Request> {
    let (source, fork, retained) = (
        source_path(client, n),
        fork_path(client, n),
        retained_path(client, n),
    );
    let records: Vec<String> = source_records(client, n)
        .lines()
        .map(|line| format!("{line}\n"))
        .collect();
    let mut plan = vec![Request::new(Step::Create, Method::PUT, &source)];
    for (seq, line) in records.iter().enumerate() {
        let producer = format!("l{client}-{n}");
        plan.push(Request::produced(
            Step::Append,
            &source,
            &producer,
            seq,
            line.clone(),
        ));
    }
    plan.push(Request::new(Step::Fork, Method::PUT, &fork).header("stream-forked-from", &source));
    let fork_producer = format!("l{client}-{n}-f");
    plan.push(Request::produced(
        Step::AppendToFork,
        &fork,
        &fork_producer,
        0,
        fork_record(client, n),
    ));
    plan.push(Request::new(Step::CreateRetained, Method::PUT, &retained));
    for (seq, line) in records.iter().enumerate() {
        let producer = format!("l{client}-{n}-r");
        plan.push(Request::produced(
            Step::AppendRetained,
            &retained,
            &producer,
            seq,
            line.clone(),
        ));
    }
    let snapshot = format!("{retained}/snapshot/{}", offset_after(client, n, 2));
    plan.push(Request::new(Step::Snapshot, Method::PUT, &snapshot).body(SNAPSHOT));
    let retention = format!("{retained}/retention/{}", offset_after(client, n, 1));
    plan.push(Request::new(Step::Retain, Method::PUT, &retention));
    plan.push(Request::new(Step::Close, Method::POST, &source).header("stream-closed", "true"));
    plan.push(if n.is_multiple_of(2) {
        Request::new(Step::DeleteSource, Method::DELETE, &source)
    } else {
        Request::new(Step::DeleteFork, Method::DELETE, &fork)
    });
    plan
}

pub async fn run(
    entries: Arc<Entries>,
    client: usize,
    mut entry: Entry,
    stop: Arc<AtomicBool>,
) -> LifecycleLog {
    let mut log = LifecycleLog {
        client,
        rounds: Vec::new(),
    };
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut round = Round {
            n,
            ..Round::default()
        };
        let source = source_path(client, n);
        let mut finished = true;
        for request in plan(client, n) {
            if matches!(request.step, Step::DeleteSource | Step::DeleteFork) {
                // The closed source refuses an append, and says it is closed.
                let reply = entries
                    .attempt(entry, Method::POST, &source, &[TEXT], Bytes::from("late\n"))
                    .await;
                if let Some(reply) = reply
                    && reply.status.is_success()
                {
                    round.appended_after_close = Some(format!("{} from {source}", reply.status));
                }
            }
            round.attempted.push(request.step);
            if until_done(&entries, &mut entry, &request, &stop, &mut round.odd).await {
                round.done.push(request.step);
            } else {
                finished = false;
                break;
            }
        }
        log.rounds.push(round);
        if !finished {
            break;
        }
        n += 1;
    }
    log
}

/// Sends one step until it is answered as done (giving up 30 s after `stop`); answers that are
/// neither done nor a refusal that may come under a fault go to `odd`.
async fn until_done(
    entries: &Entries,
    entry: &mut Entry,
    request: &Request,
    stop: &AtomicBool,
    odd: &mut Vec<String>,
) -> bool {
    let Request {
        step,
        method,
        path,
        body,
        ..
    } = request;
    let mut headers: Vec<(&str, &str)> = vec![TEXT];
    headers.extend(request.headers.iter().map(|(k, v)| (*k, v.as_str())));
    let mut stopped_at = None;
    let mut unknown_before = false;
    loop {
        if stop.load(Ordering::Relaxed)
            && stopped_at.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(30)
        {
            return false;
        }
        let reply = entries
            .attempt(*entry, method.clone(), path, &headers, body.clone())
            .await;
        if let Some(reply) = &reply {
            let status = reply.status;
            let done = match step {
                Step::Create | Step::Fork | Step::CreateRetained | Step::Snapshot => {
                    status == StatusCode::CREATED || status == StatusCode::OK
                }
                Step::Append | Step::AppendToFork | Step::AppendRetained | Step::Retain => {
                    status == StatusCode::OK || status == StatusCode::NO_CONTENT
                }
                Step::Close => status == StatusCode::NO_CONTENT,
                // A 404 (410 for a source its fork keeps) after an attempt of unknown fate:
                // that attempt deleted it.
                Step::DeleteSource | Step::DeleteFork => {
                    status == StatusCode::NO_CONTENT
                        || (matches!(status, StatusCode::NOT_FOUND | StatusCode::GONE)
                            && unknown_before)
                }
            };
            if done {
                return true;
            }
            let marked = reply.header("x-ursula-not-applied").is_some();
            if !marked && status != StatusCode::SERVICE_UNAVAILABLE {
                odd.push(format!("{step:?} {path}: {status} {}", reply.text()));
            }
            unknown_before |= !marked;
        } else {
            unknown_before = true;
        }
        *entry = entries.next(*entry);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_is_every_step_in_order_and_deletes_one_of_two() {
        use Step::*;
        let even = plan(1, 2);
        let steps: Vec<Step> = even.iter().map(|r| r.step).collect();
        assert_eq!(
            steps,
            [
                Create,
                Append,
                Append,
                Append,
                Fork,
                AppendToFork,
                CreateRetained,
                AppendRetained,
                AppendRetained,
                AppendRetained,
                Snapshot,
                Retain,
                Close,
                DeleteSource
            ]
        );
        let paths: Vec<&str> = even.iter().map(|r| r.path.as_str()).collect();
        // "l1.2.0\n" is 7 bytes: retention after the first record, the snapshot after two.
        assert!(paths.contains(&"/chaos-life-1/r2/retention/0000000000000000_0000000000000007"));
        assert!(paths.contains(&"/chaos-life-1/r2/snapshot/0000000000000000_0000000000000014"));
        assert_eq!(
            even[4].headers,
            [("stream-forked-from", "/chaos-life-1/s2".to_owned())]
        );
        assert_eq!(even[3].body, "l1.2.2\n");
        let odd = plan(1, 3);
        let last = odd.last().expect("a delete");
        assert_eq!(
            (last.step, last.path.as_str()),
            (DeleteFork, "/chaos-life-1/f3")
        );
    }
}
