//! Which Raft group holds a stream: part of the contract, since every node, every version
//! and the tests must agree on it.
//!
//! A bucket is the unit of placement: all of a bucket's streams live in one group. A fork
//! shares its source's records and a deleted source is kept for its forks, so a fork must live
//! with its source, and a fork's source may be any stream of its bucket. Buckets spread across
//! the groups by a stable hash (FNV-1a, the same on every node and every version).

/// The group of `bucket` among `group_count` groups.
pub fn group_of(bucket: &str, group_count: usize) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bucket.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % group_count.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::group_of;

    #[test]
    fn placement_is_stable_and_spreads() {
        // Fixed values: changing the hash would move every bucket of a running cluster.
        assert_eq!(group_of("demo", 16), 6);
        assert_eq!(group_of("v1", 16), 8);
        assert_eq!(group_of("anything", 1), 0);
        let mut used = std::collections::HashSet::new();
        for i in 0..256 {
            used.insert(group_of(&format!("bucket-{i}"), 16));
        }
        assert_eq!(used.len(), 16, "256 buckets reach every one of 16 groups");
    }
}
