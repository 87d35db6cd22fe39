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
        .filter_map(|(group, engine)| engine.raft().map(|raft| (group, raft)))
        .map(|(group, raft)| {
            let m = raft.metrics().borrow().clone();
            let last_log = m.last_log_index.unwrap_or(0);
            let applied = m.last_applied.map_or(0, |id| id.index);
            (
                group,
                [
                    u64::from(m.current_leader == Some(m.id)),
                    m.current_leader.unwrap_or(0),
                    m.current_term,
                    last_log,
                    applied,
                    last_log.saturating_sub(applied),
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
