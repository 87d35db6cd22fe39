//! A test cluster's certificates (`ursula_wire::issue`), as its voters read them.

pub use ursula_wire::issue::{Authority, ClusterFiles};

/// How long test certificates are valid.
pub const VALID_FOR: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// A CA in `dir` and a certificate for each of `ids`.
pub fn write_cluster(dir: &std::path::Path, ids: &[u64]) -> (ClusterFiles, Authority) {
    let files = ClusterFiles {
        dir: dir.to_owned(),
    };
    let authority = files
        .write("ursula test cluster", ids, &[], VALID_FOR)
        .expect("cluster certificates");
    (files, authority)
}
