//! Linearizable reads at the cost of one quorum round trip per batch of reads, not per read.
//!
//! A node that believes it leads may not: a leader cut off from its peers does not step down
//! by itself, and a voter restarted with its own committed vote reports itself leader before
//! any election. Only a quorum's answer (openraft's read index) proves it, and then the state
//! machine must have applied up to that index. Every read waits for a confirmation that
//! *began after it arrived*; one confirmation in flight serves every read that arrived before
//! it began, and reads that arrive meanwhile share the next one.

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Default)]
struct State {
    /// Reads that have arrived, ever.
    arrived: u64,
    /// The `arrived` count as of the start of the latest confirmation that succeeded.
    confirmed: u64,
    /// Whether a confirmation is in flight.
    driving: bool,
}

#[derive(Default)]
pub struct ReadBarrier {
    state: Mutex<State>,
    /// Told when a confirmation ends, however it ended.
    ended: Notify,
}

impl ReadBarrier {
    /// Whether a confirmation that began after this call succeeded. `confirm` asks the quorum
    /// (and waits for the state machine); after a failed one, the next reader tries again, so
    /// the caller bounds the wait.
    pub async fn pass<'a>(&self, confirm: impl Fn() -> BoxFuture<'a, bool>) -> bool {
        let me = {
            let mut state = self.state.lock();
            state.arrived += 1;
            state.arrived
        };
        loop {
            // Registered before the state is read, so that an end in between is not missed.
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let covers = {
                let mut state = self.state.lock();
                if state.confirmed >= me {
                    return true;
                }
                if state.driving {
                    None
                } else {
                    state.driving = true;
                    Some(state.arrived)
                }
            };
            let Some(covers) = covers else {
                ended.await;
                continue;
            };
            let confirmed = confirm().await;
            {
                let mut state = self.state.lock();
                state.driving = false;
                if confirmed {
                    state.confirmed = state.confirmed.max(covers);
                }
            }
            self.ended.notify_waiters();
            if !confirmed {
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn concurrent_reads_share_confirmations_that_began_after_them() {
        let barrier = Arc::new(ReadBarrier::default());
        let confirmations = Arc::new(AtomicUsize::new(0));
        let reads: Vec<_> = (0..50)
            .map(|_| {
                let barrier = barrier.clone();
                let confirmations = confirmations.clone();
                tokio::spawn(async move {
                    barrier
                        .pass(|| {
                            let confirmations = confirmations.clone();
                            Box::pin(async move {
                                confirmations.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                true
                            })
                        })
                        .await
                })
            })
            .collect();
        for read in reads {
            assert!(read.await.unwrap());
        }
        let used = confirmations.load(Ordering::SeqCst);
        assert!((1..=3).contains(&used), "{used} confirmations for 50 reads");

        // A read that arrives after a confirmation began waits for the next one.
        let confirmations_before = confirmations.load(Ordering::SeqCst);
        assert!(barrier.pass(|| Box::pin(async { true })).await);
        assert!(barrier.pass(|| Box::pin(async { true })).await);
        assert_eq!(confirmations.load(Ordering::SeqCst), confirmations_before);
    }

    #[tokio::test]
    async fn a_failed_confirmation_lets_no_read_through() {
        let barrier = ReadBarrier::default();
        assert!(!barrier.pass(|| Box::pin(async { false })).await);
        // Nothing confirmed before counts for a later read.
        assert!(barrier.pass(|| Box::pin(async { true })).await);
        assert!(!barrier.pass(|| Box::pin(async { false })).await);
    }
}
