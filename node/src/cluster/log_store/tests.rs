use openraft::{CommittedLeaderId, EntryPayload, LogId};

use super::*;
use crate::cluster::types::Batch;
use crate::machine::Command;

fn entry(term: u64, index: u64) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Normal(Batch(vec![Command::ExpireDue { now_ms: index }])),
    }
}

impl LogStore {
    /// `append`, waiting until durable (openraft's flush callback cannot be made outside it).
    async fn append_now(&mut self, entries: Vec<Entry>) {
        let last = entries.last().map_or(0, |e| e.get_log_id().index);
        let count = entries.len() as u64;
        let encoded = postcard::to_allocvec(&entries).unwrap();
        {
            let mut state = self.state.lock();
            for entry in entries {
                state.push(entry, 1);
            }
        }
        let (done, answer) = oneshot::channel();
        let op = LogOp::Append {
            group: self.group,
            entries: encoded.into(),
        };
        self.log.submit(op, last, count, Then::Reply(done)).unwrap();
        answer.await.unwrap().unwrap();
    }

    async fn indexes(&mut self) -> Vec<(u64, u64)> {
        self.try_get_log_entries(0..u64::MAX)
            .await
            .unwrap()
            .iter()
            .map(|e| (e.log_id.leader_id.term, e.log_id.index))
            .collect()
    }
}

fn open(dir: &Path, segment: u64) -> Arc<LogDb> {
    LogDb::open(dir, segment, 2, Arc::new(Metrics::default())).unwrap()
}

#[tokio::test]
async fn replay_restores_entries_votes_truncations_and_purges_per_group() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open(dir.path(), 1 << 20);
        let (mut a, mut b) = (log.group(0), log.group(1));
        a.append_now((1..=9).map(|i| entry(1, i)).collect()).await;
        b.append_now((1..=3).map(|i| entry(1, i)).collect()).await;
        a.save_vote(&Vote::new(2, 1)).await.unwrap();
        // A new leader replaces 7.. with its own entries.
        a.truncate(LogId::new(CommittedLeaderId::new(1, 1), 7))
            .await
            .unwrap();
        a.append_now(vec![entry(2, 7), entry(2, 8)]).await;
        a.purge(LogId::new(CommittedLeaderId::new(1, 1), 3))
            .await
            .unwrap();
        // The purge is written behind the next durable change.
        b.save_vote(&Vote::new(1, 2)).await.unwrap();
    }
    let log = open(dir.path(), 1 << 20);
    let (mut a, mut b) = (log.group(0), log.group(1));
    let expected: Vec<(u64, u64)> = (4..=6).map(|i| (1, i)).chain([(2, 7), (2, 8)]).collect();
    assert_eq!(a.indexes().await, expected);
    let state = a.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id.map(|id| id.index), Some(3));
    assert_eq!(
        state.last_log_id.map(|id| (id.leader_id.term, id.index)),
        Some((2, 8))
    );
    assert_eq!(a.read_vote().await.unwrap(), Some(Vote::new(2, 1)));
    assert_eq!(b.indexes().await, vec![(1, 1), (1, 2), (1, 3)]);
    assert_eq!(b.read_vote().await.unwrap(), Some(Vote::new(1, 2)));
}

#[tokio::test]
async fn changes_submitted_in_one_turn_are_written_as_one_record_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::default());
    {
        let log = LogDb::open(dir.path(), 1 << 20, 2, metrics.clone()).unwrap();
        let mut answers = Vec::new();
        for (group, index) in [(0, 1), (1, 1), (0, 2), (1, 2), (0, 3)] {
            let (done, answer) = oneshot::channel();
            let entries = postcard::to_allocvec(&vec![entry(1, index)]).unwrap();
            let op = LogOp::Append {
                group,
                entries: entries.into(),
            };
            log.submit(op, index, 1, Then::Reply(done)).unwrap();
            answers.push(answer);
        }
        for answer in answers {
            answer.await.unwrap().unwrap();
        }
        assert_eq!(metrics.batches.load(Ordering::Relaxed), 1);
        assert_eq!(metrics.log_entries.load(Ordering::Relaxed), 5);
    }
    let log = open(dir.path(), 1 << 20);
    let (mut a, mut b) = (log.group(0), log.group(1));
    assert_eq!(a.indexes().await, vec![(1, 1), (1, 2), (1, 3)]);
    assert_eq!(b.indexes().await, vec![(1, 1), (1, 2)]);
}

#[tokio::test]
async fn segments_go_once_every_group_purged_them_and_votes_survive() {
    let dir = tempfile::tempdir().unwrap();
    let segments = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "wal")
            })
            .count()
    };
    {
        let log = open(dir.path(), 16 * 1024);
        let (mut a, mut b) = (log.group(0), log.group(1));
        a.save_vote(&Vote::new(5, 1)).await.unwrap();
        b.append_now(vec![entry(1, 1)]).await;
        for i in 1..=3000 {
            a.append_now(vec![entry(1, i)]).await;
        }
        let many = segments(dir.path());
        assert!(many > 3, "{many} segments");
        // Group 1 still holds entry 1 in the first segment: nothing can go.
        a.purge(LogId::new(CommittedLeaderId::new(1, 1), 2990))
            .await
            .unwrap();
        a.append_now(vec![entry(1, 3001)]).await;
        assert_eq!(segments(dir.path()), many);
        b.purge(LogId::new(CommittedLeaderId::new(1, 1), 1))
            .await
            .unwrap();
        // Enough records to write a summary, so the first segment's vote is not needed.
        for i in 3002..=3002 + SUMMARY_EVERY {
            a.append_now(vec![entry(1, i)]).await;
        }
        a.purge(LogId::new(
            CommittedLeaderId::new(1, 1),
            3002 + SUMMARY_EVERY - 5,
        ))
        .await
        .unwrap();
        a.append_now(vec![entry(1, 3003 + SUMMARY_EVERY)]).await;
        assert!(segments(dir.path()) < many, "old segments were deleted");
    }
    let log = open(dir.path(), 16 * 1024);
    let mut a = log.group(0);
    assert_eq!(a.read_vote().await.unwrap(), Some(Vote::new(5, 1)));
    let kept = a.indexes().await;
    assert_eq!(kept.first().map(|k| k.1), Some(3002 + SUMMARY_EVERY - 4));
    assert_eq!(kept.last().map(|k| k.1), Some(3003 + SUMMARY_EVERY));
}

#[test]
fn an_append_record_written_when_its_entries_were_a_vec_reads_the_same() {
    // The shape of `LogOp` before its entries became `Bytes`: the same variant first.
    #[derive(serde::Serialize)]
    enum Before {
        Append { group: u32, entries: Vec<u8> },
    }
    let entries = postcard::to_allocvec(&vec![entry(2, 7), entry(2, 8)]).unwrap();
    let before = postcard::to_allocvec(&vec![Before::Append {
        group: 3,
        entries: entries.clone(),
    }])
    .unwrap();
    let now = postcard::to_allocvec(&vec![LogOp::Append {
        group: 3,
        entries: entries.clone().into(),
    }])
    .unwrap();
    assert_eq!(now, before, "the same bytes on disk");
    let read: Vec<LogOp> = postcard::from_bytes(&before).unwrap();
    let [
        LogOp::Append {
            group,
            entries: read,
        },
    ] = read.as_slice()
    else {
        panic!("one append");
    };
    assert_eq!(*group, 3);
    assert_eq!(read[..], entries[..]);
}
