use proptest::prelude::*;
use ursula_wire::ErrorToken as T;

use super::*;
use crate::engine::EngineError;
use crate::http::error::ApiError;

const APPEND: Write = Write::Append { staged: false };
const STAGED_APPEND: Write = Write::Append { staged: true };
const CREATE: Write = Write::CreateStream { staged: false };
const STAGED_CREATE: Write = Write::CreateStream { staged: true };
const ALL_WRITES: [Write; 9] = [
    Write::CreateBucket,
    CREATE,
    STAGED_CREATE,
    APPEND,
    STAGED_APPEND,
    Write::Close,
    Write::DeleteStream,
    Write::PublishSnapshot,
    Write::AdvanceRetention,
];

/// One row per row of the spec's two tables (the writes it names are marked, every other
/// write is not), then the unmarked cases the spec lists.
#[test]
fn the_spec_tables_row_by_row() {
    let stream_writes = [CREATE, STAGED_CREATE, APPEND, STAGED_APPEND, Write::Close];
    let every_but_snapshots = [
        &stream_writes[..],
        &[Write::CreateBucket, Write::DeleteStream],
    ]
    .concat();
    let rows: [(Stage, T, &[Write]); 8] = [
        // Admission: every write it refuses.
        (Stage::Admission, T::WalDiskPressure, &every_but_snapshots),
        (Stage::Admission, T::RaftLogPressure, &every_but_snapshots),
        (
            Stage::Admission,
            T::IngressBodyBytesLimitReached,
            &every_but_snapshots,
        ),
        (
            Stage::Admission,
            T::RequestBodyTooLarge,
            &every_but_snapshots,
        ),
        // After admission, before proposing.
        (
            Stage::BeforeProposal,
            T::NotLeader,
            &[APPEND, STAGED_APPEND, Write::Close, CREATE],
        ),
        // Every stream write but snapshots and retention: ALL_WRITES[1..7].
        (Stage::BeforeProposal, T::GroupNotHosted, &ALL_WRITES[1..7]),
        (
            Stage::BeforeProposal,
            T::RaftUncommittedBackpressure,
            &[CREATE, APPEND],
        ),
        (
            Stage::BeforeProposal,
            T::ColdBackpressure,
            &[CREATE, APPEND],
        ),
    ];
    for (stage, token, marked) in rows {
        for write in ALL_WRITES {
            let expected = marked.contains(&write).then_some(token);
            assert_eq!(
                marker(Some(write), stage, token),
                expected,
                "{stage:?} {token:?} {write:?}"
            );
        }
    }
}

#[test]
fn what_the_spec_leaves_unmarked() {
    let cases: [(Option<Write>, Stage, T, &str); 12] = [
        (
            None,
            Stage::BeforeProposal,
            T::NotLeader,
            "a read's redirect",
        ),
        (
            None,
            Stage::Admission,
            T::RequestBodyTooLarge,
            "not a write",
        ),
        (
            Some(Write::DeleteStream),
            Stage::Proposed,
            T::NotLeader,
            "a delete's redirect from Raft",
        ),
        (
            Some(STAGED_CREATE),
            Stage::Proposed,
            T::NotLeader,
            "a staged create's redirect from Raft",
        ),
        (
            Some(APPEND),
            Stage::Proposed,
            T::NotLeader,
            "leadership moved after the proposal",
        ),
        (
            Some(Write::CreateBucket),
            Stage::BeforeProposal,
            T::NotLeader,
            "a bucket create's redirect",
        ),
        (
            Some(Write::PublishSnapshot),
            Stage::BeforeProposal,
            T::NotLeader,
            "a snapshot publish",
        ),
        (
            Some(Write::AdvanceRetention),
            Stage::Admission,
            T::WalDiskPressure,
            "a retention advance",
        ),
        (Some(APPEND), Stage::Unknown, T::RequestTimeout, "a timeout"),
        (
            Some(APPEND),
            Stage::Unknown,
            T::Unavailable,
            "a 503 of the replication",
        ),
        (
            Some(APPEND),
            Stage::BeforeProposal,
            T::EmptyBody,
            "a bad request",
        ),
        (
            Some(APPEND),
            Stage::Proposed,
            T::StreamNotFound,
            "a state machine refusal",
        ),
    ];
    for (write, stage, token, what) in cases {
        assert_eq!(marker(write, stage, token), None, "{what}");
    }
}

