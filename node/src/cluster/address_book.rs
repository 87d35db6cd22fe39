//! Where each node is: its cluster URL (peers) and client URL (redirects). The config's
//! `raft.peers` seeds the book; nodes added since are learned from the Raft membership, whose
//! entries carry both URLs, so that a voter added at run time is reachable from every node
//! without a config change anywhere.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use openraft::BasicNode;
use parking_lot::RwLock;

use super::peer_link::PeerLink;
use super::transport::{ClusterTls, authority_of};
use super::types::NodeId;
use crate::config::Peer;

pub struct AddressBook {
    this_node: NodeId,
    peers: RwLock<BTreeMap<NodeId, Peer>>,
    tls: RwLock<Option<Arc<ClusterTls>>>,
    /// One link per peer, started on first use (`peer_link`).
    links: RwLock<HashMap<NodeId, Arc<PeerLink>>>,
}

impl AddressBook {
    pub fn new(this_node: NodeId, seed: &[Peer]) -> Self {
        Self {
            this_node,
            peers: RwLock::new(seed.iter().map(|peer| (peer.id, peer.clone())).collect()),
            tls: RwLock::new(None),
            links: RwLock::default(),
        }
    }

    /// The TLS peer links use; set once the transport is open.
    pub fn use_tls(&self, tls: Option<Arc<ClusterTls>>) {
        *self.tls.write() = tls;
    }

    pub fn get(&self, id: NodeId) -> Option<Peer> {
        self.peers.read().get(&id).cloned()
    }

    pub fn ids(&self) -> Vec<NodeId> {
        self.peers.read().keys().copied().collect()
    }

    /// The node whose cluster listener is at `authority` (`host:port`).
    pub fn node_at(&self, authority: &str) -> Option<NodeId> {
        self.peers
            .read()
            .values()
            .find(|peer| authority_of(&peer.cluster_url) == authority)
            .map(|peer| peer.id)
    }

    /// Takes in what a membership says of its nodes. A node's address changes only when the
    /// membership names both of its URLs (entries written before they did name one).
    pub fn learn<'a>(&self, nodes: impl IntoIterator<Item = (&'a NodeId, &'a BasicNode)>) {
        let learned: Vec<Peer> = nodes
            .into_iter()
            .filter_map(|(id, node)| peer_of(*id, node))
            .collect();
        let changed: Vec<NodeId> = {
            let mut peers = self.peers.write();
            let mut changed = Vec::new();
            for peer in learned {
                if peers.get(&peer.id) != Some(&peer) {
                    changed.push(peer.id);
                    peers.insert(peer.id, peer);
                }
            }
            changed
        };
        if !changed.is_empty() {
            let mut links = self.links.write();
            for id in &changed {
                links.remove(id);
            }
            tracing::info!(nodes = ?changed, "learned node addresses from the membership");
        }
    }

    /// The link to `target`, started now if it has none yet; `None` for this node or a node
    /// the book does not know.
    pub fn link(&self, target: NodeId) -> Option<Arc<PeerLink>> {
        if target == self.this_node {
            return None;
        }
        if let Some(link) = self.links.read().get(&target) {
            return Some(link.clone());
        }
        let url = self.get(target)?.cluster_url;
        let mut links = self.links.write();
        let link = links
            .entry(target)
            .or_insert_with(|| PeerLink::start(&url, target, self.tls.read().clone()));
        Some(link.clone())
    }
}

/// A node as a membership entry names it: `addr` is its cluster URL, a space, and its client
/// URL (URLs hold no spaces). openraft's `BasicNode` has one field, and entries already in logs
/// decode only as that type.
pub fn member_node(peer: &Peer) -> BasicNode {
    BasicNode::new(format!("{} {}", peer.cluster_url, peer.client_url))
}

/// The cluster URL a membership entry gives for a node: entries written before they named
/// both URLs hold only that one.
pub fn cluster_url_of(node: &BasicNode) -> &str {
    node.addr.split(' ').next().unwrap_or_default()
}

fn peer_of(id: NodeId, node: &BasicNode) -> Option<Peer> {
    let (cluster_url, client_url) = node.addr.split_once(' ')?;
    Some(Peer {
        id,
        cluster_url: cluster_url.to_owned(),
        client_url: client_url.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: NodeId, host: &str) -> Peer {
        Peer {
            id,
            cluster_url: format!("https://{host}:4439"),
            client_url: format!("http://{host}:4437"),
        }
    }

    #[test]
    fn a_membership_node_names_both_urls_and_old_ones_only_the_cluster_url() {
        let node = member_node(&peer(4, "10.0.0.4"));
        assert_eq!(cluster_url_of(&node), "https://10.0.0.4:4439");
        assert_eq!(peer_of(4, &node), Some(peer(4, "10.0.0.4")));
        let old = BasicNode::new("https://10.0.0.4:4439");
        assert_eq!(cluster_url_of(&old), "https://10.0.0.4:4439");
        assert_eq!(peer_of(4, &old), None);
    }

    #[test]
    fn the_book_learns_new_and_moved_nodes_but_keeps_what_old_entries_do_not_name() {
        let book = AddressBook::new(1, &[peer(1, "a"), peer(2, "b")]);
        let nodes = BTreeMap::from([
            (2, BasicNode::new("https://elsewhere:4439")),
            (3, member_node(&peer(3, "c"))),
        ]);
        book.learn(&nodes);
        assert_eq!(book.get(2), Some(peer(2, "b")));
        assert_eq!(book.get(3), Some(peer(3, "c")));
        assert_eq!(book.node_at("c:4439"), Some(3));
        assert_eq!(book.ids(), vec![1, 2, 3]);
        book.learn(&BTreeMap::from([(3, member_node(&peer(3, "d")))]));
        assert_eq!(book.node_at("d:4439"), Some(3));
        assert_eq!(book.node_at("c:4439"), None);
    }
}
