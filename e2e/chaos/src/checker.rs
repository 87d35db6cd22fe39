//! The one checker over a recorded history. Pure: the table tests below feed it histories with
//! each anomaly planted, so that a check that cannot fail would show.

use std::collections::HashMap;
use std::fmt;

use crate::history::{History, Outcome, Round, RoundRemains, Step};
use crate::lifecycle::{SNAPSHOT, fork_record, offset_after, source_records};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Anomaly {
    /// A line that no client wrote, or a torn one.
    Foreign { stream: usize, line: String },
    /// An acknowledged append that is not in the stream.
    Lost { stream: usize, record: String },
    /// A record in the stream more than once.
    Duplicated { stream: usize, record: String },
    /// A producer's records out of seq order.
    Reordered { stream: usize, producer: usize },
    /// A write refused as not applied that is in the stream, or a producer's seq answered as a
    /// duplicate when every earlier attempt of it was refused as not applied.
    MarkedButApplied { stream: usize, record: String },
    /// A catch-up read whose bytes are not the start of the stream.
    Diverged { stream: usize, read: usize },
    /// A read that started after an append was acknowledged and does not hold it.
    Stale {
        stream: usize,
        read: usize,
        record: String,
        /// When the append was acknowledged and the read started (ms into the run), and who
        /// answered the read.
        detail: String,
    },
    /// An SSE follower's bytes are not the start of the stream.
    FollowerDiverged { stream: usize, follower: usize },
    /// A lifecycle round's streams are not what its acknowledged steps made them.
    Lifecycle {
        client: usize,
        round: u64,
        what: String,
    },
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Every anomaly in `history`.
pub fn check(history: &History) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    // Where each record is in its stream's final bytes (record -> positions, by stream).
    let mut found: Vec<HashMap<&str, Vec<usize>>> = Vec::new();
    for (stream, text) in history.finals.iter().enumerate() {
        let mut at = HashMap::new();
        for (position, line) in text.lines().enumerate() {
            if !is_record(line) {
                anomalies.push(Anomaly::Foreign {
                    stream,
                    line: line.to_owned(),
                });
            }
            at.entry(line).or_insert_with(Vec::new).push(position);
        }
        for (record, positions) in &at {
            if positions.len() > 1 {
                anomalies.push(Anomaly::Duplicated {
                    stream,
                    record: (*record).to_owned(),
                });
            }
        }
        found.push(at);
    }
    let count = |stream: usize, record: &str| {
        found
            .get(stream)
            .and_then(|at| at.get(record))
            .map_or(0, Vec::len)
    };
    // Who wrote what: a record of a writer that exists, in its own stream, was attempted.
    let mut attempted: HashMap<String, usize> = HashMap::new();

    for producer in &history.producers {
        let stream = producer.stream;
        let mut marked_only: HashMap<u64, bool> = HashMap::new();
        for &(seq, outcome) in &producer.attempts {
            attempted.insert(format!("p{}:{seq}", producer.id), stream);
            let earlier_marked = *marked_only.get(&seq).unwrap_or(&true);
            if outcome == Outcome::Duplicate && earlier_marked {
                anomalies.push(Anomaly::MarkedButApplied {
                    stream,
                    record: format!("p{}:{seq}", producer.id),
                });
            }
            marked_only.insert(seq, earlier_marked && outcome == Outcome::MarkedRefusal);
        }
        for &(seq, _) in &producer.acked {
            let record = format!("p{}:{seq}", producer.id);
            if count(stream, &record) == 0 {
                anomalies.push(Anomaly::Lost { stream, record });
            }
        }
        let prefix = format!("p{}:", producer.id);
        let seqs: Vec<u64> = history.finals[stream]
            .lines()
            .filter_map(|line| line.strip_prefix(&prefix)?.parse().ok())
            .collect();
        if seqs.windows(2).any(|w| w[0] >= w[1]) {
            anomalies.push(Anomaly::Reordered {
                stream,
                producer: producer.id,
            });
        }
    }
    for writer in &history.plain {
        let stream = writer.stream;
        for &(n, outcome, _) in &writer.writes {
            let record = format!("q{}:{n}", writer.id);
            attempted.insert(record.clone(), stream);
            let present = count(stream, &record);
            match outcome {
                Outcome::Applied | Outcome::Duplicate if present == 0 => {
                    anomalies.push(Anomaly::Lost { stream, record });
                }
                Outcome::MarkedRefusal if present > 0 => {
                    anomalies.push(Anomaly::MarkedButApplied { stream, record });
                }
                _ => {}
            }
        }
    }
    for (stream, text) in history.finals.iter().enumerate() {
        for line in text.lines().filter(|line| is_record(line)) {
            if attempted.get(line) != Some(&stream) {
                anomalies.push(Anomaly::Foreign {
                    stream,
                    line: line.to_owned(),
                });
            }
        }
    }

    // Acknowledged appends, by stream: (record, when).
    let mut acked: Vec<Vec<(String, u64)>> = vec![Vec::new(); history.finals.len()];
    for producer in &history.producers {
        for &(seq, at) in &producer.acked {
            acked[producer.stream].push((format!("p{}:{seq}", producer.id), at));
        }
    }
    for writer in &history.plain {
        for &(n, outcome, at) in &writer.writes {
            if outcome == Outcome::Applied {
                acked[writer.stream].push((format!("q{}:{n}", writer.id), at));
            }
        }
    }
    for (i, read) in history.reads.iter().enumerate() {
        let stream = read.stream;
        if !history.finals[stream].starts_with(&read.bytes) {
            anomalies.push(Anomaly::Diverged { stream, read: i });
            continue;
        }
        let lines: std::collections::HashSet<&str> = read.bytes.lines().collect();
        if let Some((record, at)) = acked[stream]
            .iter()
            .find(|(record, at)| *at < read.started_at && !lines.contains(record.as_str()))
        {
            anomalies.push(Anomaly::Stale {
                stream,
                read: i,
                record: record.clone(),
                detail: format!(
                    "acknowledged at {at} ms, read at {} ms by {}, {} of the stream's {} bytes",
                    read.started_at,
                    read.via,
                    read.bytes.len(),
                    history.finals[stream].len()
                ),
            });
        }
    }
    for (i, follow) in history.follows.iter().enumerate() {
        if !history.finals[follow.stream].starts_with(&follow.data) {
            anomalies.push(Anomaly::FollowerDiverged {
                stream: follow.stream,
                follower: i,
            });
        }
    }
    for (log, finals) in history.lifecycles.iter().zip(&history.lifecycle_finals) {
        for (round, remains) in log.rounds.iter().zip(finals) {
            for what in lifecycle_round(log.client, round, remains) {
                anomalies.push(Anomaly::Lifecycle {
                    client: log.client,
                    round: round.n,
                    what,
                });
            }
        }
    }
    anomalies
}

