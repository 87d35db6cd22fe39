//! An orderly stop of a voter's replication, after its clients are done: the cluster listener
//! and every peer connection first (so that no peer's call reaches a group that is stopping),
//! then the log writer's last record, then each group's Raft. In any other order openraft
//! reports a stopped core as an error: an append a peer sent meanwhile, or a write that became
//! durable after its group stopped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::log_store::LogDb;
use super::types::Raft;

pub struct Replication {
    pub listener: tokio::task::JoinHandle<()>,
    pub rafts: Arc<Vec<Option<Raft>>>,
    pub log: Arc<LogDb>,
}

/// How long the log writer may take to finish the records it was given.
const LOG_SETTLE: Duration = Duration::from_secs(2);

impl Replication {
    /// Called once the node's `stopping` signal is sent: the listener ends on it.
    pub async fn stop(self) {
        let _ = self.listener.await;
        self.log.settled(LOG_SETTLE).await;
        for raft in self.rafts.iter().flatten() {
            if let Err(error) = raft.shutdown().await {
                tracing::warn!(%error, "a Raft group did not stop cleanly");
            }
        }
    }
}

impl LogDb {
    /// Waits until the writer has written everything it was given and waits for more (its
    /// turn even twice, 10 ms apart), for at most `patience`.
    pub async fn settled(&self, patience: Duration) {
        let deadline = Instant::now() + patience;
        let mut turns = self.writer_turns();
        let mut quiet = 0;
        while quiet < 2 && Instant::now() < deadline {
            let turn = *turns.borrow_and_update();
            tokio::time::sleep(Duration::from_millis(10)).await;
            let idle = turn.is_multiple_of(2) && *turns.borrow() == turn && self.outbox_empty();
            quiet = if idle { quiet + 1 } else { 0 };
        }
    }
}
