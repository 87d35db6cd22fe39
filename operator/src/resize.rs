//! Membership changes as the operator makes them: it asks every voter pod for its view of
//! the groups, lets the planner (`membership`) pick the next step, and makes it through the
//! voters' admin API.

use std::time::Duration;

use crate::crd::UrsulaCluster;
use crate::membership::{MembershipStep, MembershipView};
use crate::nodes::{MembershipChange, NodeError, Nodes};
use crate::objects::GROUP_COUNT;

/// Every voter pod's report (those that answer), for the planner.
pub async fn observe(
    nodes: &Nodes,
    cluster: &UrsulaCluster,
    pods: u8,
    token: &str,
) -> Vec<ursula_wire::admin::MembershipReport> {
    let mut reports = Vec::new();
    for ordinal in 0..pods {
        match nodes.membership(cluster, ordinal, token).await {
            Ok(report) => reports.push(report),
            Err(error) => tracing::debug!(%error, "no membership report"),
        }
    }
    reports
}

/// The view the planner takes.
pub fn view(
    cluster: &UrsulaCluster,
    pods: u8,
    reports: Vec<ursula_wire::admin::MembershipReport>,
    upgrading: bool,
    waiting_for: Duration,
    ready_timeout: Duration,
) -> MembershipView {
    let status = cluster.status.as_ref();
    MembershipView {
        desired: cluster.spec.voters,
        replicas: pods,
        group_count: usize::try_from(GROUP_COUNT).unwrap_or(usize::MAX),
        reports,
        upgrading,
        was_changing: status
            .and_then(|s| s.membership_step.as_deref())
            .is_some_and(|step| step != crate::membership::SPREAD_LEADERS),
        waiting_for,
        ready_timeout,
    }
}

/// Voters of every group, as their leaders report them; `None` unless every group did.
pub fn raft_voters(view: &MembershipView) -> Option<u8> {
    let groups = ursula_wire::admin::MembershipReport::leaders_view(&view.reports);
    if groups.len() != view.group_count {
        return None;
    }
    groups
        .iter()
        .map(|group| u8::try_from(group.voters.len()).unwrap_or(u8::MAX))
        .min()
}

/// The voter to make changes through: the lowest that answered and is not the one changed
/// (any voter forwards each group's change to its leader).
pub fn via(view: &MembershipView, step: &MembershipStep) -> u8 {
    let changed = match *step {
        MembershipStep::AddLearner(id)
        | MembershipStep::Promote(id)
        | MembershipStep::Demote(id)
        | MembershipStep::Remove(id) => Some(id),
        _ => None,
    };
    view.reports
        .iter()
        .map(|report| report.node)
        .filter(|node| Some(*node) != changed && *node >= 1)
        .min()
        .and_then(|node| u8::try_from(node - 1).ok())
        .unwrap_or(0)
}

/// Makes the step's change through voter `via`.
pub async fn act(
    nodes: &Nodes,
    cluster: &UrsulaCluster,
    step: &MembershipStep,
    via: u8,
    token: &str,
) -> Result<(), NodeError> {
    let (change, id) = match *step {
        MembershipStep::AddLearner(id) => (MembershipChange::AddLearner, id),
        MembershipStep::Promote(id) => (MembershipChange::Promote, id),
        MembershipStep::Demote(id) => {
            // Its groups elect other leaders first, so that the demotion costs no election.
            let ordinal = u8::try_from(id - 1).unwrap_or(u8::MAX);
            if let Err(error) = nodes.drain(cluster, ordinal, token).await {
                tracing::info!(%error, "demoting a voter that could not be drained");
            }
            (MembershipChange::Demote, id)
        }
        MembershipStep::Remove(id) => (MembershipChange::Remove, id),
        MembershipStep::SpreadLeaders(ref ids) => {
            for id in ids {
                let ordinal = u8::try_from(id - 1).unwrap_or(u8::MAX);
                nodes.claim_leadership(cluster, ordinal, token).await?;
            }
            return Ok(());
        }
        _ => return Ok(()),
    };
    nodes
        .change_membership(cluster, via, change, id, token)
        .await
}
