//! Which refusals carry the marker `x-ursula-not-applied`: the rules as pure functions, so that
//! a model of proposals and leader changes can check them (see the tests).
//!
//! A node marks a refusal only when it sends it before anything of the write was proposed:
//! admission refusals, a failed read of the request, the leadership check of appends, closes and
//! stream creates (not creates whose body is staged in object storage, nor any create when the
//! hot cap is 0: those go to Raft unchecked), a group it does not host (those and deletes), and
//! a body the group has no room for. Whatever Raft answers after a proposal (a redirect because leadership moved on, a
//! timeout, a refusal by the state machine) is unmarked: the write may still commit.

use http::Method;

use super::route::Target;

/// What the leadership check does for a write, before proposing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderCheck {
    /// Checked; a refusal is one of the spec's marked `NotLeader` refusals.
    Marked,
    /// Checked; the refusal is a plain redirect or 503 (not in the spec's table).
    Unmarked,
    /// Not checked: handed to Raft, whose redirect comes after the proposal (deletes).
    Unchecked,
}

/// `staged_create`: a create whose body is staged in object storage, or any create on a node
/// whose hot cap is 0. The node hands those to Raft unchecked, as the spec says.
pub fn leader_check(target: &Target, method: &Method, staged_create: bool) -> LeaderCheck {
    match (target, method) {
        (Target::Stream(_), &Method::PUT) if staged_create => LeaderCheck::Unchecked,
        (Target::Stream(_), &Method::POST | &Method::PUT) => LeaderCheck::Marked,
        (Target::Stream(_), &Method::DELETE) => LeaderCheck::Unchecked,
        _ => LeaderCheck::Unmarked,
    }
}

/// Whether a `GroupNotHosted` refusal of this request is marked.
pub fn not_hosted_is_marked(target: &Target, is_write: bool) -> bool {
    matches!(target, Target::Stream(_)) && is_write
}

#[cfg(test)]
mod tests {
    //! A deterministic model: three voters, one group, leader changes at random moments, and
    //! writes arriving at random voters. Each write goes through the node's real decisions
    //! (`leader_check`, `ApiError::marked_if_unproposed`, the `EngineError` mapping); the model
    //! plays Raft: a leader appends a proposal to its log, a later leader may or may not have it
    //! and commits what it has. No marked answer may belong to a write that ever commits.

    use proptest::prelude::*;

    use super::*;
    use crate::engine::EngineError;
    use crate::http::error::ApiError;
    use crate::machine::StreamPath;
    use ursula_wire::{ErrorToken, headers};

    #[derive(Debug, Clone)]
    enum Step {
        /// A write of kind `kind` arrives at voter `at`.
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
            4 => (0..3usize, 0..7usize).prop_map(|(at, kind)| Step::Write { at, kind }),
            2 => (0..3usize, any::<bool>())
                .prop_map(|(to, keeps_uncommitted)| Step::Elect { to, keeps_uncommitted }),
            2 => Just(Step::Commit),
            1 => Just(Step::Pressure),
        ]
    }

    fn request(kind: usize) -> (Target, Method) {
        let stream = Target::Stream(StreamPath::new("model", "s"));
        match kind {
            0 => (stream, Method::POST),
            1 => (stream, Method::PUT),
            2 => (stream, Method::DELETE),
            3 => (Target::Bucket("model".into()), Method::PUT),
            4 => (
                Target::Snapshot(StreamPath::new("model", "s"), "-1".into()),
                Method::PUT,
            ),
            5 => (
                Target::Retention(StreamPath::new("model", "s"), "-1".into()),
                Method::PUT,
            ),
            // A create whose body is staged in object storage.
            _ => (stream, Method::PUT),
        }
    }

    fn is_marked(error: &ApiError) -> bool {
        error
            .headers
            .iter()
            .any(|(name, _)| *name == headers::NOT_APPLIED)
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
                        let (target, method) = request(kind);
                        let staged_create = kind == 6;
                        let answer: Result<(), ApiError> = (|| {
                            if std::mem::take(&mut pressure) {
                                return Err(ApiError::new(ErrorToken::WalDiskPressure, "full")
                                    .marked_if_unproposed());
                            }
                            let believes_it_leads = believed[at] == Some(at);
                            match leader_check(&target, &method, staged_create) {
                                LeaderCheck::Marked if !believes_it_leads => {
                                    return Err(ApiError::not_leader(believed[at].map(|l| l as u64))
                                        .marked_if_unproposed());
                                }
                                LeaderCheck::Unmarked if !believes_it_leads => {
                                    return Err(ApiError::not_leader(believed[at].map(|l| l as u64))
                                        .unmarked());
                                }
                                _ => {}
                            }
                            // Proposed: Raft takes it when this voter really leads; a voter
                            // that only believed so may have appended it before it learned
                            // otherwise (the model keeps it, the worst case).
                            uncommitted.push(id);
                            if leader == Some(at) {
                                Ok(())
                            } else {
                                let error: ApiError =
                                    EngineError::NotLeader { leader: leader.map(|l| l as u64) }.into();
                                Err(error.marked_if_unproposed())
                            }
                        })();
                        if let Err(error) = answer
                            && is_marked(&error)
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
}
