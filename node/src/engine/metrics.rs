//! Counters the admin listener exports in Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds, in seconds, of the latency histograms' buckets.
const BUCKETS: [f64; 17] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// A Prometheus histogram of durations, with the largest one seen.
#[derive(Default)]
pub struct Histogram {
    count: AtomicU64,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
}

impl Histogram {
    pub fn observe(&self, took: Duration) {
        let ns = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
        let secs = took.as_secs_f64();
        if let Some(at) = BUCKETS.iter().position(|bound| secs <= *bound) {
            self.buckets[at].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// `name` as a histogram (cumulative buckets), and `{name}_max` as a gauge.
    pub fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let total = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {total}");
        let max = self.max_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(
            out,
            "# HELP {name}_max The longest one since the node started.\n# TYPE {name}_max gauge\n{name}_max {max}"
        );
    }
}

#[derive(Default)]
pub struct Metrics {
    pub appends: AtomicU64,
    pub appended_bytes: AtomicU64,
    pub commands: AtomicU64,
    pub batches: AtomicU64,
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
    fsync_seconds: Histogram,
    /// Client requests from arrival to response headers; live reads (long-poll, SSE) are not
    /// counted, since they wait by design.
    pub request_seconds: Histogram,
}

impl Metrics {
    pub fn observe_fsync(&self, took: Duration) {
        self.fsync_seconds.observe(took);
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
        self.fsync_seconds.render(
            "ursula_fsync_seconds",
            "Latency of durable commits (one fsync each).",
            out,
        );
        self.request_seconds.render(
            "ursula_http_request_seconds",
            "Client requests from arrival to response headers (not long-polls or SSE).",
            out,
        );
    }
}
