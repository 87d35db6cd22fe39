//! Reads reset sliding TTLs. A read only records the time here; the writer folds the pending
//! resets into a `Touch` command at the start of its next batch.

use std::collections::HashMap;

use parking_lot::Mutex;

#[derive(Default)]
pub struct TouchTracker {
    pending: Mutex<HashMap<u64, u64>>,
}

impl TouchTracker {
    pub fn record(&self, stream_id: u64, at_ms: u64) {
        let mut pending = self.pending.lock();
        let at = pending.entry(stream_id).or_default();
        *at = (*at).max(at_ms);
    }

    pub fn drain(&self) -> Vec<(u64, u64)> {
        let mut pending = self.pending.lock();
        if pending.is_empty() {
            return Vec::new();
        }
        let mut touches: Vec<(u64, u64)> = pending.drain().collect();
        touches.sort_unstable();
        touches
    }
}
