//! Admin API types (the admin listener, port 4438), shared with the operator.

use serde::{Deserialize, Serialize};

/// The answer to `POST /admin/buckets/{bucket}/purge`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeResponse {
    pub bucket: String,
    /// Streams this purge deleted; 0 when the bucket was already purged.
    pub purged_streams: u64,
    /// Always true after a successful purge: the bucket ID can never be used again.
    pub fenced: bool,
}

/// The answer to `GET /admin/membership`: this node's view of every group it hosts. A
/// group's leader knows how far each member's log is; the others name the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipReport {
    pub node: u64,
    /// Groups whose replica here lost its Raft state and waits to be brought back as a
    /// learner (it votes in none of them meanwhile).
    pub rejoining: Vec<u32>,
    pub groups: Vec<GroupMembership>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMembership {
    pub group: u32,
    pub leader: Option<u64>,
    /// Every voter, of both configurations while a change is in progress (`joint`).
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    pub joint: bool,
    /// Entries each other member lacks of the leader's log; only on the leader's report.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub lag: std::collections::BTreeMap<u64, u64>,
}

impl MembershipReport {
    /// Each group as its leader reports it, from the reports of every node asked: the
    /// groups whose leader was not among them are left out.
    pub fn leaders_view(reports: &[MembershipReport]) -> Vec<GroupMembership> {
        let mut groups: std::collections::BTreeMap<u32, GroupMembership> = Default::default();
        for report in reports {
            for group in &report.groups {
                if group.leader == Some(report.node) {
                    groups.insert(group.group, group.clone());
                }
            }
        }
        groups.into_values().collect()
    }
}

/// The body of `PUT /admin/membership/learners/{id}`: where the new node is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewMember {
    pub cluster_url: String,
    pub client_url: String,
}

/// The answer to a membership change: the groups it now holds in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipChanged {
    pub node: u64,
    /// `learner`, `voter` or `removed`.
    pub role: String,
    pub groups: u32,
}