/// What is wrong with one lifecycle round's streams, given the steps acknowledged and sent.
fn lifecycle_round(client: usize, round: &Round, remains: &RoundRemains) -> Vec<String> {
    let (source, fork) = (&remains.source, &remains.fork);
    let mut wrong: Vec<String> = round.odd.clone();
    let done = |step| round.done.contains(&step);
    let sent = |step| round.attempted.contains(&step);
    if let Some(answer) = &round.appended_after_close {
        wrong.push(format!("an append to the closed source applied: {answer}"));
    }
    let records = source_records(client, round.n);
    let appends = round.done.iter().filter(|s| **s == Step::Append).count();
    match source {
        None if done(Step::Create) && !sent(Step::DeleteSource) => {
            wrong.push("the source is gone, and nobody deleted it".into());
        }
        Some(_) if done(Step::DeleteSource) => {
            wrong.push("the source is there after its delete was acknowledged".into());
        }
        Some((bytes, closed)) => {
            let kept = bytes.lines().count();
            if !records.starts_with(bytes.as_str()) || kept < appends {
                wrong.push(format!(
                    "the source holds {bytes:?}; {appends} of {records:?} were acknowledged"
                ));
            }
            if done(Step::Close) && !closed {
                wrong.push("the source is open after its close was acknowledged".into());
            }
            if *closed && !sent(Step::Close) {
                wrong.push("the source is closed, and nobody closed it".into());
            }
        }
        None => {}
    }
    match fork {
        None if done(Step::Fork) && !sent(Step::DeleteFork) => {
            wrong.push("the fork is gone, and nobody deleted it".into());
        }
        Some(_) if done(Step::DeleteFork) => {
            wrong.push("the fork is there after its delete was acknowledged".into());
        }
        Some(_) if !sent(Step::Fork) => wrong.push("a fork nobody made".into()),
        Some((bytes, closed)) => {
            let with_own = format!("{records}{}", fork_record(client, round.n));
            let fits = if done(Step::AppendToFork) {
                *bytes == with_own
            } else {
                *bytes == records || *bytes == with_own
            };
            if !fits {
                wrong.push(format!("the fork holds {bytes:?}, not {with_own:?}"));
            }
            if *closed {
                wrong.push("the fork is closed: a close of its source reached it".into());
            }
        }
        None => {}
    }
    if done(Step::Retain) {
        let kept: String = records.lines().skip(1).map(|l| format!("{l}\n")).collect();
        if remains.retained_from.as_deref() != Some(kept.as_str()) {
            wrong.push(format!(
                "the retained stream holds {:?} from its retention point, not {kept:?}",
                remains.retained_from
            ));
        }
        let retained_from = offset_after(client, round.n, 1);
        if remains.below_retention != (410, Some(retained_from.clone())) {
            wrong.push(format!(
                "a read below the retention point answers {:?}, not 410 from {retained_from}",
                remains.below_retention
            ));
        }
    }
    if done(Step::Snapshot) && remains.snapshot != (200, SNAPSHOT.to_owned()) {
        wrong.push(format!(
            "the snapshot reads {:?}, not 200 {SNAPSHOT:?}",
            remains.snapshot
        ));
    }
    wrong
}

