//! A voter that lost its volume must never vote with its old identity: Raft's safety rests on
//! a voter remembering whom it voted for, and which entries it acknowledged. A node that joins
//! (`raft.join`) and finds no Raft state marks every group it hosts as rejoining: there it
//! grants no vote and never campaigns, until a membership change has made it a learner (it is
//! then caught up, and promoted, like any new node). The marks are a file, so that a restart
//! half-way does not forget them along with the data that is not there yet.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::types::{NodeId, StoredMembership};

pub struct Rejoining {
    path: PathBuf,
    groups: Mutex<BTreeSet<u32>>,
}

impl Rejoining {
    /// The marks in `raft_dir`; `lost_state` (the directory did not exist) with `join` marks
    /// every group in `hosted`.
    pub fn open(
        raft_dir: &Path,
        lost_state: bool,
        join: bool,
        hosted: impl IntoIterator<Item = u32>,
    ) -> Result<Self, String> {
        let path = raft_dir.join("rejoining");
        let groups = match std::fs::read_to_string(&path) {
            Ok(text) => text
                .split_whitespace()
                .map(|group| group.parse::<u32>())
                .collect::<Result<BTreeSet<u32>, _>>()
                .map_err(|e| format!("{}: {e}", path.display()))?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
            Err(error) => return Err(format!("{}: {error}", path.display())),
        };
        let rejoining = Self {
            path,
            groups: Mutex::new(groups),
        };
        if lost_state && join {
            let mut groups = rejoining.groups.lock();
            groups.extend(hosted);
            rejoining.persist(&groups)?;
            tracing::warn!(
                groups = groups.len(),
                "this node joins with no Raft state: it votes nowhere until it is a learner"
            );
        }
        Ok(rejoining)
    }

    pub fn contains(&self, group: u32) -> bool {
        self.groups.lock().contains(&group)
    }

    pub fn groups(&self) -> Vec<u32> {
        self.groups.lock().iter().copied().collect()
    }

    /// Clears `group`'s mark once `membership`, applied here, names `node` as a learner:
    /// whether it did.
    pub fn readmitted(
        &self,
        group: u32,
        node: NodeId,
        membership: &StoredMembership,
    ) -> Result<bool, String> {
        let mut groups = self.groups.lock();
        if !groups.contains(&group) || !is_learner(node, membership) {
            return Ok(false);
        }
        groups.remove(&group);
        self.persist(&groups)?;
        tracing::info!(
            group,
            "readmitted as a learner: this node may vote there again once promoted"
        );
        Ok(true)
    }

    fn persist(&self, groups: &BTreeSet<u32>) -> Result<(), String> {
        let fail = |e: std::io::Error| format!("{}: {e}", self.path.display());
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(fail)?;
        let text: String = groups.iter().map(|g| format!("{g}\n")).collect();
        let temporary = self.path.with_extension("tmp");
        let mut file = std::fs::File::create(&temporary).map_err(fail)?;
        file.write_all(text.as_bytes()).map_err(fail)?;
        file.sync_all().map_err(fail)?;
        std::fs::rename(&temporary, &self.path).map_err(fail)?;
        std::fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(fail)
    }
}

/// Whether `node` is in `membership` and a voter in none of its configurations.
fn is_learner(node: NodeId, membership: &StoredMembership) -> bool {
    membership.nodes().any(|(id, _)| *id == node) && !membership.voter_ids().any(|id| id == node)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use openraft::{BasicNode, Membership};

    use super::*;

    fn membership(voters: &[NodeId], learners: &[NodeId]) -> StoredMembership {
        let nodes: BTreeMap<NodeId, BasicNode> = voters
            .iter()
            .chain(learners)
            .map(|id| (*id, BasicNode::new(format!("https://node-{id}"))))
            .collect();
        let membership = Membership::new(vec![voters.iter().copied().collect()], nodes);
        StoredMembership::new(None, membership)
    }

    #[test]
    fn a_node_that_joins_without_state_is_marked_until_a_membership_makes_it_a_learner() {
        let dir = tempfile::tempdir().unwrap();
        let raft = dir.path().join("raft");
        let marks = Rejoining::open(&raft, true, true, [0, 1]).unwrap();
        assert_eq!(marks.groups(), vec![0, 1]);
        // Still a voter of the old membership, or not in it at all: still marked.
        assert!(
            !marks
                .readmitted(0, 3, &membership(&[1, 2, 3], &[]))
                .unwrap()
        );
        assert!(!marks.readmitted(0, 3, &membership(&[1, 2], &[])).unwrap());
        assert!(marks.readmitted(0, 3, &membership(&[1, 2], &[3])).unwrap());
        assert!(!marks.contains(0) && marks.contains(1));
        // The marks outlive a restart, and a restart with state adds none.
        let again = Rejoining::open(&raft, false, true, [0, 1]).unwrap();
        assert_eq!(again.groups(), vec![1]);
    }

    #[test]
    fn a_seeding_node_or_one_with_state_is_never_marked() {
        let dir = tempfile::tempdir().unwrap();
        let raft = dir.path().join("raft");
        assert!(
            Rejoining::open(&raft, true, false, [0])
                .unwrap()
                .groups()
                .is_empty()
        );
        assert!(
            Rejoining::open(&raft, false, true, [0])
                .unwrap()
                .groups()
                .is_empty()
        );
    }
}
