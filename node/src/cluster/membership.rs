//! Voter membership at run time, through openraft's joint consensus: a node is added to a
//! group as a learner, catches up, and is promoted; a voter is demoted to a learner, then
//! removed. Each change is proposed by the group's leader; the admin listener runs it on
//! every group, here or forwarded to the leader (`CallKind::Membership`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use openraft::ChangeMembers;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use serde::{Deserialize, Serialize};
use ursula_wire::admin::GroupMembership;

use super::address_book::{AddressBook, member_node};
use super::rejoin::Rejoining;
use super::types::{NodeId, Raft};
use crate::config::Peer;

/// A learner this many entries behind the leader's log is not promoted: as a voter it would
/// count towards quorums it cannot yet make.
pub const PROMOTION_MAX_LAG: u64 = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipChange {
    AddLearner(Peer),
    Promote(NodeId),
    Demote(NodeId),
    Remove(NodeId),
}

impl MembershipChange {
    pub fn node(&self) -> NodeId {
        match self {
            Self::AddLearner(peer) => peer.id,
            Self::Promote(id) | Self::Demote(id) | Self::Remove(id) => *id,
        }
    }

    /// The node's role once the change is made.
    pub fn role(&self) -> &'static str {
        match self {
            Self::AddLearner(_) | Self::Demote(_) => "learner",
            Self::Promote(_) => "voter",
            Self::Remove(_) => "removed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ChangeError {
    #[error("this node does not lead the group")]
    NotLeader(Option<NodeId>),
    /// The change cannot be made as asked (the caller must do something else first).
    #[error("{0}")]
    Refused(String),
    /// It may succeed if tried again (a change in progress, a leader change).
    #[error("{0}")]
    Failed(String),
}

/// Makes `change` in the group `raft` leads here; a change already made succeeds at once.
pub async fn change_here(
    raft: &Raft,
    calls: &super::stop::RaftCalls,
    group: u32,
    change: &MembershipChange,
) -> Result<(), ChangeError> {
    let (membership, lag) = {
        let metrics = raft.metrics();
        let metrics = metrics.borrow();
        if metrics.current_leader != Some(metrics.id) {
            return Err(ChangeError::NotLeader(metrics.current_leader));
        }
        (
            metrics.membership_config.membership().clone(),
            lags(&metrics),
        )
    };
    let node = change.node();
    let is_voter = membership.voter_ids().any(|id| id == node);
    let is_member = membership.nodes().any(|(id, _)| *id == node);
    let (members, retain): (ChangeMembers<NodeId, openraft::BasicNode>, bool) = match change {
        MembershipChange::AddLearner(_) if is_member => return Ok(()),
        MembershipChange::AddLearner(peer) => (
            ChangeMembers::AddNodes(BTreeMap::from([(peer.id, member_node(peer))])),
            false,
        ),
        MembershipChange::Promote(_) if is_voter && membership.get_joint_config().len() == 1 => {
            return Ok(());
        }
        MembershipChange::Promote(_) if !is_member => {
            return Err(ChangeError::Refused(format!(
                "node {node} is not a learner of group {group}: add it as a learner first"
            )));
        }
        MembershipChange::Promote(_) => {
            let behind = lag.get(&node).copied().unwrap_or(u64::MAX);
            if behind > PROMOTION_MAX_LAG {
                return Err(ChangeError::Refused(format!(
                    "node {node} has not caught up in group {group}: {} entries behind (at most {PROMOTION_MAX_LAG} to be promoted)",
                    if behind == u64::MAX {
                        "all".to_owned()
                    } else {
                        behind.to_string()
                    }
                )));
            }
            (ChangeMembers::AddVoterIds(BTreeSet::from([node])), true)
        }
        MembershipChange::Demote(_) if !is_voter => return Ok(()),
        MembershipChange::Demote(_) => {
            if membership.voter_ids().all(|id| id == node) {
                return Err(ChangeError::Refused(format!(
                    "node {node} is the last voter of group {group}"
                )));
            }
            (ChangeMembers::RemoveVoters(BTreeSet::from([node])), true)
        }
        MembershipChange::Remove(_) if is_voter => {
            return Err(ChangeError::Refused(format!(
                "node {node} is a voter of group {group}: demote it to a learner first"
            )));
        }
        MembershipChange::Remove(_) if !is_member => return Ok(()),
        MembershipChange::Remove(_) => (ChangeMembers::RemoveNodes(BTreeSet::from([node])), false),
    };
    let Some(changed) = calls.run(raft.change_membership(members, retain)).await else {
        return Err(ChangeError::Failed("the node is shutting down".into()));
    };
    match changed {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
            Err(ChangeError::NotLeader(forward.leader_id))
        }
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
            error @ (ChangeMembershipError::EmptyMembership(_)
            | ChangeMembershipError::LearnerNotFound(_)),
        ))) => Err(ChangeError::Refused(error.to_string())),
        Err(error) => Err(ChangeError::Failed(error.to_string())),
    }
}

