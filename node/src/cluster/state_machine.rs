//! A Raft group's state machine: the same `Machine` a single node runs, fed by committed log
//! entries instead of a local WAL. Applying publishes the effects to readers at once and hands
//! them to the applier, which writes them to the group's redb file off the request path.
//!
//! A snapshot is the group's redb file as one value, read in a consistent redb read
//! transaction taken when redb holds exactly the applied state, which is also made durable
//! then: openraft purges the log behind a snapshot, so the state it covers must survive a
//! crash without that log.

// openraft's `StorageError` is large, and its traits return it; boxing it here would only add
// conversions at every call.
#![allow(clippy::result_large_err)]

use std::io::Cursor;
use std::sync::Arc;
use std::sync::mpsc::{SyncSender, TrySendError};

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot};
use openraft::{EntryPayload, OptionalSend, RaftLogId};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::types::{
    ApplyReply, Entry, LogId, SnapshotMeta, StorageError, StoredMembership, TypeConfig, fail,
};
use crate::engine::{AppliedBatch, Metrics, Registry, ReplicaParts};
use crate::machine::{Limits, Machine};
use crate::storage::{GroupDump, Store};

/// The Raft position stored with the state in redb.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Position {
    applied: Option<LogId>,
    membership: StoredMembership,
}

impl Position {
    fn encode(&self) -> Result<Vec<u8>, StorageError> {
        postcard::to_allocvec(self).map_err(fail::write_state)
    }
}

type CurrentSnapshot = Arc<Mutex<Option<(SnapshotMeta, Arc<Vec<u8>>)>>>;

pub struct GroupStateMachine {
    group: u32,
    machine: Machine,
    store: Arc<Store>,
    registry: Arc<Registry>,
    applier: SyncSender<AppliedBatch>,
    limits: Limits,
    metrics: Arc<Metrics>,
    position: Position,
    /// The last snapshot built or installed, to send to followers that need one.
    current: CurrentSnapshot,
}

impl GroupStateMachine {
    pub fn new(group: u32, parts: ReplicaParts) -> Result<Self, String> {
        let position = match parts.store.raft_state().map_err(|e| e.to_string())? {
            Some(bytes) => postcard::from_bytes(&bytes)
                .map_err(|e| format!("group {group}: stored Raft position: {e}"))?,
            None => Position::default(),
        };
        Ok(Self {
            group,
            machine: parts.machine,
            store: parts.store,
            registry: parts.registry,
            applier: parts.applier,
            limits: parts.limits,
            metrics: parts.metrics,
            position,
            current: Arc::default(),
        })
    }

    async fn hand_to_applier(&self, batch: AppliedBatch) -> Result<(), StorageError> {
        match self.applier.try_send(batch) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(batch)) => {
                // The applier is behind: wait for room without holding a runtime thread.
                let applier = self.applier.clone();
                tokio::task::spawn_blocking(move || applier.send(batch))
                    .await
                    .map_err(fail::write_state)?
                    .map_err(|_| fail::write_state("the applier stopped"))
            }
            Err(TrySendError::Disconnected(_)) => Err(fail::write_state("the applier stopped")),
        }
    }

    /// Waits until redb holds everything applied so far.
    async fn settle(&self) {
        let applied = self.position.applied.map_or(0, |id| id.index);
        self.registry.wait_stored(applied).await;
    }
}

impl RaftStateMachine<TypeConfig> for GroupStateMachine {
    type SnapshotBuilder = GroupSnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.position.applied, self.position.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyReply>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        let mut effects = Vec::new();
        let mut commands = 0;
        let mut last = None;
        for entry in entries {
            last = Some(*entry.get_log_id());
            match entry.payload {
                EntryPayload::Blank => replies.push(ApplyReply(None)),
                EntryPayload::Normal(batch) => {
                    commands += batch.0.len() as u64;
                    let results = batch
                        .0
                        .into_iter()
                        .map(|command| self.machine.apply_in_batch(command, &mut effects))
                        .collect();
                    replies.push(ApplyReply(Some(results)));
                }
                EntryPayload::Membership(membership) => {
                    self.position.membership = StoredMembership::new(last, membership);
                    replies.push(ApplyReply(None));
                }
            }
        }
        self.machine.finish_batch(&mut effects);
        self.metrics.count(commands, &effects);
        let Some(last) = last else {
            return Ok(replies);
        };
        self.position.applied = Some(last);
        self.registry.publish(&effects, last.index);
        let batch = AppliedBatch {
            seq: last.index,
            effects,
            raft: Some(self.position.encode()?),
        };
        self.hand_to_applier(batch).await?;
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        // Nothing is applied while this runs, so redb settles at exactly the applied state.
        self.settle().await;
        let applied = self.position.applied.map_or(0, |id| id.index);
        let start = self.position.encode().and_then(|position| {
            self.store
                .commit(&[], applied, true, Some(&position))
                .map_err(fail::write_snapshot)?;
            self.store.begin_read().map_err(fail::write_snapshot)
        });
        GroupSnapshotBuilder {
            group: self.group,
            meta: SnapshotMeta {
                last_log_id: self.position.applied,
                last_membership: self.position.membership.clone(),
                snapshot_id: format!(
                    "{}-{}-{}",
                    self.group,
                    self.position.applied.map_or(0, |id| id.leader_id.term),
                    applied
                ),
            },
            start: Some(start),
            current: self.current.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        // Whatever the applier still holds is older than the snapshot and must land first.
        self.settle().await;
        let data = snapshot.into_inner();
        let position = Position {
            applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        let encoded = position.encode()?;
        let store = self.store.clone();
        let limits = self.limits;
        let bytes = Arc::new(data);
        let input = bytes.clone();
        let (machine, cold) = tokio::task::spawn_blocking(move || {
            let dump = GroupDump::decode(&input)?;
            store.replace_with(&dump, &encoded)?;
            let (machine, _) = store.load(limits)?;
            Ok::<_, crate::storage::StorageError>((machine, store.cold_segments()?))
        })
        .await
        .map_err(fail::write_snapshot)?
        .map_err(fail::write_snapshot)?;
        let index = meta.last_log_id.map_or(0, |id| id.index);
        self.registry
            .set_stored(index.max(self.registry.stored_seq()), &[]);
        self.registry.reset(&machine, cold);
        self.machine = machine;
        self.position = position;
        *self.current.lock() = Some((meta.clone(), bytes));
        tracing::info!(group = self.group, index, "installed a snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self.current.lock().clone().map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data.to_vec())),
        }))
    }
}

pub struct GroupSnapshotBuilder {
    group: u32,
    meta: SnapshotMeta,
    start: Option<Result<redb::ReadTransaction, StorageError>>,
    current: CurrentSnapshot,
}

impl RaftSnapshotBuilder<TypeConfig> for GroupSnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let txn = self
            .start
            .take()
            .unwrap_or_else(|| Err(fail::write_snapshot("the snapshot was already built")))?;
        let data = tokio::task::spawn_blocking(move || Store::dump(&txn)?.encode())
            .await
            .map_err(fail::write_snapshot)?
            .map_err(fail::write_snapshot)?;
        tracing::debug!(group = self.group, bytes = data.len(), "built a snapshot");
        let data = Arc::new(data);
        *self.current.lock() = Some((self.meta.clone(), data.clone()));
        Ok(Snapshot {
            meta: self.meta.clone(),
            snapshot: Box::new(Cursor::new(data.to_vec())),
        })
    }
}
