//! The gateway's counters, and their Prometheus text.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub redirects_followed: AtomicU64,
    pub refusals: AtomicU64,
    /// Requests answered over the gateway link rather than HTTP.
    pub link_requests: AtomicU64,
    /// SSE subscriptions the gateway opened to share among its clients.
    pub shared_tails_opened: AtomicU64,
    /// SSE clients served from a subscription another client opened.
    pub shared_tail_joins: AtomicU64,
    /// Long-polls answered with the answer to an identical one in flight.
    pub collapsed_long_polls: AtomicU64,
}

impl Metrics {
    /// The Prometheus text of the counters, and of the shared tails' gauges
    /// (`tails_open`, `tail_clients`).
    pub fn render(&self, tails_open: usize, tail_clients: usize) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "# TYPE ursula_gateway_requests_total counter\nursula_gateway_requests_total {}\n\
             # TYPE ursula_gateway_redirects_followed_total counter\nursula_gateway_redirects_followed_total {}\n\
             # TYPE ursula_gateway_refusals_total counter\nursula_gateway_refusals_total {}\n\
             # TYPE ursula_gateway_link_requests_total counter\nursula_gateway_link_requests_total {}\n\
             # TYPE ursula_gateway_shared_tails_opened_total counter\nursula_gateway_shared_tails_opened_total {}\n\
             # TYPE ursula_gateway_shared_tail_joins_total counter\nursula_gateway_shared_tail_joins_total {}\n\
             # TYPE ursula_gateway_shared_tails_open gauge\nursula_gateway_shared_tails_open {tails_open}\n\
             # TYPE ursula_gateway_shared_tail_clients gauge\nursula_gateway_shared_tail_clients {tail_clients}\n\
             # TYPE ursula_gateway_collapsed_long_polls_total counter\nursula_gateway_collapsed_long_polls_total {}\n",
            get(&self.requests),
            get(&self.redirects_followed),
            get(&self.refusals),
            get(&self.link_requests),
            get(&self.shared_tails_opened),
            get(&self.shared_tail_joins),
            get(&self.collapsed_long_polls)
        )
    }
}
