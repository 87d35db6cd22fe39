//! The membership planner: from the voters' own reports of their Raft groups, the one next
//! step toward `spec.voters`. Pure, so that every state of a growth, a shrink, a change back
//! half-way and a readmission is a table row.
//!
//! Growing, the StatefulSet is scaled first (new pods join: `raft.join`), then each new voter,
//! lowest ordinal first, is added to every group as a learner, waited for until it has caught
//! up, and promoted. Shrinking, each voter beyond `spec.voters`, highest first, hands its
//! leadership off (a drain), is demoted to a learner and removed; the StatefulSet is scaled
//! down last. A voter that lost its volume (it reports groups `rejoining`) is demoted, caught
//! up and promoted again. A membership change and a version upgrade never overlap: whichever
//! is underway finishes first.

use std::collections::BTreeSet;
use std::time::Duration;

use ursula_wire::admin::{GroupMembership, MembershipReport};

/// A learner at most this many entries behind every group's leader is promoted (the node
/// refuses beyond 1024).
pub const CAUGHT_UP_LAG: u64 = 256;

/// The name of the step that ends a change (`MembershipStep::SpreadLeaders`).
pub const SPREAD_LEADERS: &str = "spread leaders";

/// What the planner looks at.
#[derive(Debug, Clone, Default)]
pub struct MembershipView {
    /// `spec.voters`.
    pub desired: u8,
    /// The StatefulSet's replicas now (0: it does not exist yet).
    pub replicas: u8,
    /// The Raft groups of a cluster.
    pub group_count: usize,
    /// `GET /admin/membership` of each voter pod that answered.
    pub reports: Vec<MembershipReport>,
    /// Whether a version upgrade or rollback is underway.
    pub upgrading: bool,
    /// Whether the last reconcile left a membership change underway (`status.membershipStep`,
    /// other than the spreading of leaders that ends one).
    pub was_changing: bool,
    /// How long the current step has waited.
    pub waiting_for: Duration,
    pub ready_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipStep {
    /// The voters are `1..=spec.voters`, nothing else is a member.
    Done,
    /// Set the StatefulSet's replicas.
    Scale(u8),
    /// Voter `id`'s pod does not answer yet.
    WaitForPod(u64),
    /// Not every group reports a leader, or one is between two configurations.
    WaitForGroups,
    /// A version change is underway; the membership change waits for it.
    WaitForUpgrade,
    AddLearner(u64),
    /// Learner `id` is catching up.
    WaitForCatchUp(u64),
    Promote(u64),
    /// Hand off its leadership, then make it a learner.
    Demote(u64),
    Remove(u64),
    /// After a change: these voters lead less than their share of the groups, and take it
    /// from the busiest leaders (new voters lead nothing).
    SpreadLeaders(Vec<u64>),
    /// Stop and report `Degraded`.
    Halt(String),
}

impl MembershipStep {
    /// The step as status and events name it, e.g. `promote voter 4`.
    pub fn name(&self) -> String {
        match self {
            Self::Done => "done".into(),
            Self::Scale(n) => format!("scale to {n} pods"),
            Self::WaitForPod(id) => format!("wait for voter {id}'s pod"),
            Self::WaitForGroups => "wait for every group's leader".into(),
            Self::WaitForUpgrade => "wait for the upgrade".into(),
            Self::AddLearner(id) => format!("add voter {id} as a learner"),
            Self::WaitForCatchUp(id) => format!("wait for learner {id} to catch up"),
            Self::Promote(id) => format!("promote voter {id}"),
            Self::Demote(id) => format!("demote voter {id}"),
            Self::Remove(id) => format!("remove voter {id}"),
            Self::SpreadLeaders(_) => SPREAD_LEADERS.into(),
            Self::Halt(_) => "halted".into(),
        }
    }

