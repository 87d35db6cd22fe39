//! How a voter proves its node ID on the cluster listener: its certificate, signed by the
//! cluster's CA, names `node_name(id)` among its DNS names. A connecting voter checks the name
//! of the node it meant to reach, and a listener checks the name of the node a message claims
//! to come from. The operator, `dev-cluster` and the tests issue certificates to this rule.

/// The DNS name that stands for node `id` in a cluster certificate. `.internal` is reserved
/// for private use, so the name never resolves to anything on a real network.
pub fn node_name(id: u64) -> String {
    format!("node-{id}.ursula.internal")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_differ_by_id() {
        assert_eq!(node_name(3), "node-3.ursula.internal");
        assert_ne!(node_name(1), node_name(11));
    }
}