/// `p{id}:{seq}` or `q{id}:{n}`.
fn is_record(line: &str) -> bool {
    let Some(rest) = line.strip_prefix('p').or_else(|| line.strip_prefix('q')) else {
        return false;
    };
    let Some((id, n)) = rest.split_once(':') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(id) && digits(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{FollowLog, LifecycleLog, PlainLog, ProducerLog, ReadLog};

    /// One stream: producer 0 wrote seqs 0..3 (acked at 10, 20, 30 ms), plain writer 0 wrote
    /// q0:0 (applied at 15 ms) and q0:1 (unknown), and the stream holds all of it.
    fn healthy() -> History {
        History {
            producers: vec![ProducerLog {
                stream: 0,
                id: 0,
                attempts: vec![
                    (0, Outcome::Applied),
                    (1, Outcome::Unknown),
                    (1, Outcome::Duplicate),
                    (2, Outcome::Applied),
                ],
                acked: vec![(0, 10), (1, 20), (2, 30)],
            }],
            plain: vec![PlainLog {
                stream: 0,
                id: 0,
                writes: vec![(0, Outcome::Applied, 15), (1, Outcome::Unknown, 40)],
            }],
            reads: vec![ReadLog {
                stream: 0,
                started_at: 25,
                bytes: "p0:0\nq0:0\np0:1\n".into(),
                via: "voter 1".into(),
            }],
            follows: vec![FollowLog {
                stream: 0,
                data: "p0:0\nq0:0\n".into(),
                reconnects: 1,
            }],
            finals: vec!["p0:0\nq0:0\np0:1\np0:2\nq0:1\n".into()],
            // Client 0's round 0 ended with a (soft) delete of its source, round 1 with a
            // delete of its fork.
            lifecycles: vec![LifecycleLog {
                client: 0,
                rounds: vec![
                    every_step(0, Step::DeleteSource),
                    every_step(1, Step::DeleteFork),
                ],
            }],
            lifecycle_finals: vec![vec![
                RoundRemains {
                    fork: Some((format!("{}l0.0.f\n", source_records(0, 0)), false)),
                    ..retained(0)
                },
                RoundRemains {
                    source: Some((source_records(0, 1), true)),
                    ..retained(1)
                },
            ]],
        }
    }

    /// A round's third stream, its snapshot published and its retention advanced.
    fn retained(n: u64) -> RoundRemains {
        RoundRemains {
            retained_from: Some(
                source_records(0, n)
                    .lines()
                    .skip(1)
                    .map(|l| format!("{l}\n"))
                    .collect(),
            ),
            below_retention: (410, Some(offset_after(0, n, 1))),
            snapshot: (200, SNAPSHOT.to_owned()),
            ..RoundRemains::default()
        }
    }

    fn every_step(n: u64, delete: Step) -> Round {
        let steps = vec![
            Step::Create,
            Step::Append,
            Step::Append,
            Step::Append,
            Step::Fork,
            Step::AppendToFork,
            Step::CreateRetained,
            Step::AppendRetained,
            Step::AppendRetained,
            Step::AppendRetained,
            Step::Snapshot,
            Step::Retain,
            Step::Close,
            delete,
        ];
        Round {
            n,
            done: steps.clone(),
            attempted: steps,
            ..Round::default()
        }
    }

    #[test]
    fn every_planted_lifecycle_anomaly_is_found() {
        type Plant = fn(&mut History);
        let cases: Vec<(Plant, u64, &str)> = vec![
            (
                |h| h.lifecycle_finals[0][1].source = Some((source_records(0, 1), false)),
                1,
                "the source is open after its close",
            ),
            (
                |h| h.lifecycle_finals[0][0].source = Some((source_records(0, 0), true)),
                0,
                "the source is there after its delete",
            ),
            (
                |h| h.lifecycle_finals[0][1].source = Some(("l0.1.0\n".into(), true)),
                1,
                "the source holds",
            ),
            (
                |h| h.lifecycle_finals[0][0].fork = Some((source_records(0, 0), false)),
                0,
                "the fork holds",
            ),
            (
                |h| h.lifecycle_finals[0][0].fork = None,
                0,
                "the fork is gone",
            ),
            (
                |h| h.lifecycle_finals[0][1].retained_from = Some(source_records(0, 1)),
                1,
                "the retained stream holds",
            ),
            (
                |h| h.lifecycle_finals[0][1].below_retention = (200, None),
                1,
                "a read below the retention point",
            ),
            (
                |h| h.lifecycle_finals[0][0].snapshot = (404, String::new()),
                0,
                "the snapshot reads",
            ),
            (
                |h| h.lifecycles[0].rounds[1].appended_after_close = Some("204".into()),
                1,
                "an append to the closed source applied",
            ),
        ];
        for (plant, round, what) in cases {
            let mut history = healthy();
            plant(&mut history);
            let found = check(&history);
            assert!(
                found.iter().any(|a| matches!(
                    a,
                    Anomaly::Lifecycle { client: 0, round: r, what: w } if *r == round && w.starts_with(what)
                )),
                "{what}: found {found:?}"
            );
        }
        // A delete of unknown fate may or may not have applied.
        let mut history = healthy();
        history.lifecycles[0].rounds[0].done.pop();
        history.lifecycle_finals[0][0].source = Some((source_records(0, 0), true));
        assert_eq!(check(&history), vec![]);
    }

    #[test]
    fn a_healthy_history_has_no_anomaly() {
        assert_eq!(check(&healthy()), vec![]);
        // An unknown plain append may also be absent.
        let mut history = healthy();
        history.finals[0] = "p0:0\nq0:0\np0:1\np0:2\n".into();
        assert_eq!(check(&history), vec![]);
    }

    #[test]
    fn every_planted_anomaly_is_found() {
        type Plant = fn(&mut History);
        let cases: Vec<(&str, Plant, Anomaly)> = vec![
            (
                "an acknowledged producer append lost",
                |h| h.finals[0] = "p0:0\nq0:0\np0:1\nq0:1\n".into(),
                Anomaly::Lost {
                    stream: 0,
                    record: "p0:2".into(),
                },
            ),
            (
                "an applied plain append lost",
                |h| {
                    h.finals[0] = "p0:0\np0:1\np0:2\n".into();
                    h.reads.clear();
                    h.follows.clear();
                },
                Anomaly::Lost {
                    stream: 0,
                    record: "q0:0".into(),
                },
            ),
            (
                "a record twice",
                |h| h.finals[0].push_str("p0:2\n"),
                Anomaly::Duplicated {
                    stream: 0,
                    record: "p0:2".into(),
                },
            ),
            (
                "a producer's records reordered",
                |h| {
                    h.finals[0] = "p0:0\nq0:0\np0:2\np0:1\nq0:1\n".into();
                    h.reads.clear();
                },
                Anomaly::Reordered {
                    stream: 0,
                    producer: 0,
                },
            ),
            (
                "a torn line",
                |h| h.finals[0].push_str("p0:\n"),
                Anomaly::Foreign {
                    stream: 0,
                    line: "p0:".into(),
                },
            ),
            (
                "a record nobody sent",
                |h| h.finals[0].push_str("q7:1\n"),
                Anomaly::Foreign {
                    stream: 0,
                    line: "q7:1".into(),
                },
            ),
            (
                "a refusal marked not applied, applied",
                |h| h.plain[0].writes[1].1 = Outcome::MarkedRefusal,
                Anomaly::MarkedButApplied {
                    stream: 0,
                    record: "q0:1".into(),
                },
            ),
            (
                "a duplicate after only marked refusals",
                |h| h.producers[0].attempts[1].1 = Outcome::MarkedRefusal,
                Anomaly::MarkedButApplied {
                    stream: 0,
                    record: "p0:1".into(),
                },
            ),
            (
                "a read that is not the stream's start",
                |h| h.reads[0].bytes = "p0:0\np0:1\n".into(),
                Anomaly::Diverged { stream: 0, read: 0 },
            ),
            (
                "a read after an acknowledgement without it",
                |h| h.reads[0].bytes = "p0:0\n".into(),
                Anomaly::Stale {
                    stream: 0,
                    read: 0,
                    record: "p0:1".into(),
                    detail: String::new(),
                },
            ),
            (
                "a follower that read other bytes",
                |h| h.follows[0].data = "p0:0\np0:1\n".into(),
                Anomaly::FollowerDiverged {
                    stream: 0,
                    follower: 0,
                },
            ),
        ];
        for (what, plant, expected) in cases {
            let mut history = healthy();
            plant(&mut history);
            // Compared without the details meant for people.
            let found: Vec<Anomaly> = check(&history)
                .into_iter()
                .map(|anomaly| match anomaly {
                    Anomaly::Stale {
                        stream,
                        read,
                        record,
                        ..
                    } => Anomaly::Stale {
                        stream,
                        read,
                        record,
                        detail: String::new(),
                    },
                    other => other,
                })
                .collect();
            assert!(found.contains(&expected), "{what}: found {found:?}");
        }
    }
}