    /// Whether the change is underway (anything but done or waiting to start).
    pub fn is_changing(&self) -> bool {
        !matches!(self, Self::Done | Self::WaitForUpgrade)
    }
}

/// Who is what in every group, summed up over the groups.
#[derive(Debug, Default)]
struct Members {
    /// Voters of every group.
    voters: BTreeSet<u64>,
    /// Members of any group that are not voters of all.
    others: BTreeSet<u64>,
    /// Voters of some group (`voters` and the half-changed).
    voting_somewhere: BTreeSet<u64>,
    joint: bool,
}

fn members(groups: &[GroupMembership]) -> Members {
    let mut members = Members::default();
    let Some(first) = groups.first() else {
        return members;
    };
    members.voters = first.voters.iter().copied().collect();
    for group in groups {
        let voters: BTreeSet<u64> = group.voters.iter().copied().collect();
        members.voters = members.voters.intersection(&voters).copied().collect();
        members.voting_somewhere.extend(&voters);
        members.others.extend(&group.learners);
        members.joint |= group.joint;
    }
    members.others.extend(&members.voting_somewhere);
    members.others = members
        .others
        .difference(&members.voters)
        .copied()
        .collect();
    members
}

/// The voters that lead fewer than their share of the groups (the groups over the voters,
/// rounded down).
fn short_of_share(groups: &[GroupMembership], voters: &BTreeSet<u64>) -> Vec<u64> {
    if voters.is_empty() {
        return Vec::new();
    }
    let share = groups.len() / voters.len();
    voters
        .iter()
        .filter(|id| groups.iter().filter(|g| g.leader == Some(**id)).count() < share)
        .copied()
        .collect()
}

/// The most entries node `id` lacks in any group (`u64::MAX` where its leader does not say).
fn lag(groups: &[GroupMembership], id: u64) -> u64 {
    groups
        .iter()
        .map(|group| group.lag.get(&id).copied().unwrap_or(u64::MAX))
        .max()
        .unwrap_or(u64::MAX)
}

pub fn next_step(view: &MembershipView) -> MembershipStep {
    if view.replicas == 0 {
        // A new cluster: the StatefulSet is created with `spec.voters` pods, which seed it.
        return MembershipStep::Done;
    }
    let groups = MembershipReport::leaders_view(&view.reports);
    let complete = groups.len() == view.group_count;
    let wanted: BTreeSet<u64> = (1..=u64::from(view.desired)).collect();
    let rejoining: BTreeSet<u64> = view
        .reports
        .iter()
        .filter(|report| !report.rejoining.is_empty())
        .map(|report| report.node)
        .collect();
    let members = members(&groups);
    let timed_out = view.waiting_for > view.ready_timeout;
    let wait = |step: MembershipStep, what: String| {
        if timed_out {
            MembershipStep::Halt(format!("{what} for more than {:?}", view.ready_timeout))
        } else {
            step
        }
    };
    if !complete {
        // Without every group's word (a voter restarting, an election) nothing is known to be
        // wrong, unless a change was asked for or is underway.
        if view.replicas == view.desired && !view.was_changing {
            return MembershipStep::Done;
        }
        return wait(
            MembershipStep::WaitForGroups,
            "not every group reported its leader".into(),
        );
    }
    let settled = members.voters == wanted
        && members.others.is_empty()
        && rejoining.is_empty()
        && view.replicas == view.desired;
    if settled {
        let behind = short_of_share(&groups, &members.voters);
        return if view.was_changing && !behind.is_empty() {
            MembershipStep::SpreadLeaders(behind)
        } else {
            MembershipStep::Done
        };
    }
    let underway = !members.others.is_empty()
        || members.joint
        || usize::from(view.replicas) != members.voters.len();
    if view.upgrading && !underway && rejoining.is_empty() {
        return MembershipStep::WaitForUpgrade;
    }
    if members.joint {
        return wait(
            MembershipStep::WaitForGroups,
            "a group stayed between two configurations".into(),
        );
    }
    // A voter that lost its volume votes again only through a learner's catch-up.
    if let Some(id) = rejoining.intersection(&members.voting_somewhere).next() {
        return MembershipStep::Demote(*id);
    }
    // The lowest voter to be that is not one yet.
    if let Some(&id) = wanted.difference(&members.voters).next() {
        if view.replicas < view.desired {
            return MembershipStep::Scale(view.desired);
        }
        if !view.reports.iter().any(|report| report.node == id) {
            return wait(
                MembershipStep::WaitForPod(id),
                format!("voter {id}'s pod did not answer"),
            );
        }
        if !members.others.contains(&id) {
            return MembershipStep::AddLearner(id);
        }
        if members.voting_somewhere.contains(&id) {
            // Half-promoted: promoting again finishes it.
            return MembershipStep::Promote(id);
        }
        if lag(&groups, id) > CAUGHT_UP_LAG || rejoining.contains(&id) {
            return wait(
                MembershipStep::WaitForCatchUp(id),
                format!("learner {id} did not catch up"),
            );
        }
        return MembershipStep::Promote(id);
    }
    let beyond = members
        .voters
        .iter()
        .chain(&members.others)
        .filter(|id| !wanted.contains(id))
        .max()
        .copied();
    if let Some(id) = beyond {
        return if members.voting_somewhere.contains(&id) {
            MembershipStep::Demote(id)
        } else {
            MembershipStep::Remove(id)
        };
    }
    if view.replicas != view.desired {
        return MembershipStep::Scale(view.desired);
    }
    MembershipStep::Done
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const GROUPS: usize = 2;

    /// Every group led by node 1 with these voters and learners (lag per learner), and a
    /// report from every node in `answering`.
    fn reports(
        voters: &[u64],
        learners: &[(u64, u64)],
        answering: &[u64],
        rejoining: &[u64],
    ) -> Vec<MembershipReport> {
        answering
            .iter()
            .map(|&node| MembershipReport {
                node,
                rejoining: if rejoining.contains(&node) {
                    vec![0, 1]
                } else {
                    vec![]
                },
                groups: (0..GROUPS as u32)
                    .map(|group| GroupMembership {
                        group,
                        leader: Some(1),
                        voters: voters.to_vec(),
                        learners: learners.iter().map(|(id, _)| *id).collect(),
                        joint: false,
                        lag: if node == 1 {
                            learners.iter().copied().collect::<BTreeMap<_, _>>()
                        } else {
                            BTreeMap::new()
                        },
                    })
                    .collect(),
            })
            .collect()
    }

    fn view(desired: u8, replicas: u8, reports: Vec<MembershipReport>) -> MembershipView {
        MembershipView {
            desired,
            replicas,
            group_count: GROUPS,
            reports,
            upgrading: false,
            was_changing: false,
            waiting_for: Duration::ZERO,
            ready_timeout: Duration::from_secs(600),
        }
    }

    use MembershipStep::*;

    #[test]
    fn growing_from_three_to_five_takes_every_step_in_order() {
        for (what, view, expected) in [
            (
                "settled",
                view(3, 3, reports(&[1, 2, 3], &[], &[1, 2, 3], &[])),
                Done,
            ),
            (
                "asked for 5",
                view(5, 3, reports(&[1, 2, 3], &[], &[1, 2, 3], &[])),
                Scale(5),
            ),
            (
                "pod 4 not up",
                view(5, 5, reports(&[1, 2, 3], &[], &[1, 2, 3], &[])),
                WaitForPod(4),
            ),
            (
                "pod 4 up",
                view(5, 5, reports(&[1, 2, 3], &[], &[1, 2, 3, 4, 5], &[])),
                AddLearner(4),
            ),
            (
                "4 behind",
                view(
                    5,
                    5,
                    reports(&[1, 2, 3], &[(4, 5000)], &[1, 2, 3, 4, 5], &[]),
                ),
                WaitForCatchUp(4),
            ),
            (
                "4 caught up",
                view(5, 5, reports(&[1, 2, 3], &[(4, 10)], &[1, 2, 3, 4, 5], &[])),
                Promote(4),
            ),
            (
                "then 5",
                view(5, 5, reports(&[1, 2, 3, 4], &[], &[1, 2, 3, 4, 5], &[])),
                AddLearner(5),
            ),
            (
                "5 caught up",
                view(
                    5,
                    5,
                    reports(&[1, 2, 3, 4], &[(5, 0)], &[1, 2, 3, 4, 5], &[]),
                ),
                Promote(5),
            ),
            (
                "grown",
                view(5, 5, reports(&[1, 2, 3, 4, 5], &[], &[1, 2, 3, 4, 5], &[])),
                Done,
            ),
        ] {
            assert_eq!(next_step(&view), expected, "{what}");
        }
    }

    #[test]
    fn a_change_ends_with_the_leaders_spread_over_every_voter_once() {
        let all = [1, 2, 3, 4, 5];
        // Every group is led by node 1: with 2 groups over 5 voters the share is 0, so
        // nobody is short; over 2 voters it is 1 each.
        let mut grown = view(5, 5, reports(&all, &[], &all, &[]));
        grown.was_changing = true;
        assert_eq!(
            next_step(&grown),
            Done,
            "the share of 2 groups over 5 voters is 0"
        );
        let mut two = view(2, 2, reports(&[1, 2], &[], &[1, 2], &[]));
        two.was_changing = true;
        assert_eq!(next_step(&two), SpreadLeaders(vec![2]));
        assert_eq!(SpreadLeaders(vec![2]).name(), SPREAD_LEADERS);
        // Not after a change (a restart, an upgrade): left to the next change.
        two.was_changing = false;
        assert_eq!(next_step(&two), Done);
    }

    #[test]
    fn shrinking_from_five_to_three_removes_the_highest_first_and_scales_last() {
        let all = [1, 2, 3, 4, 5];
        for (what, view, expected) in [
            (
                "asked for 3",
                view(3, 5, reports(&all, &[], &all, &[])),
                Demote(5),
            ),
            (
                "5 a learner",
                view(3, 5, reports(&[1, 2, 3, 4], &[(5, 0)], &all, &[])),
                Remove(5),
            ),
            (
                "5 removed",
                view(3, 5, reports(&[1, 2, 3, 4], &[], &all, &[])),
                Demote(4),
            ),
            (
                "4 a learner",
                view(3, 5, reports(&[1, 2, 3], &[(4, 0)], &all, &[])),
                Remove(4),
            ),
            (
                "both removed",
                view(3, 5, reports(&[1, 2, 3], &[], &all, &[])),
                Scale(3),
            ),
            (
                "scaled",
                view(3, 3, reports(&[1, 2, 3], &[], &[1, 2, 3], &[])),
                Done,
            ),
        ] {
            assert_eq!(next_step(&view), expected, "{what}");
        }
    }

    #[test]
    fn a_change_back_half_way_undoes_what_was_done() {
        let up = [1, 2, 3, 4, 5];
        for (what, view, expected) in [
            // 3 -> 5 asked, learner 4 added, then 3 asked again.
            (
                "learner 4",
                view(3, 5, reports(&[1, 2, 3], &[(4, 900)], &up, &[])),
                Remove(4),
            ),
            (
                "learner gone",
                view(3, 5, reports(&[1, 2, 3], &[], &up, &[])),
                Scale(3),
            ),
            // 5 -> 3 asked, 5 demoted, then 5 asked again: 5 is promoted back.
            (
                "5 demoted",
                view(5, 5, reports(&[1, 2, 3, 4], &[(5, 0)], &up, &[])),
                Promote(5),
            ),
        ] {
            assert_eq!(next_step(&view), expected, "{what}");
        }
    }

    #[test]
    fn a_learner_that_never_catches_up_or_a_pod_that_never_answers_halts() {
        let mut behind = view(
            5,
            5,
            reports(&[1, 2, 3], &[(4, 5000)], &[1, 2, 3, 4, 5], &[]),
        );
        behind.waiting_for = Duration::from_secs(601);
        assert!(
            matches!(next_step(&behind), Halt(why) if why.contains("learner 4 did not catch up"))
        );
        let mut absent = view(5, 5, reports(&[1, 2, 3], &[], &[1, 2, 3], &[]));
        absent.waiting_for = Duration::from_secs(601);
        assert!(matches!(next_step(&absent), Halt(why) if why.contains("voter 4's pod")));
    }

    #[test]
    fn a_membership_change_waits_for_an_upgrade_and_one_underway_goes_on() {
        let mut asked = view(5, 3, reports(&[1, 2, 3], &[], &[1, 2, 3], &[]));
        asked.upgrading = true;
        assert_eq!(next_step(&asked), WaitForUpgrade);
        assert!(!WaitForUpgrade.is_changing());
        let mut underway = view(5, 5, reports(&[1, 2, 3], &[(4, 0)], &[1, 2, 3, 4, 5], &[]));
        underway.upgrading = true;
        assert_eq!(next_step(&underway), Promote(4));
        assert!(Promote(4).is_changing());
    }

    #[test]
    fn a_voter_that_lost_its_volume_is_demoted_caught_up_and_promoted_again() {
        let all = [1, 2, 3];
        for (what, view, expected) in [
            (
                "rejoining voter",
                view(3, 3, reports(&all, &[], &all, &[3])),
                Demote(3),
            ),
            (
                "a learner now",
                view(3, 3, reports(&[1, 2], &[(3, 4000)], &all, &[])),
                WaitForCatchUp(3),
            ),
            (
                "caught up",
                view(3, 3, reports(&[1, 2], &[(3, 0)], &all, &[])),
                Promote(3),
            ),
        ] {
            assert_eq!(next_step(&view), expected, "{what}");
        }
    }

    #[test]
    fn without_every_groups_leader_nothing_moves() {
        let mut partial = reports(&[1, 2, 3], &[], &[2, 3], &[]);
        for report in &mut partial {
            for group in &mut report.groups {
                group.leader = Some(1);
            }
        }
        // Node 1 leads and did not answer: nothing is known to be wrong...
        assert_eq!(next_step(&view(3, 3, partial.clone())), Done);
        // ...unless a change is asked for, or was underway.
        assert_eq!(next_step(&view(5, 3, partial.clone())), WaitForGroups);
        let mut underway = view(5, 5, partial);
        underway.was_changing = true;
        assert_eq!(next_step(&underway), WaitForGroups);
    }
}
