//! The engines of the Raft groups this node hosts, and which one serves a bucket. A single
//! node has one engine and no cluster.

use std::sync::Arc;

use crate::cluster::ClusterView;
use crate::engine::Engine;
use ursula_wire::placement::group_of;

/// A replica this many entries behind its log is not ready.
const READY_APPLY_LAG: u64 = 1024;

pub struct Groups {
    /// By group; `None` for a group this node does not host.
    engines: Vec<Option<Arc<Engine>>>,
    pub cluster: Option<Arc<ClusterView>>,
}

/// A bucket whose group this node does not host, and the voters that do.
#[derive(Debug)]
pub struct NotHosted {
    pub group: usize,
    pub voters: Vec<u64>,
}

impl Groups {
    pub fn single(engine: Arc<Engine>) -> Self {
        Self {
            engines: vec![Some(engine)],
            cluster: None,
        }
    }

    pub fn replicated(engines: Vec<Option<Arc<Engine>>>, cluster: Arc<ClusterView>) -> Self {
        Self {
            engines,
            cluster: Some(cluster),
        }
    }

    /// The engine of the group that holds `bucket`'s streams, if this node hosts it.
    pub fn for_bucket(&self, bucket: &str) -> Result<&Arc<Engine>, NotHosted> {
        let group = group_of(bucket, self.engines.len());
        match &self.engines[group] {
            Some(engine) => Ok(engine),
            None => Err(NotHosted {
                group,
                voters: self
                    .cluster
                    .as_ref()
                    .map(|view| view.voters_of(group))
                    .unwrap_or_default(),
            }),
        }
    }

    pub fn group_count(&self) -> usize {
        self.engines.len()
    }

    /// The groups this node hosts, with their group numbers.
    pub fn hosted(&self) -> impl Iterator<Item = (usize, &Arc<Engine>)> {
        self.engines
            .iter()
            .enumerate()
            .filter_map(|(group, engine)| engine.as_ref().map(|e| (group, e)))
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<Engine>> {
        self.hosted().map(|(_, engine)| engine)
    }

    /// Groups whose leader is this node.
    pub fn led_here(&self) -> usize {
        self.all()
            .filter_map(|engine| engine.group_status())
            .filter(|status| status.leads())
            .count()
    }

    /// Hands every group's leadership away (see `Engine::set_draining`) and waits, up to
    /// `wait`, until this node leads none. Returns how many it still leads.
    pub async fn drain(&self, wait: std::time::Duration) -> usize {
        for engine in self.all() {
            engine.set_draining(true);
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let led = self.led_here();
            if led == 0 || tokio::time::Instant::now() >= deadline {
                return led;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    pub fn undrain(&self) {
        for engine in self.all() {
            engine.set_draining(false);
        }
    }

    /// Ready: every group knows a leader and has applied what it received (a single node
    /// always is).
    pub fn caught_up(&self) -> Result<(), String> {
        for (group, engine) in self.hosted() {
            let Some(status) = engine.group_status() else {
                continue;
            };
            if status.leader.is_none() {
                return Err(format!("group {group} knows no leader"));
            }
            let (last, applied) = (status.last_log_index, status.applied_index);
            if last.saturating_sub(applied) > READY_APPLY_LAG {
                return Err(format!(
                    "group {group} has {} entries to apply",
                    last - applied
                ));
            }
        }
        Ok(())
    }
}
