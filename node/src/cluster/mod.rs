//! Replication: every voter hosts a replica of every Raft group, and each group is its own
//! openraft instance with its own leader.
//!
//! - `types`: the openraft type configuration (a log entry is a batch of state machine
//!   commands).
//! - `coalesce`: a queue that sends what arrives together; `batcher` uses it to gather a
//!   group's concurrent proposals into one entry.
//! - `log_store` / `log_writer`: the Raft logs and votes of all groups in one write-ahead
//!   log, written by one thread so that one fsync covers the entries of many groups (group
//!   commit across groups).
//! - `state_machine`: a group's `Machine`, its published read model and its redb state.
//! - `network` / `service`: Raft RPCs on the cluster listener (`link_health` keeps their
//!   failures to a line per peer per interval in the log). `peer_link` coalesces the
//!   groups' concurrent appends and votes to a peer into one exchange on one connection,
//!   framed by `frame`; snapshots and forwarded purges are HTTP/2 requests. `transport`
//!   is how voters connect and prove their node IDs (mutual TLS).
//! - `stop`: the order in which a voter's replication stops.

pub mod address_book;
pub mod batcher;
pub mod bootstrap;
mod call_error;
pub mod coalesce;
pub mod frame;
mod group;
mod link_health;
pub mod log_store;
mod log_writer;
pub mod membership;
pub mod network;
pub mod peer_link;
pub mod rejoin;
pub mod service;
pub mod state_machine;
pub mod stop;
pub mod transport;
pub mod types;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::config::Config;
use types::{NodeId, Raft};

/// What a node knows of the cluster it belongs to.
pub struct ClusterView {
    pub node_id: NodeId,
    /// Where every node is, this one included.
    pub book: Arc<address_book::AddressBook>,
    /// The voters of a new cluster: `raft.peers`.
    seed: Vec<NodeId>,
    /// Whether this node joins a cluster that exists (`raft.join`) instead of seeding one.
    pub join: bool,
    /// Groups on a subset of the voters.
    group_voters: HashMap<usize, Vec<NodeId>>,
}

impl ClusterView {
    pub fn from_config(config: &Config) -> Option<Arc<Self>> {
        if !config.is_replicated() {
            return None;
        }
        let mut seed: Vec<NodeId> = config.raft.peers.iter().map(|peer| peer.id).collect();
        seed.sort_unstable();
        let group_voters = config
            .raft
            .group_voters
            .iter()
            .map(|entry| {
                let mut voters = entry.voters.clone();
                voters.sort_unstable();
                voters.dedup();
                (entry.group, voters)
            })
            .collect();
        Some(Arc::new(Self {
            node_id: config.node_id,
            book: Arc::new(address_book::AddressBook::new(
                config.node_id,
                &config.raft.peers,
            )),
            seed,
            join: config.raft.join,
            group_voters,
        }))
    }

    /// The voters `group` was seeded with, in ID order.
    pub fn voters_of(&self, group: usize) -> Vec<NodeId> {
        self.group_voters
            .get(&group)
            .cloned()
            .unwrap_or_else(|| self.seed.clone())
    }

    /// Whether this node hosts a replica of `group`: a node that joins hosts every group, as
    /// a learner until it is promoted.
    pub fn hosts(&self, group: usize) -> bool {
        self.join || self.voters_of(group).contains(&self.node_id)
    }

    pub fn client_url(&self, id: NodeId) -> Option<String> {
        self.book.get(id).map(|peer| peer.client_url)
    }
}

/// The first membership of `group` in a new cluster: its seed voters, with their addresses.
pub fn membership(view: &ClusterView, group: usize) -> BTreeMap<NodeId, openraft::BasicNode> {
    view.voters_of(group)
        .into_iter()
        .filter_map(|id| view.book.get(id))
        .map(|peer| (peer.id, address_book::member_node(&peer)))
        .collect()
}

/// Proposes commands, as one log entry, to a group this node leads, and waits until the entry
/// is committed on a quorum and applied here. One answer per command, in order.
pub async fn propose_batch(
    raft: &Raft,
    calls: &stop::RaftCalls,
    commands: Vec<crate::machine::Command>,
) -> Result<
    Vec<Result<crate::machine::Outcome, crate::machine::Refusal>>,
    crate::engine::error::EngineError,
> {
    use crate::engine::error::EngineError;
    use openraft::error::{ClientWriteError, RaftError};
    let expected = commands.len();
    let Some(written) = calls.run(raft.client_write(types::Batch(commands))).await else {
        return Err(EngineError::Stopped);
    };
    match written {
        Ok(written) => match written.data.0 {
            Some(results) if results.len() == expected => Ok(results),
            _ => Err(EngineError::Replication(
                "the state machine gave no answer".into(),
            )),
        },
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
            Err(EngineError::NotLeader {
                leader: forward.leader_id,
            })
        }
        Err(RaftError::APIError(error)) => Err(EngineError::Replication(error.to_string())),
        Err(RaftError::Fatal(openraft::error::Fatal::Stopped)) => Err(EngineError::Stopped),
        Err(RaftError::Fatal(error)) => Err(EngineError::Replication(error.to_string())),
    }
}

/// Proposes one command (see `propose_batch`).
pub async fn propose(
    raft: &Raft,
    calls: &stop::RaftCalls,
    command: crate::machine::Command,
) -> Result<crate::machine::Outcome, crate::engine::error::EngineError> {
    let mut results = propose_batch(raft, calls, vec![command]).await?;
    match results.pop() {
        Some(result) => result.map_err(crate::engine::error::EngineError::Refused),
        None => Err(crate::engine::error::EngineError::Replication(
            "the state machine gave no answer".into(),
        )),
    }
}