#[test]
fn deletes_and_staged_creates_go_to_raft_unchecked() {
    assert!(!STAGED_CREATE.checks_leadership());
    assert!(!Write::DeleteStream.checks_leadership());
    assert!(CREATE.checks_leadership() && APPEND.checks_leadership());
}

// A deterministic model: three voters, one group, leader changes at random moments, and
// writes arriving at random voters. Each write goes through the node's real decisions
// (`Write::checks_leadership`, the `EngineError` mapping, `marker`); the model plays Raft: a
// leader appends a proposal to its log, a later leader may or may not have it and commits
// what it has. No marked answer may belong to a write that ever commits.

#[derive(Debug, Clone)]
enum Step {
    /// A write `ALL_WRITES[kind]` arrives at voter `at`.
    Write { at: usize, kind: usize },
    /// Leadership moves to `to`; it keeps the old leader's uncommitted entries or not.
    Elect { to: usize, keeps_uncommitted: bool },
    /// The leader commits its log.
    Commit,
    /// Admission refuses the next write (disk, log pressure, body budget).
    Pressure,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..3usize, 0..ALL_WRITES.len()).prop_map(|(at, kind)| Step::Write { at, kind }),
        2 => (0..3usize, any::<bool>())
            .prop_map(|(to, keeps_uncommitted)| Step::Elect { to, keeps_uncommitted }),
        2 => Just(Step::Commit),
        1 => Just(Step::Pressure),
    ]
}

fn is_marked(write: Write, error: &ApiError) -> bool {
    marker(Some(write), error.stage, error.token).is_some()
}

proptest! {
    #[test]
    fn no_marked_answer_for_a_write_that_commits(steps in prop::collection::vec(step(), 1..60)) {
        // Who each voter believes leads (None: an election is running).
        let mut believed: [Option<usize>; 3] = [Some(0); 3];
        let mut leader: Option<usize> = Some(0);
        let mut uncommitted: Vec<usize> = Vec::new();
        let mut committed: Vec<usize> = Vec::new();
        let mut marked: Vec<usize> = Vec::new();
        let mut pressure = false;
        for (id, step) in steps.into_iter().enumerate() {
            match step {
                Step::Pressure => pressure = true,
                Step::Commit => committed.append(&mut uncommitted),
                Step::Elect { to, keeps_uncommitted } => {
                    if !keeps_uncommitted {
                        uncommitted.clear();
                    }
                    leader = Some(to);
                    // Voters learn of the new leader at different times.
                    believed[to] = Some(to);
                    believed[(to + 1) % 3] = None;
                }
                Step::Write { at, kind } => {
                    let write = ALL_WRITES[kind];
                    let answer: Result<(), ApiError> = (|| {
                        if std::mem::take(&mut pressure) {
                            return Err(ApiError::new(T::WalDiskPressure, "full").at(Stage::Admission));
                        }
                        if write.checks_leadership() && believed[at] != Some(at) {
                            return Err(ApiError::not_leader(believed[at].map(|l| l as u64)));
                        }
                        // Proposed: Raft takes it when this voter really leads; a voter
                        // that only believed so may have appended it before it learned
                        // otherwise (the model keeps it, the worst case).
                        uncommitted.push(id);
                        if leader == Some(at) {
                            Ok(())
                        } else {
                            Err(EngineError::NotLeader { leader: leader.map(|l| l as u64) }.into())
                        }
                    })();
                    if let Err(error) = answer
                        && is_marked(write, &error)
                    {
                        marked.push(id);
                    }
                }
            }
        }
        committed.append(&mut uncommitted);
        for id in &marked {
            prop_assert!(!committed.contains(id), "write {} was marked and committed", id);
        }
    }
}
