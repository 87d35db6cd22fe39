//! The engine's part of the cold tier: the hot cap (`ColdBackpressure`), reads of cold
//! segments, and the leader's flush and sweep loop.
//!
//! Only a group's leader flushes. It reads a stream's oldest local records (committed: readers
//! only ever see those), writes them to one object, and proposes `Command::ColdFlush`; the
//! state machine accepts it only if the range still starts at the stream's first local offset,
//! so a repeated or stale flush changes nothing. The sweep is the only code that deletes
//! objects, and only those no segment of the group refers to.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Engine, EngineError, Leadership, StreamHandle, now_ms};
use crate::cold::ColdStore;
use crate::machine::{ColdFlush, Command, Outcome, Payload, StagedBody};
use crate::storage::{ColdSegment, Record};

/// At most this many flushes per look, so that a large backlog does not delay the sweep or
/// a step-down for long.
const FLUSHES_PER_LOOK: usize = 64;

pub(super) struct ColdTier {
    store: Arc<ColdStore>,
    group: u32,
    /// Bodies of at least this many bytes are staged (`runtime.external_payload_min_size`).
    staging_min: Option<u64>,
    /// The group's record bytes on local disk as of the last look, plus bodies proposed since.
    local_bytes: AtomicU64,
}

/// A stream with records on local disk, as a look found it.
struct Candidate {
    handle: Arc<StreamHandle>,
    local_bytes: u64,
}

impl Engine {
    /// Gives this engine (the replica of `group`) a cold tier, which stages bodies of at least
    /// `staging_min` bytes. Flushing starts with `run_cold_tier`.
    pub fn attach_cold(&self, store: Arc<ColdStore>, group: u32, staging_min: Option<u64>) {
        let _ = self.cold.set(ColdTier {
            store,
            group,
            staging_min,
            local_bytes: AtomicU64::new(0),
        });
    }

    /// Whether a create or append body of `len` bytes is staged in object storage: from
    /// `runtime.external_payload_min_size` on, and every body when the hot cap is 0.
    pub fn stages(&self, len: u64) -> bool {
        self.cold.get().is_some_and(|cold| {
            cold.store.config.max_hot_size_per_group == 0
                || cold.staging_min.is_some_and(|min| len >= min)
        })
    }

    /// Writes a body to an object of its own; the payload that is proposed names it. Nothing
    /// is proposed yet: an object whose write never commits is left to the sweep.
    pub async fn stage(&self, payload: Payload) -> Result<Payload, EngineError> {
        let Some(cold) = self.cold.get() else {
            return Ok(payload);
        };
        let key = cold.store.staged_key(cold.group);
        let len = payload.bytes.len() as u64;
        cold.store
            .put_segment(&key, 0, &[(0, payload.bytes)])
            .await
            .map_err(|e| EngineError::Staging(e.to_string()))?;
        self.metrics.staged_bodies.fetch_add(1, Ordering::Relaxed);
        Ok(Payload {
            bytes: bytes::Bytes::new(),
            messages: payload.messages,
            staged: Some(StagedBody { key, len }),
        })
    }

    /// Deletes a staged body after a refusal that proves its write was never proposed.
    pub fn discard_staged(&self, key: String) {
        if let Some(cold) = self.cold.get() {
            let store = cold.store.clone();
            tokio::spawn(async move {
                if let Err(error) = store.delete(&key).await {
                    tracing::debug!(%error, key, "cannot delete a staged body; the sweep will");
                }
            });
        }
    }

