//! A queue that sends what arrives together: at most `in_flight` batches are being handled at
//! once, and whatever arrives meanwhile waits and goes as the next batch. With nothing in
//! flight an item goes at once, alone. The proposal batcher (a group's log entries) and the
//! peer links (Raft RPCs to a peer) are both this.

use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, watch};

/// What a queued item tells the queue.
pub trait Item: Send + 'static {
    /// Bytes it adds to a batch, for the batch's byte limit.
    fn size(&self) -> u64;
    /// Whether nobody waits for it any more, so it need not be sent.
    fn abandoned(&self) -> bool {
        false
    }
}

pub struct Coalescer<T> {
    queue: Mutex<Vec<T>>,
    wake: Notify,
    max_items: usize,
    max_bytes: u64,
}

impl<T: Item> Coalescer<T> {
    /// Starts the queue's task: `handle` gets each batch, with at most `in_flight` running.
    /// A batch holds at most `max_items` items and, beyond its first, `max_bytes`. With
    /// `turns`, a counter that is odd while some other worker's turn is on, a batch is taken
    /// only between turns, so that what arrives during a turn goes together in the next.
    pub fn start<F, Fut>(
        in_flight: usize,
        max_items: usize,
        max_bytes: u64,
        turns: Option<watch::Receiver<u64>>,
        handle: F,
    ) -> Arc<Self>
    where
        F: Fn(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let queue = Arc::new(Self {
            queue: Mutex::new(Vec::new()),
            wake: Notify::new(),
            max_items,
            max_bytes,
        });
        tokio::spawn(queue.clone().run(in_flight, turns, handle));
        queue
    }

    pub fn push(&self, item: T) {
        self.queue.lock().push(item);
        self.wake.notify_one();
    }

    /// The next batch: everything waiting and still wanted, up to the limits.
    fn take(&self) -> Vec<T> {
        let mut queue = self.queue.lock();
        queue.retain(|item| !item.abandoned());
        let mut bytes = 0;
        let mut count = 0;
        for item in queue.iter() {
            bytes += item.size();
            if count > 0 && (count == self.max_items || bytes > self.max_bytes) {
                break;
            }
            count += 1;
        }
        let rest = queue.split_off(count);
        std::mem::replace(&mut *queue, rest)
    }

    async fn run<F, Fut>(
        self: Arc<Self>,
        in_flight: usize,
        mut turns: Option<watch::Receiver<u64>>,
        handle: F,
    ) where
        F: Fn(Vec<T>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let slots = Arc::new(Semaphore::new(in_flight));
        loop {
            // A slot first: while every slot is busy, items gather in the queue.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let batch = loop {
                if !self.queue.lock().is_empty() {
                    if let Some(turns) = turns.as_mut() {
                        // Odd while a turn is on: wait for it to end (any change: the next one
                        // may have begun already). Items that arrive meanwhile join the batch.
                        // A counter whose owner is gone stops nothing.
                        let now = *turns.borrow();
                        if now % 2 == 1 {
                            let _ = turns.wait_for(|turn| *turn != now).await;
                        }
                    }
                    let batch = self.take();
                    if !batch.is_empty() {
                        break batch;
                    }
                }
                self.wake.notified().await;
            };
            if !self.queue.lock().is_empty() {
                self.wake.notify_one();
            }
            let handled = handle(batch);
            tokio::spawn(async move {
                handled.await;
                drop(slot);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    struct Sized(u64);
    impl Item for Sized {
        fn size(&self) -> u64 {
            self.0
        }
    }

    #[tokio::test]
    async fn what_arrives_during_a_turn_goes_together_when_it_ends() {
        let (batches, mut seen) = mpsc::unbounded_channel();
        let (turns, watched) = watch::channel(1u64);
        let queue = Coalescer::start(8, 100, 1000, Some(watched), move |batch: Vec<Sized>| {
            let sizes: Vec<u64> = batch.iter().map(|i| i.0).collect();
            let _ = batches.send(sizes);
            async {}
        });
        for size in [1, 2, 3] {
            queue.push(Sized(size));
            tokio::task::yield_now().await;
        }
        assert!(seen.try_recv().is_err(), "nothing goes during a turn");
        // The turn ends and the next begins at once: the waiting items go all the same.
        turns.send_modify(|turn| *turn += 2);
        assert_eq!(seen.recv().await, Some(vec![1, 2, 3]));
        turns.send_modify(|turn| *turn += 1);
        queue.push(Sized(4));
        assert_eq!(
            seen.recv().await,
            Some(vec![4]),
            "between turns an item goes at once"
        );
    }

    #[tokio::test]
    async fn what_arrives_during_a_batch_goes_together_within_the_limits() {
        let (batches, mut seen) = mpsc::unbounded_channel();
        let gate = Arc::new(Semaphore::new(0));
        let held = gate.clone();
        let queue = Coalescer::start(1, 3, 100, None, move |batch: Vec<Sized>| {
            let batches = batches.clone();
            let held = held.clone();
            async move {
                let sizes: Vec<u64> = batch.iter().map(|i| i.0).collect();
                let _ = batches.send(sizes);
                // Each batch stays in flight until the test lets it go.
                let _ = held.acquire().await.map(|p| p.forget());
            }
        });
        queue.push(Sized(1));
        assert_eq!(seen.recv().await, Some(vec![1]), "alone, at once");
        for size in [2, 3, 4, 5, 90, 20] {
            queue.push(Sized(size));
        }
        gate.add_permits(1);
        assert_eq!(seen.recv().await, Some(vec![2, 3, 4]), "at most 3 items");
        gate.add_permits(1);
        assert_eq!(seen.recv().await, Some(vec![5, 90]), "at most 100 bytes");
        gate.add_permits(1);
        assert_eq!(seen.recv().await, Some(vec![20]));
    }
}
