//! Per subscription: webhook deliveries, failures, retries and reissued wakes, and how long
//! after a wake opened its consumer was told (the wake lag).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use parking_lot::Mutex;

use crate::engine::Histogram;

#[derive(Default)]
struct Counts {
    delivered: u64,
    failed: u64,
    retried: u64,
    reissued: u64,
    last_lag: Duration,
}

/// A per-subscription series: its name, help and value.
type Series = (&'static str, &'static str, fn(&Counts) -> f64);

#[derive(Default)]
pub struct SubscriptionMetrics {
    by_subscription: Mutex<BTreeMap<(String, String), Counts>>,
    wake_lag: Histogram,
}

impl SubscriptionMetrics {
    fn count(&self, bucket: &str, id: &str, update: impl FnOnce(&mut Counts)) {
        let mut map = self.by_subscription.lock();
        update(map.entry((bucket.to_owned(), id.to_owned())).or_default());
    }

    pub fn delivered(&self, bucket: &str, id: &str, lag: Duration) {
        self.wake_lag.observe(lag);
        self.count(bucket, id, |c| {
            c.delivered += 1;
            c.last_lag = lag;
        });
    }

    pub fn failed(&self, bucket: &str, id: &str) {
        self.count(bucket, id, |c| c.failed += 1);
    }

    pub fn retried(&self, bucket: &str, id: &str) {
        self.count(bucket, id, |c| c.retried += 1);
    }

    pub fn reissued(&self, bucket: &str, id: &str) {
        self.count(bucket, id, |c| c.reissued += 1);
    }

    pub fn render(&self, out: &mut String) {
        self.wake_lag.render(
            "ursula_subscription_wake_lag_seconds",
            "From a wake opening to its webhook answering 2xx, on the group's leader.",
            out,
        );
        let map = self.by_subscription.lock();
        let series: [Series; 5] = [
            (
                "ursula_subscription_deliveries_total",
                "Webhook requests a receiver took (2xx).",
                |c| c.delivered as f64,
            ),
            (
                "ursula_subscription_delivery_failures_total",
                "Webhook requests that failed or were refused.",
                |c| c.failed as f64,
            ),
            (
                "ursula_subscription_delivery_retries_total",
                "Webhook requests sent again after a failure.",
                |c| c.retried as f64,
            ),
            (
                "ursula_subscription_wakes_reissued_total",
                "Wakes issued again under a new generation (lease lapsed, or leadership taken over).",
                |c| c.reissued as f64,
            ),
            (
                "ursula_subscription_last_wake_lag_seconds",
                "The wake lag of the subscription's last delivery.",
                |c| c.last_lag.as_secs_f64(),
            ),
        ];
        for (name, help, value) in series {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for ((bucket, id), counts) in map.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{bucket=\"{bucket}\",subscription=\"{id}\"}} {}",
                    value(counts)
                );
            }
        }
    }
}
