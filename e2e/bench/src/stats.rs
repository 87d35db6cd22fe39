/// Latency percentiles over samples recorded in nanoseconds, reported in milliseconds.
pub struct Latencies {
    samples: Vec<u64>,
}

impl Latencies {
    pub fn new(mut samples: Vec<u64>) -> Self {
        samples.sort_unstable();
        Self { samples }
    }

    pub fn count(&self) -> usize {
        self.samples.len()
    }

    pub fn percentile(&self, p: f64) -> f64 {
        if self.samples.is_empty() {
            return 0.0;
        }
        let rank = ((p / 100.0) * (self.samples.len() - 1) as f64).round() as usize;
        self.samples[rank.min(self.samples.len() - 1)] as f64 / 1_000_000.0
    }

    pub fn max(&self) -> f64 {
        self.samples.last().copied().unwrap_or_default() as f64 / 1_000_000.0
    }
}
