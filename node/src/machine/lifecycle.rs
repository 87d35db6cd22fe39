//! Deletes, expiry, TTL resets, snapshots, retention and bucket purges.

use super::stream::SnapshotInfo;
use super::{BucketState, Effect, Machine, Outcome, PublishSnapshot, Refusal, StreamPath};

impl Machine {
    pub(super) fn delete(&mut self, path: &StreamPath, now_ms: u64) -> Result<Outcome, Refusal> {
        let id = self.live_stream(path, now_ms)?;
        self.retire(id);
        Ok(Outcome::Deleted)
    }

    /// Resets sliding TTLs to the times reads saw the streams alive.
    pub(super) fn touch(&mut self, touches: &[(u64, u64)]) -> Outcome {
        for &(id, at_ms) in touches {
            self.touch_stream(id, at_ms);
        }
        Outcome::Touched
    }

    pub(super) fn touch_stream(&mut self, id: u64, at_ms: u64) {
        let Some(state) = self.streams.get_mut(&id) else {
            return;
        };
        // Only a sliding TTL depends on the last access, and every change of state must show
        // in the effects (the WAL skips batches without effects).
        if state.meta.soft_deleted
            || state.meta.ttl_secs.is_none()
            || at_ms <= state.meta.last_access_ms
        {
            return;
        }
        state.meta.last_access_ms = at_ms;
        self.emit_meta(id);
    }

    pub(super) fn expire_due(&mut self, now_ms: u64) -> Outcome {
        let candidates: Vec<u64> = self.expiring.iter().copied().collect();
        let mut streams = 0;
        for id in candidates {
            if self.expire_if_due(id, now_ms) {
                streams += 1;
            }
        }
        Outcome::Expired { streams }
    }

    /// Expires the stream if its TTL or expiry time has passed. Returns whether it did.
    pub(super) fn expire_if_due(&mut self, id: u64, now_ms: u64) -> bool {
        let Some(state) = self.streams.get(&id) else {
            return false;
        };
        let meta = &state.meta;
        if meta.soft_deleted || !meta.is_expired(now_ms, meta.last_access_ms) {
            return false;
        }
        self.retire(id);
        true
    }

    /// Deletes a stream, or soft-deletes it while forks still read through it.
    fn retire(&mut self, id: u64) {
        let Some(state) = self.streams.get_mut(&id) else {
            return;
        };
        let path = state.meta.path.clone();
        self.subscriptions_see_removal(&path);
        let Some(state) = self.streams.get_mut(&id) else {
            return;
        };
        if state.meta.fork_children > 0 {
            state.meta.soft_deleted = true;
            self.expiring.remove(&id);
            self.emit_meta(id);
        } else {
            self.remove_stream(id);
        }
    }

    /// Removes a stream for good, then any soft-deleted ancestor it was the last fork of.
    fn remove_stream(&mut self, id: u64) {
        let mut next = Some(id);
        while let Some(id) = next.take() {
            let Some(state) = self.streams.remove(&id) else {
                return;
            };
            self.expiring.remove(&id);
            if self.by_path.get(&state.meta.path) == Some(&id) {
                self.by_path.remove(&state.meta.path);
            }
            self.emit(Effect::DeleteStream {
                id,
                path: state.meta.path.clone(),
            });
            let Some(origin) = state.meta.fork else {
                return;
            };
            let Some(parent) = self.streams.get_mut(&origin.source_id) else {
                return;
            };
            parent.meta.fork_children = parent.meta.fork_children.saturating_sub(1);
            if parent.meta.soft_deleted && parent.meta.fork_children == 0 {
                next = Some(origin.source_id);
            } else {
                self.emit_meta(origin.source_id);
            }
        }
    }

    pub(super) fn publish_snapshot(&mut self, cmd: PublishSnapshot) -> Result<Outcome, Refusal> {
        let id = self.live_stream(&cmd.path, cmd.now_ms)?;
        let meta = &self.streams[&id].meta;
        check_offset(meta.tail, meta.retained_from, cmd.offset)?;
        if let Some(existing) = meta.snapshots.get(&cmd.offset) {
            if existing.digest == cmd.digest && existing.content_type == cmd.content_type {
                return Ok(Outcome::SnapshotPublished { created: false });
            }
            return Err(Refusal::SnapshotConflict { offset: cmd.offset });
        }
        let info = SnapshotInfo {
            content_type: cmd.content_type.clone(),
            len: cmd.body.len() as u64,
            digest: cmd.digest,
        };
        if let Some(state) = self.streams.get_mut(&id) {
            state.meta.snapshots.insert(cmd.offset, info);
        }
        self.emit(Effect::PutSnapshot {
            stream_id: id,
            offset: cmd.offset,
            content_type: cmd.content_type,
            body: cmd.body,
        });
        self.emit_meta(id);
        Ok(Outcome::SnapshotPublished { created: true })
    }

    /// Moves the first retained offset forward. Moving it to where it is, or back, changes
    /// nothing and succeeds, so a retry of an advance whose answer was lost is harmless.
    pub(super) fn advance_retention(
        &mut self,
        path: &StreamPath,
        offset: u64,
        now_ms: u64,
    ) -> Result<Outcome, Refusal> {
        let id = self.live_stream(path, now_ms)?;
        let Some(state) = self.streams.get_mut(&id) else {
            return Err(Refusal::StreamNotFound(path.to_string()));
        };
        let meta = &mut state.meta;
        if offset > meta.tail {
            return Err(Refusal::OffsetBeyondTail {
                offset,
                tail: meta.tail,
            });
        }
        if offset <= meta.retained_from {
            return Ok(Outcome::RetentionAdvanced {
                retained_from: meta.retained_from,
            });
        }
        meta.retained_from = offset;
        state.cold.retain(|_, until| *until > offset);
        let meta = &mut state.meta;
        let dropped: Vec<u64> = meta.snapshots.range(..offset).map(|(at, _)| *at).collect();
        for at in &dropped {
            meta.snapshots.remove(at);
        }
        self.emit(Effect::DeleteRecordsBelow {
            stream_id: id,
            offset,
        });
        for at in dropped {
            self.emit(Effect::DeleteSnapshot {
                stream_id: id,
                offset: at,
            });
        }
        self.emit_meta(id);
        Ok(Outcome::RetentionAdvanced {
            retained_from: offset,
        })
    }

    /// Deletes every stream of the bucket and fences the bucket ID. Purging again succeeds.
    pub(super) fn purge_bucket(&mut self, bucket: String) -> Outcome {
        let doomed: Vec<u64> = self
            .streams
            .values()
            .filter(|state| state.meta.path.bucket == bucket && !state.meta.soft_deleted)
            .map(|state| state.meta.id)
            .collect();
        let streams = doomed.len();
        for id in doomed {
            self.retire(id);
        }
        self.purge_subscriptions(&bucket);
        if self.buckets.get(&bucket) != Some(&BucketState::Fenced) {
            self.buckets.insert(bucket.clone(), BucketState::Fenced);
            self.emit(Effect::PutBucket {
                bucket,
                state: BucketState::Fenced,
            });
        }
        Outcome::BucketPurged { streams }
    }
}

fn check_offset(tail: u64, retained_from: u64, offset: u64) -> Result<(), Refusal> {
    if offset > tail {
        return Err(Refusal::OffsetBeyondTail { offset, tail });
    }
    if offset < retained_from {
        return Err(Refusal::OffsetNotRetained {
            offset,
            retained_from,
        });
    }
    Ok(())
}
