//! `/metrics`: the node's counters and, on a replicated node, each group's Raft state.

use std::fmt::Write;

use crate::groups::Groups;

pub fn render(groups: &Groups, out: &mut String) {
    // All groups of a node share one metrics object.
    if let Some(engine) = groups.all().next() {
        engine.metrics.render(out);
    }
    let local: Vec<(usize, u64)> = groups
        .hosted()
        .filter_map(|(group, engine)| Some((group, engine.local_record_bytes()?)))
        .collect();
    if !local.is_empty() {
        let name = "ursula_group_local_record_bytes";
        let _ = writeln!(
            out,
            "# HELP {name} Record bytes the group holds on local disk, as this node last counted them as its leader.\n# TYPE {name} gauge"
        );
        for (group, bytes) in local {
            let _ = writeln!(out, "{name}{{group=\"{group}\"}} {bytes}");
        }
    }
    if groups.cluster.is_none() {
        return;
    }
    let gauges = [
        (
            "ursula_group_is_leader",
            "1 when this node leads the group.",
        ),
        (
            "ursula_group_leader_id",
            "The node ID of the group's leader; 0 when unknown.",
        ),
        ("ursula_group_term", "The group's current Raft term."),
        (
            "ursula_group_last_log_index",
            "The group's last log index on this node.",
        ),
        (
            "ursula_group_applied_index",
            "The group's last applied (committed) log index.",
        ),
        (
            "ursula_group_apply_lag",
            "Log entries received but not yet applied.",
        ),
    ];
    let rows: Vec<(usize, [u64; 6])> = groups
        .hosted()
        .filter_map(|(group, engine)| engine.group_status().map(|status| (group, status)))
        .map(|(group, s)| {
            (
                group,
                [
                    u64::from(s.leads()),
                    s.leader.unwrap_or(0),
                    s.term,
                    s.last_log_index,
                    s.applied_index,
                    s.last_log_index.saturating_sub(s.applied_index),
                ],
            )
        })
        .collect();
    for (column, (name, help)) in gauges.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (group, row) in &rows {
            let _ = writeln!(out, "{name}{{group=\"{group}\"}} {}", row[column]);
        }
    }
}