    /// Counts a body against the hot cap, or refuses it before anything is proposed.
    pub(super) fn make_local_room(&self, bytes: u64) -> Result<(), EngineError> {
        let Some(cold) = self.cold.get() else {
            return Ok(());
        };
        if bytes == 0 {
            return Ok(());
        }
        let limit = cold.store.config.max_hot_size_per_group;
        cold.local_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now.saturating_add(bytes) <= limit).then_some(now + bytes)
            })
            .map(|_| ())
            .map_err(|local| EngineError::ColdBackpressure { local, limit })
    }

    /// The group's record bytes on local disk, as this node last counted them as its leader
    /// (`None` without a cold tier).
    pub fn local_record_bytes(&self) -> Option<u64> {
        let cold = self.cold.get()?;
        (self.leadership() == Leadership::Here).then(|| cold.local_bytes.load(Ordering::Acquire))
    }

    /// The records of a cold segment.
    pub(super) async fn cold_records(
        &self,
        segment: &ColdSegment,
    ) -> Result<Arc<Vec<Record>>, super::ReadError> {
        let Some(cold) = self.cold.get() else {
            // Segments exist only where a cold tier wrote them; a node started without one
            // cannot read them.
            return Err(super::ReadError::Storage(
                crate::storage::StorageError::Corrupt(format!(
                    "records from offset {} are in cold object {}, and this node has no storage.cold",
                    segment.first, segment.key
                )),
            ));
        };
        let (records, fetched) = cold.store.segment(&segment.key, segment.first).await?;
        if fetched {
            self.metrics.cold_fetches.fetch_add(1, Ordering::Relaxed);
        }
        Ok(records)
    }

    /// The leader's loop: flush every `flush_interval`, sweep every `sweep_interval`. It ends
    /// when the engine stops.
    pub async fn run_cold_tier(self: Arc<Self>) {
        let Some(cold) = self.cold.get() else {
            return;
        };
        let config = cold.store.config.clone();
        let mut tick = tokio::time::interval(config.flush_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sweep = Instant::now();
        loop {
            tick.tick().await;
            // A new leader that has not applied its log may not know of every segment yet, and
            // would upload records that are already cold (its flush would be trimmed or
            // refused by the state machine; this saves the upload).
            if self.leadership() != Leadership::Here || !self.applied_its_log() {
                // (A new leader applies its first entry within a round trip.)
                continue;
            }
            let candidates = self.look();
            match self.flush(cold, candidates).await {
                Ok(()) => {}
                Err(EngineError::Stopped) => return,
                Err(error) => tracing::warn!(group = cold.group, %error, "cold flush failed"),
            }
            // A leader cut off from its voters may not know it yet; one that swept on would
            // delete what a new leader flushed.
            if last_sweep.elapsed() >= config.sweep_interval && self.confirm_leadership().await {
                last_sweep = Instant::now();
                if let Err(error) = self.sweep(cold, config.sweep_grace).await {
                    tracing::warn!(group = cold.group, %error, "cold sweep failed");
                }
            }
        }
    }

    /// Every stream with records on local disk, most first; sets the group's local bytes.
    fn look(&self) -> Vec<Candidate> {
        let mut candidates: Vec<Candidate> = self
            .registry
            .handles()
            .into_iter()
            .filter_map(|handle| {
                let (_, _, local_bytes) = handle.local_records(&handle.meta());
                (local_bytes > 0).then_some(Candidate {
                    handle,
                    local_bytes,
                })
            })
            .collect();
        let total = candidates.iter().map(|c| c.local_bytes).sum();
        if let Some(cold) = self.cold.get() {
            cold.local_bytes.store(total, Ordering::Release);
        }
        candidates.sort_by_key(|c| std::cmp::Reverse(c.local_bytes));
        candidates
    }

    /// Flushes every full segment on local disk, and, while the group is past half its hot
    /// cap, the streams with the most, so that writes rarely meet the cap. A stream written
    /// faster than one segment per look gets as many as it has.
    async fn flush(&self, cold: &ColdTier, candidates: Vec<Candidate>) -> Result<(), EngineError> {
        let config = &cold.store.config;
        let total: u64 = candidates.iter().map(|c| c.local_bytes).sum();
        let mut excess = total.saturating_sub(config.max_hot_size_per_group / 2);
        let mut flushes = 0;
        for candidate in candidates {
            let mut local_bytes = candidate.local_bytes;
            loop {
                let full = local_bytes >= config.segment_size;
                if (!full && excess == 0) || flushes == FLUSHES_PER_LOOK {
                    break;
                }
                flushes += 1;
                let flushed = self.flush_stream(cold, &candidate.handle).await?;
                if flushed == 0 {
                    break;
                }
                excess = excess.saturating_sub(flushed);
                local_bytes = local_bytes.saturating_sub(flushed);
            }
        }
        Ok(())
    }

    /// Writes the stream's oldest local records (up to a segment's size, and never past the
    /// next cold segment) to an object and proposes the flush. Returns the bytes that left
    /// local disk.
    async fn flush_stream(
        &self,
        cold: &ColdTier,
        handle: &StreamHandle,
    ) -> Result<u64, EngineError> {
        let meta = handle.meta();
        let (local_from, local_until, _) = handle.local_records(&meta);
        let budget = cold.store.config.segment_size as usize;
        let records = self
            .read_local(Some(handle), &meta, local_from, local_until, budget)
            .map_err(|e| EngineError::Storage(e.to_string()))?;
        let (Some(first), Some(last)) = (records.first(), records.last()) else {
            return Ok(0);
        };
        let first = first.0;
        let until = last.0 + last.1.len() as u64;
        let contiguous = records
            .windows(2)
            .all(|pair| pair[0].0 + pair[0].1.len() as u64 == pair[1].0);
        if !contiguous || first > local_from || until <= local_from || until > local_until {
            tracing::error!(
                stream = meta.id,
                first,
                until,
                local_from,
                local_until,
                "local records do not cover the range to flush; not flushed"
            );
            return Ok(0);
        }
        let key = cold.store.segment_key(cold.group, meta.id, first, until);
        cold.store
            .put_segment(&key, first, &records)
            .await
            .map_err(|e| EngineError::Storage(e.to_string()))?;
        let outcome = self
            .propose(Command::ColdFlush(ColdFlush {
                stream_id: meta.id,
                first,
                until,
                key,
            }))
            .await?;
        let accepted = matches!(outcome, Outcome::ColdFlushed { accepted: true });
        if !accepted {
            return Ok(0);
        }
        self.metrics.cold_flushes.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .cold_flushed_bytes
            .fetch_add(until - local_from, Ordering::Relaxed);
        Ok(until - local_from)
    }

    /// Deletes the group's objects that no segment refers to and that are older than
    /// `grace`: what deletes, purges, retention and flushes that never committed left behind.
    /// Runs right after `confirm_leadership`, so the segments it keeps are every committed one
    /// (a flush committed later uploaded its object less than `grace` ago).
    async fn sweep(&self, cold: &ColdTier, grace: Duration) -> Result<(), crate::cold::ColdError> {
        let listed = cold.store.list(cold.group).await?;
        let referenced: HashSet<Arc<str>> = self
            .registry
            .handles()
            .iter()
            .flat_map(|handle| handle.cold_keys())
            .collect();
        let older_than = now_ms() as i64 - grace.as_millis() as i64;
        for object in listed {
            if object.modified_ms < older_than && !referenced.contains(object.key.as_str()) {
                cold.store.delete(&object.key).await?;
                self.metrics.cold_swept.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}
