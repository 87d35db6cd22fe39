//! Counters the admin listener exports in Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds, in seconds, of the fsync latency histogram buckets.
const FSYNC_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

#[derive(Default)]
pub struct Metrics {
    pub appends: AtomicU64,
    pub appended_bytes: AtomicU64,
    pub commands: AtomicU64,
    pub batches: AtomicU64,
    pub fsyncs: AtomicU64,
    pub commit_failures: AtomicU64,
    /// Raft log entries made durable (a replicated node's own and its followers' writes).
    pub log_entries: AtomicU64,
    /// AppendEntries RPCs this node received as a follower, and the entries they carried.
    pub append_rpcs: AtomicU64,
    pub append_rpc_entries: AtomicU64,
    /// SSE data events rendered, and those sent as already rendered for another subscriber.
    pub sse_events_rendered: AtomicU64,
    pub sse_events_shared: AtomicU64,
    /// Cold flushes that committed, the bytes they took off local disk, objects the sweep
    /// deleted.
    pub cold_flushes: AtomicU64,
    pub cold_flushed_bytes: AtomicU64,
    pub cold_swept: AtomicU64,
    /// Cold objects read from object storage (not from the read cache).
    pub cold_fetches: AtomicU64,
    /// Create and append bodies staged in object storage before they were proposed.
    pub staged_bodies: AtomicU64,
    fsync_seconds_sum_ns: AtomicU64,
    fsync_buckets: [AtomicU64; FSYNC_BUCKETS.len()],
}

impl Metrics {
    pub fn observe_fsync(&self, took: Duration) {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.fsync_seconds_sum_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        let secs = took.as_secs_f64();
        for (bound, count) in FSYNC_BUCKETS.iter().zip(&self.fsync_buckets) {
            if secs <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Counts a batch of applied commands and the appends among their effects.
    pub fn count(&self, commands: u64, effects: &[crate::machine::Effect]) {
        let (mut appends, mut bytes) = (0, 0);
        for effect in effects {
            if let crate::machine::Effect::PutRecord { bytes: record, .. } = effect {
                appends += 1;
                bytes += record.len() as u64;
            }
        }
        self.commands.fetch_add(commands, Ordering::Relaxed);
        self.appends.fetch_add(appends, Ordering::Relaxed);
        self.appended_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn render(&self, out: &mut String) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let counters = [
            (
                "ursula_appends_total",
                "Appends that wrote data.",
                &self.appends,
            ),
            (
                "ursula_appended_bytes_total",
                "Bytes appended.",
                &self.appended_bytes,
            ),
            ("ursula_commands_total", "Commands applied.", &self.commands),
            (
                "ursula_commit_batches_total",
                "Group-commit batches.",
                &self.batches,
            ),
            (
                "ursula_raft_log_entries_total",
                "Raft log entries made durable on this node.",
                &self.log_entries,
            ),
            (
                "ursula_raft_append_rpcs_total",
                "AppendEntries RPCs received (heartbeats included).",
                &self.append_rpcs,
            ),
            (
                "ursula_raft_append_rpc_entries_total",
                "Entries those RPCs carried.",
                &self.append_rpc_entries,
            ),
            (
                "ursula_sse_events_rendered_total",
                "SSE data events rendered for a subscriber.",
                &self.sse_events_rendered,
            ),
            (
                "ursula_sse_events_shared_total",
                "SSE data events sent as another subscriber at the same position had them rendered.",
                &self.sse_events_shared,
            ),
            (
                "ursula_cold_flushes_total",
                "Cold flushes that committed on a group this node leads.",
                &self.cold_flushes,
            ),
            (
                "ursula_cold_flushed_bytes_total",
                "Record bytes those flushes took off local disk.",
                &self.cold_flushed_bytes,
            ),
            (
                "ursula_cold_swept_objects_total",
                "Cold objects deleted because no segment referred to them.",
                &self.cold_swept,
            ),
            (
                "ursula_staged_bodies_total",
                "Bodies staged in object storage before their write was proposed.",
                &self.staged_bodies,
            ),
            (
                "ursula_cold_object_fetches_total",
                "Cold objects fetched from object storage for readers.",
                &self.cold_fetches,
            ),
            (
                "ursula_commit_failures_total",
                "Batches whose commit failed.",
                &self.commit_failures,
            ),
        ];
        for (name, help, counter) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                get(counter)
            );
        }
        let name = "ursula_fsync_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Latency of durable commits (one fsync each)."
        );
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (bound, count) in FSYNC_BUCKETS.iter().zip(&self.fsync_buckets) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", get(count));
        }
        let total = get(&self.fsyncs);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}");
        let sum = get(&self.fsync_seconds_sum_ns) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {total}");
    }
}
