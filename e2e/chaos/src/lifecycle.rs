//! A client of whole stream lifecycles, under the same faults as the appends: in a bucket of its
//! own, round after round, it creates a stream, appends three records to it with an idempotent
//! producer, forks it, appends to the fork, closes the source, tries one more append to the
//! closed source (which must be refused), and deletes one of the two (the source on even rounds:
//! a soft delete, as the fork still reads its data; the fork on odd ones). Each step is sent
//! again until it is answered, as a user's retrying client would: every step is idempotent, so
//! a retry of one whose fate was unknown is answered as done.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::history::{LifecycleLog, Round, Step};
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

/// The records of a round: three in the source, one of the fork's own.
pub fn source_records(client: usize, round: u64) -> String {
    (0..3).map(|i| format!("l{client}.{round}.{i}\n")).collect()
}

pub fn fork_record(client: usize, round: u64) -> String {
    format!("l{client}.{round}.f\n")
}

const TEXT: (&str, &str) = ("content-type", "text/plain");

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
            done: Vec::new(),
            attempted: Vec::new(),
            appended_after_close: None,
            odd: Vec::new(),
        };
        let source = source_path(client, n);
        let fork = fork_path(client, n);
        let producer = format!("l{client}-{n}");
        let fork_producer = format!("l{client}-{n}-f");
        let forked_from = ("stream-forked-from", source.as_str());
        let closing = ("stream-closed", "true");
        let seq_headers = |producer: &str, seq: u64| {
            vec![
                ("producer-id".to_owned(), producer.to_owned()),
                ("producer-epoch".to_owned(), "0".to_owned()),
                ("producer-seq".to_owned(), seq.to_string()),
            ]
        };
        let delete = if n % 2 == 0 {
            (Step::DeleteSource, source.as_str())
        } else {
            (Step::DeleteFork, fork.as_str())
        };
        let mut plan: Vec<(Step, Method, &str, Vec<(String, String)>, Bytes)> = vec![(
            Step::Create,
            Method::PUT,
            source.as_str(),
            Vec::new(),
            Bytes::new(),
        )];
        for (i, line) in source_records(client, n).lines().enumerate() {
            plan.push((
                Step::Append,
                Method::POST,
                &source,
                seq_headers(&producer, i as u64),
                Bytes::from(format!("{line}\n")),
            ));
        }
        plan.push((
            Step::Fork,
            Method::PUT,
            &fork,
            vec![(forked_from.0.into(), forked_from.1.into())],
            Bytes::new(),
        ));
        plan.push((
            Step::AppendToFork,
            Method::POST,
            &fork,
            seq_headers(&fork_producer, 0),
            Bytes::from(fork_record(client, n)),
        ));
        plan.push((
            Step::Close,
            Method::POST,
            &source,
            vec![(closing.0.into(), closing.1.into())],
            Bytes::new(),
        ));
        plan.push((delete.0, Method::DELETE, delete.1, Vec::new(), Bytes::new()));
        let mut finished = true;
        for (step, method, path, extra, body) in plan {
            if step == delete.0 {
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
            let mut headers: Vec<(&str, &str)> = vec![TEXT];
            headers.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            round.attempted.push(step);
            let done = until_done(
                &entries,
                &mut entry,
                step,
                method,
                path,
                &headers,
                body,
                &stop,
                &mut round.odd,
            );
            match done.await {
                true => round.done.push(step),
                false => {
                    finished = false;
                    break;
                }
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
#[allow(clippy::too_many_arguments)]
async fn until_done(
    entries: &Entries,
    entry: &mut Entry,
    step: Step,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
    stop: &AtomicBool,
    odd: &mut Vec<String>,
) -> bool {
    let mut stopped_at = None;
    let mut unknown_before = false;
    loop {
        if stop.load(Ordering::Relaxed)
            && stopped_at.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(30)
        {
            return false;
        }
        let reply = entries
            .attempt(*entry, method.clone(), path, headers, body.clone())
            .await;
        if let Some(reply) = &reply {
            let status = reply.status;
            let done = match step {
                Step::Create | Step::Fork => {
                    status == StatusCode::CREATED || status == StatusCode::OK
                }
                Step::Append | Step::AppendToFork => {
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
