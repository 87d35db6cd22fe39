//! How calls to each peer are going, for the log. A peer that is down, partitioned or slow
//! fails every RPC of every group, tens of times a second; logging each one buried everything
//! else (openraft's per-RPC lines are filtered out in `main`). Instead the first failure after
//! a success is logged, then at most one line per `REPORT_INTERVAL` with the count and the
//! latest error, and one line when calls succeed again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::types::NodeId;

/// At most one line per peer this often while its calls keep failing.
const REPORT_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Default)]
struct PeerState {
    /// Failures not yet reported.
    unreported: u64,
    /// Failures since the last success.
    failing_for: u64,
    last_report: Option<Instant>,
}

/// What to log after one call, if anything.
#[derive(Debug, PartialEq, Eq)]
pub enum Report {
    /// The first failure after a success, or the first in a while: `count` failures since
    /// the last line.
    Failing { count: u64 },
    /// A success after `failures` failed calls.
    Recovered { failures: u64 },
}

#[derive(Default)]
pub struct LinkHealth {
    peers: Mutex<HashMap<NodeId, PeerState>>,
}

impl LinkHealth {
    pub fn failed(&self, peer: NodeId, kind: &str, error: &str) {
        if let Some(Report::Failing { count }) = self.record_failure(peer, Instant::now()) {
            tracing::warn!(
                peer,
                failed_calls = count,
                "calls to node {peer} are failing ({count} since the last report; latest: {kind}: {error}); next report in {}s at most",
                REPORT_INTERVAL.as_secs()
            );
        }
    }

    pub fn succeeded(&self, peer: NodeId) {
        if let Some(Report::Recovered { failures }) = self.record_success(peer) {
            tracing::info!(
                peer,
                failed_calls = failures,
                "calls to node {peer} succeed again, after {failures} failed"
            );
        }
    }

    fn record_failure(&self, peer: NodeId, now: Instant) -> Option<Report> {
        let mut peers = self.peers.lock();
        let state = peers.entry(peer).or_default();
        state.unreported += 1;
        state.failing_for += 1;
        let due = state.failing_for == 1
            || state
                .last_report
                .is_none_or(|at| now.duration_since(at) >= REPORT_INTERVAL);
        if !due {
            return None;
        }
        state.last_report = Some(now);
        Some(Report::Failing {
            count: std::mem::take(&mut state.unreported),
        })
    }

    fn record_success(&self, peer: NodeId) -> Option<Report> {
        let mut peers = self.peers.lock();
        let state = peers.get_mut(&peer)?;
        if state.failing_for == 0 {
            return None;
        }
        let failures = std::mem::take(&mut state.failing_for);
        state.unreported = 0;
        Some(Report::Recovered { failures })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_peer_is_reported_once_per_interval_with_a_count() {
        let health = LinkHealth::default();
        let t0 = Instant::now();
        assert_eq!(
            health.record_failure(2, t0),
            Some(Report::Failing { count: 1 })
        );
        for i in 1..=99 {
            let at = t0 + Duration::from_millis(i * 50);
            assert_eq!(health.record_failure(2, at), None, "failure {i}");
        }
        // Another peer is its own story.
        assert_eq!(
            health.record_failure(3, t0),
            Some(Report::Failing { count: 1 })
        );
        let later = t0 + REPORT_INTERVAL;
        assert_eq!(
            health.record_failure(2, later),
            Some(Report::Failing { count: 100 })
        );
        assert_eq!(
            health.record_success(2),
            Some(Report::Recovered { failures: 101 })
        );
        assert_eq!(health.record_success(2), None);
        // Failing again after a recovery is reported at once.
        assert_eq!(
            health.record_failure(2, later + Duration::from_millis(1)),
            Some(Report::Failing { count: 1 })
        );
    }

    #[test]
    fn a_peer_that_never_failed_reports_nothing() {
        let health = LinkHealth::default();
        assert_eq!(health.record_success(4), None);
    }
}
