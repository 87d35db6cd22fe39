//! An orderly stop of a voter's replication, after its clients are done: the cluster listener
//! and every peer connection first (so that no peer's call reaches a group that is stopping),
//! then this node's own calls into its groups (`RaftCalls`), then the log writer's last
//! record, then each group's Raft. In any other order openraft reports a stopped core as an
//! error: an append a peer sent meanwhile, a proposal of this node's own still waiting for its
//! entry to commit, or a write that became durable after its group stopped.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::log_store::LogDb;
use super::types::Raft;

pub struct Replication {
    pub listener: tokio::task::JoinHandle<()>,
    pub rafts: Arc<Vec<Option<Raft>>>,
    pub calls: RaftCalls,
    pub log: Arc<LogDb>,
}

/// How long the log writer may take to finish the records it was given.
const LOG_SETTLE: Duration = Duration::from_secs(2);
/// How long this node's own calls into its groups may take to notice the stop.
const CALLS_END: Duration = Duration::from_secs(1);

impl Replication {
    /// Called once the node's `stopping` signal is sent: the listener ends on it.
    pub async fn stop(self) {
        let _ = self.listener.await;
        self.calls.end(CALLS_END).await;
        self.log.settled(LOG_SETTLE).await;
        for raft in self.rafts.iter().flatten() {
            if let Err(error) = raft.shutdown().await {
                tracing::warn!(%error, "a Raft group did not stop cleanly");
            }
        }
    }
}

/// This node's own calls that wait for an answer from one of its Raft groups (a proposal, a
/// read index, a membership change, a heartbeat), so that an orderly stop can end them first:
/// openraft logs an error for every call still waiting when its group stops. A proposal that
/// ends so may still apply (its entry may be in the log already); its caller hears `Stopped`,
/// which never says otherwise.
#[derive(Clone, Default)]
pub struct RaftCalls {
    stopping: Arc<watch::Sender<bool>>,
}

impl RaftCalls {
    /// `call`'s answer, or `None` once replication stops (before `call` or while it waits).
    pub async fn run<T>(&self, call: impl Future<Output = T>) -> Option<T> {
        // Held while the call waits: `end` counts them.
        let mut stopping = self.stopping.subscribe();
        if *stopping.borrow_and_update() {
            return None;
        }
        tokio::select! {
            biased;
            _ = stopping.wait_for(|stopping| *stopping) => None,
            answer = call => Some(answer),
        }
    }

    /// Ends every call in flight and refuses later ones; returns once none waits any more,
    /// or after `patience`.
    pub async fn end(&self, patience: Duration) {
        self.stopping.send_replace(true);
        let deadline = Instant::now() + patience;
        while self.stopping.receiver_count() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
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