/// Hands the leadership of the group `raft` leads here off for `window_ms` (see
/// `Engine::yield_leadership`).
pub fn hand_off_here(
    raft: &Raft,
    engine: Option<&Arc<crate::engine::Engine>>,
    window_ms: u64,
) -> Result<(), ChangeError> {
    let metrics = raft.metrics().borrow().clone();
    match engine {
        Some(engine) if metrics.current_leader == Some(metrics.id) => {
            engine.yield_leadership(std::time::Duration::from_millis(window_ms));
            Ok(())
        }
        Some(_) => Err(ChangeError::NotLeader(metrics.current_leader)),
        None => Err(ChangeError::Failed("the group has no engine here".into())),
    }
}

/// Entries each other member lacks of the leader's log (all of them: `u64::MAX` when it has
/// acknowledged none); empty unless this node leads.
fn lags(metrics: &openraft::RaftMetrics<NodeId, openraft::BasicNode>) -> BTreeMap<NodeId, u64> {
    let last = metrics.last_log_index.unwrap_or(0);
    metrics
        .replication
        .iter()
        .flatten()
        .filter(|(id, _)| **id != metrics.id)
        .map(|(id, matched)| {
            let behind = matched.map_or(u64::MAX, |m| last.saturating_sub(m.index));
            (*id, behind)
        })
        .collect()
}

/// This replica's view of its group's membership.
pub fn report_here(raft: &Raft, group: u32) -> GroupMembership {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    let membership = metrics.membership_config.membership();
    GroupMembership {
        group,
        leader: metrics.current_leader,
        voters: membership.voter_ids().collect(),
        learners: membership.learner_ids().collect(),
        joint: membership.get_joint_config().len() > 1,
        lag: lags(&metrics),
    }
}

