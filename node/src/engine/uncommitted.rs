//! The count of a group's body bytes proposed and not yet applied
//! (`raft.max_uncommitted_size_per_group`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::EngineError;

/// Releases a body's bytes from the group's proposed-but-unapplied count. It travels with its
/// proposal, so the bytes count until the proposal is answered or dropped unsent, however
/// long its caller waits.
pub struct UncommittedGuard {
    counter: Arc<AtomicU64>,
    bytes: u64,
}

impl UncommittedGuard {
    /// Counts `bytes` in `counter` until the guard drops, or refuses them (before anything is
    /// proposed) when the group already has too much proposed and not yet applied.
    pub(super) fn hold(
        counter: &Arc<AtomicU64>,
        bytes: u64,
        limit: u64,
    ) -> Result<Option<Self>, EngineError> {
        if bytes == 0 {
            return Ok(None);
        }
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now.saturating_add(bytes) <= limit).then_some(now + bytes)
            })
            .map(|_| {
                Some(Self {
                    counter: counter.clone(),
                    bytes,
                })
            })
            .map_err(|proposed| EngineError::UncommittedBackpressure { proposed, limit })
    }
}

impl Drop for UncommittedGuard {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}