/// Follows a group's membership on this replica: the book learns the addresses it names, and
/// a rejoining replica is let vote and campaign again once a membership applied here has
/// made it a learner. `campaigns` is whether the node lets its replicas campaign (a drain
/// does not).
pub async fn follow(
    raft: Raft,
    group: u32,
    book: Arc<AddressBook>,
    rejoining: Arc<Rejoining>,
    campaigns: Arc<AtomicBool>,
) {
    let mut metrics = raft.metrics();
    let mut seen = None;
    // Marks are only ever cleared while the node runs: once clear, only addresses are left.
    let mut marked = rejoining.contains(group);
    loop {
        let readmitted = {
            let now = metrics.borrow_and_update();
            let membership = now.membership_config.clone();
            if seen != Some(*membership.log_id()) {
                seen = Some(*membership.log_id());
                book.learn(membership.nodes());
            }
            let applied = now.last_applied.map_or(0, |id| id.index);
            let committed = membership.log_id().is_none_or(|id| id.index <= applied);
            marked
                && committed
                && match rejoining.readmitted(group, now.id, &membership) {
                    Ok(readmitted) => readmitted,
                    Err(error) => {
                        tracing::error!(group, %error, "cannot record the readmission");
                        false
                    }
                }
        };
        if readmitted {
            marked = false;
            raft.runtime_config()
                .elect(campaigns.load(Ordering::Relaxed));
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// What the admin listener needs to see and change the membership of this node's groups.
pub struct Members {
    pub rafts: Arc<Vec<Option<Raft>>>,
    pub calls: super::stop::RaftCalls,
    pub book: Arc<AddressBook>,
    pub rejoining: Arc<Rejoining>,
    pub transport: super::transport::Transport,
    /// openraft's leader lease (`raft.election_timeout` twice): how long followers refuse
    /// to vote after they last heard from their leader.
    pub leader_lease: std::time::Duration,
}

impl Members {
    pub fn report(&self) -> ursula_wire::admin::MembershipReport {
        ursula_wire::admin::MembershipReport {
            node: self.transport.this_node,
            rejoining: self.rejoining.groups(),
            groups: self
                .hosted()
                .map(|(group, raft)| report_here(raft, group))
                .collect(),
        }
    }

    fn hosted(&self) -> impl Iterator<Item = (u32, &Raft)> {
        self.rafts
            .iter()
            .enumerate()
            .filter_map(|(group, raft)| Some((group as u32, raft.as_ref()?)))
    }

    /// Makes `change` in every group this node hosts, one group after the other, each by its
    /// leader, here or forwarded; leader changes and changes in progress are waited out until
    /// `patience` has passed. The groups it holds in.
    pub async fn change(
        &self,
        change: &MembershipChange,
        patience: std::time::Duration,
    ) -> Result<u32, ChangeError> {
        let deadline = tokio::time::Instant::now() + patience;
        let mut groups = 0;
        for (group, raft) in self.hosted() {
            loop {
                let leader = raft.metrics().borrow().current_leader;
                let result = match leader {
                    Some(id) if id == self.transport.this_node => {
                        change_here(raft, &self.calls, group, change).await
                    }
                    Some(id) => self.forward(id, group, change).await,
                    None => Err(ChangeError::Failed(format!("group {group} has no leader"))),
                };
                match result {
                    Ok(()) => break,
                    Err(ChangeError::Refused(why)) => return Err(ChangeError::Refused(why)),
                    Err(error) if tokio::time::Instant::now() >= deadline => {
                        return Err(ChangeError::Failed(format!(
                            "group {group}: {error} (changed in {groups} groups before)"
                        )));
                    }
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
                }
            }
            groups += 1;
        }
        Ok(groups)
    }

    /// Takes over the leadership of groups from the voters that lead the most, until this
    /// node leads its share (the groups over the voters, rounded down): each such leader hands
    /// the group off (`CallKind::HandOff`), and once the followers' leases have run out this
    /// node campaigns first. openraft 0.9 has no leadership transfer; this costs each group
    /// moved about a lease of refused writes, as a drain does. The groups it leads afterwards
    /// of those it asked for.
    pub async fn claim_leadership(&self) -> Result<Vec<u32>, ChangeError> {
        let me = self.transport.this_node;
        let chosen = {
            let leaders: Vec<(u32, Option<NodeId>, Vec<NodeId>)> = self
                .hosted()
                .map(|(group, raft)| {
                    let metrics = raft.metrics();
                    let metrics = metrics.borrow();
                    let voters = metrics.membership_config.membership().voter_ids().collect();
                    (group, metrics.current_leader, voters)
                })
                .collect();
            share_out(me, &leaders)
        };
        let window_ms = (self.leader_lease * 3).as_millis() as u64;
        for (group, leader) in &chosen {
            let body = postcard::to_allocvec(&window_ms)
                .map_err(|e| ChangeError::Failed(e.to_string()))?;
            let peer = self.book.get(*leader).ok_or_else(|| {
                ChangeError::Failed(format!("the address of node {leader} is unknown"))
            })?;
            let answer = super::network::forward::<Result<(), ChangeError>>(
                &self.transport.http,
                me,
                &peer.cluster_url,
                *group as usize,
                super::peer_link::CallKind::HandOff,
                body,
            )
            .await;
            if let Err(error) = answer.map_err(ChangeError::Failed).and_then(|a| a) {
                tracing::info!(group, leader, %error, "the leader did not hand the group off");
            }
        }
        // The followers heard from the old leader up to now: they vote once their lease ends.
        tokio::time::sleep(self.leader_lease + std::time::Duration::from_millis(50)).await;
        let rafts: Vec<(u32, &Raft)> = self
            .hosted()
            .filter(|(group, _)| chosen.iter().any(|(g, _)| g == group))
            .collect();
        // A campaign a follower turns down (its lease had a moment left) is tried again.
        let deadline = tokio::time::Instant::now() + self.leader_lease * 2;
        loop {
            let mut led = Vec::new();
            for (group, raft) in &rafts {
                let (leads, campaigning) = {
                    let metrics = raft.metrics();
                    let metrics = metrics.borrow();
                    (
                        metrics.current_leader == Some(me),
                        metrics.state == openraft::ServerState::Candidate,
                    )
                };
                if leads {
                    led.push(*group);
                } else if !campaigning {
                    let _ = self.calls.run(raft.trigger().elect()).await;
                }
            }
            if led.len() == rafts.len() || tokio::time::Instant::now() >= deadline {
                return Ok(led);
            }
            tokio::time::sleep(self.leader_lease / 4).await;
        }
    }

    async fn forward(
        &self,
        leader: NodeId,
        group: u32,
        change: &MembershipChange,
    ) -> Result<(), ChangeError> {
        let Some(peer) = self.book.get(leader) else {
            return Err(ChangeError::Failed(format!(
                "the address of node {leader}, group {group}'s leader, is unknown"
            )));
        };
        let body = postcard::to_allocvec(change).map_err(|e| ChangeError::Failed(e.to_string()))?;
        super::network::forward::<Result<(), ChangeError>>(
            &self.transport.http,
            self.transport.this_node,
            &peer.cluster_url,
            group as usize,
            super::peer_link::CallKind::Membership,
            body,
        )
        .await
        .map_err(|why| ChangeError::Failed(format!("node {leader}: {why}")))?
    }
}

/// Which groups node `me` takes, and from whom: from the voters that lead the most, one group
/// at a time, until it leads its share of `leaders` ((group, leader, voters) of each group),
/// and only groups it votes in.
fn share_out(me: NodeId, leaders: &[(u32, Option<NodeId>, Vec<NodeId>)]) -> Vec<(u32, NodeId)> {
    let voters: BTreeSet<NodeId> = leaders
        .iter()
        .flat_map(|(_, _, v)| v.iter().copied())
        .collect();
    if !voters.contains(&me) {
        return Vec::new();
    }
    let share = leaders.len() / voters.len();
    let mut led: BTreeMap<NodeId, Vec<u32>> = voters.iter().map(|id| (*id, Vec::new())).collect();
    for (group, leader, group_voters) in leaders {
        if let Some(leader) = leader
            && group_voters.contains(&me)
        {
            led.entry(*leader).or_default().push(*group);
        }
    }
    let mut chosen = Vec::new();
    while led.get(&me).map_or(0, Vec::len) < share {
        let Some((&busiest, groups)) = led
            .iter_mut()
            .filter(|(id, _)| **id != me)
            .max_by_key(|(id, groups)| (groups.len(), std::cmp::Reverse(**id)))
        else {
            break;
        };
        if groups.len() <= share {
            break;
        }
        let Some(group) = groups.pop() else { break };
        chosen.push((group, busiest));
        led.entry(me).or_default().push(group);
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_voter_takes_its_share_from_the_busiest_leaders_only() {
        let five: Vec<NodeId> = vec![1, 2, 3, 4, 5];
        // 16 groups led 8, 4, 4 by voters 1-3 of five: voter 4 takes 3 (16 / 5), from the
        // busiest each time.
        let leaders: Vec<(u32, Option<NodeId>, Vec<NodeId>)> = (0..16)
            .map(|g| (g, Some([1, 1, 2, 3][g as usize % 4]), five.clone()))
            .collect();
        let chosen = share_out(4, &leaders);
        assert_eq!(chosen.len(), 3, "{chosen:?}");
        let mut counts: BTreeMap<NodeId, usize> = BTreeMap::new();
        for (_, leader, _) in &leaders {
            *counts.entry(leader.unwrap()).or_default() += 1;
        }
        for (_, from) in &chosen {
            *counts.get_mut(from).unwrap() -= 1;
        }
        assert!(
            counts.values().all(|n| *n >= 3),
            "nobody is left below its share: {counts:?}"
        );
        // Already leading its share, or not a voter: nothing.
        let mine: Vec<_> = (0..16).map(|g| (g, Some(4), five.clone())).collect();
        assert!(share_out(4, &mine).is_empty());
        let others: Vec<_> = (0..16).map(|g| (g, Some(1), vec![1, 2, 3])).collect();
        assert!(share_out(4, &others).is_empty());
    }
}
