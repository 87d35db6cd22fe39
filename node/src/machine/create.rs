//! Stream creation: plain, closed, with an initial body, and forks.

use std::collections::{BTreeMap, HashMap};

use super::stream::{DEFAULT_CONTENT_TYPE, same_media_type};
use super::{
    CreateStream, Effect, ForkOrigin, ForkSpec, Machine, Outcome, Payload, Refusal, StreamMeta,
    StreamState,
};

/// What a fork takes from its source.
struct ForkPoint {
    origin: ForkOrigin,
    content_type: String,
    ttl_secs: Option<u64>,
    expires_at: Option<super::ExpiresAt>,
    partial: Option<Payload>,
}

impl Machine {
    pub(super) fn create(&mut self, cmd: CreateStream) -> Result<Outcome, Refusal> {
        self.check_not_fenced(&cmd.path.bucket)?;
        if let Ok(id) = self.existing_stream(&cmd.path, cmd.now_ms) {
            let meta = &self.streams[&id].meta;
            if meta.soft_deleted {
                return Err(Refusal::StreamConflict {
                    path: cmd.path.to_string(),
                    reason: "the stream was deleted and is kept for its forks".into(),
                });
            }
            self.check_same_config(meta, &cmd)?;
            return Ok(Outcome::StreamCreated {
                created: false,
                meta: Box::new(meta.clone()),
            });
        }

        let fork = match &cmd.fork {
            Some(spec) => Some(self.fork_point(spec, cmd.content_type.as_deref(), cmd.now_ms)?),
            None => None,
        };
        let own_expiry = cmd.ttl_secs.is_some() || cmd.expires_at.is_some();
        let (content_type, ttl_secs, expires_at, expiry_inherited) = match &fork {
            Some(point) if !own_expiry => (
                cmd.content_type
                    .clone()
                    .unwrap_or(point.content_type.clone()),
                point.ttl_secs,
                point.expires_at.clone(),
                point.ttl_secs.is_some() || point.expires_at.is_some(),
            ),
            Some(point) => (
                cmd.content_type
                    .clone()
                    .unwrap_or(point.content_type.clone()),
                cmd.ttl_secs,
                cmd.expires_at.clone(),
                false,
            ),
            None => (
                cmd.content_type
                    .clone()
                    .unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_owned()),
                cmd.ttl_secs,
                cmd.expires_at.clone(),
                false,
            ),
        };

        // Nothing refuses the create from here on: its bucket, if new, comes into being with it.
        let _ = self.create_bucket(cmd.path.bucket.clone());
        let id = self.next_stream_id;
        self.next_stream_id += 1;
        self.emit(Effect::SetNextStreamId(self.next_stream_id));

        let start = fork.as_ref().map_or(0, |point| point.origin.offset);
        let mut meta = StreamMeta {
            id,
            path: cmd.path.clone(),
            content_type,
            ttl_secs,
            expires_at,
            expiry_inherited,
            created_ms: cmd.now_ms,
            last_access_ms: cmd.now_ms,
            closed: cmd.closed,
            tail: start,
            retained_from: start,
            fork: fork.as_ref().map(|point| point.origin),
            fork_children: 0,
            soft_deleted: false,
            stream_seq: None,
            snapshots: BTreeMap::new(),
        };
        // A fork reads below its fork offset through the source, so nothing below is retained
        // apart from what the source retains.
        if meta.fork.is_some() {
            meta.retained_from = 0;
        }
        let partial = fork.and_then(|point| point.partial);
        let mut staged = Vec::new();
        for payload in [partial, cmd.initial].into_iter().flatten() {
            if payload.is_empty() {
                continue;
            }
            let offset = meta.tail;
            meta.tail += payload.len();
            match payload.staged {
                Some(body) => staged.push((offset, body)),
                None => self.emit(Effect::PutRecord {
                    stream_id: id,
                    offset,
                    bytes: payload.bytes,
                }),
            }
        }
        if let Some(origin) = meta.fork
            && let Some(source) = self.streams.get_mut(&origin.source_id)
        {
            source.meta.fork_children += 1;
            self.emit_meta(origin.source_id);
        }
        self.insert_stream(StreamState {
            meta,
            producers: HashMap::new(),
            cold: Default::default(),
        });
        self.emit_meta(id);
        // Once the stream is in `streams`, so that its state records the segments too.
        for (offset, body) in staged {
            self.add_staged(id, offset, body.len, &body.key);
        }
        self.subscriptions_see_create(&cmd.path, cmd.now_ms);
        Ok(Outcome::StreamCreated {
            created: true,
            meta: Box::new(self.streams[&id].meta.clone()),
        })
    }

    fn fork_point(
        &mut self,
        spec: &ForkSpec,
        content_type: Option<&str>,
        now_ms: u64,
    ) -> Result<ForkPoint, Refusal> {
        let source_name = spec.source.to_string();
        if self.check_not_fenced(&spec.source.bucket).is_err() {
            return Err(Refusal::ForkSourceNotFound(source_name));
        }
        let source_id = self
            .existing_stream(&spec.source, now_ms)
            .map_err(|_| Refusal::ForkSourceNotFound(source_name.clone()))?;
        let source = &self.streams[&source_id].meta;
        if source.soft_deleted {
            return Err(Refusal::ForkSourceDeleted(source_name));
        }
        if let Some(requested) = content_type
            && !same_media_type(requested, &source.content_type)
        {
            return Err(Refusal::ContentTypeMismatch {
                stream: source.content_type.clone(),
                request: requested.to_owned(),
            });
        }
        let offset = spec.offset.unwrap_or(source.tail);
        if offset > source.tail {
            return Err(Refusal::OffsetBeyondTail {
                offset,
                tail: source.tail,
            });
        }
        if offset < source.retained_from {
            return Err(Refusal::OffsetNotRetained {
                offset,
                retained_from: source.retained_from,
            });
        }
        let partial = if spec.sub_offset > 0 {
            match &spec.partial {
                Some(partial) if partial.source_id == source_id => Some(partial.payload.clone()),
                Some(_) => {
                    return Err(Refusal::StreamConflict {
                        path: source_name,
                        reason: "the fork source was re-created while the fork was prepared".into(),
                    });
                }
                None => {
                    return Err(Refusal::InvalidFork(
                        "Stream-Fork-Sub-Offset does not fall inside a message".into(),
                    ));
                }
            }
        } else {
            None
        };
        Ok(ForkPoint {
            origin: ForkOrigin {
                source_id,
                offset,
                sub_offset: spec.sub_offset,
            },
            content_type: source.content_type.clone(),
            ttl_secs: source.ttl_secs,
            expires_at: source.expires_at.clone(),
            partial,
        })
    }

    /// A create of an existing stream succeeds only with the same configuration: content type,
    /// TTL, expiry, closed state and fork origin. The body is not part of it.
    fn check_same_config(&self, meta: &StreamMeta, cmd: &CreateStream) -> Result<(), Refusal> {
        let conflict = |reason: &str| Refusal::StreamConflict {
            path: cmd.path.to_string(),
            reason: reason.to_owned(),
        };
        let content_type_matches = match (&cmd.content_type, &cmd.fork) {
            (None, Some(_)) => true,
            (requested, _) => same_media_type(
                requested.as_deref().unwrap_or(DEFAULT_CONTENT_TYPE),
                &meta.content_type,
            ),
        };
        if !content_type_matches {
            return Err(conflict("different content type"));
        }
        let expiry_matches = if meta.expiry_inherited {
            cmd.ttl_secs.is_none() && cmd.expires_at.is_none()
        } else {
            cmd.ttl_secs == meta.ttl_secs
                && cmd.expires_at.as_ref().map(|at| at.unix_ms)
                    == meta.expires_at.as_ref().map(|at| at.unix_ms)
        };
        if !expiry_matches {
            return Err(conflict("different TTL or expiry"));
        }
        if cmd.closed != meta.closed {
            return Err(conflict(if meta.closed {
                "the stream is closed"
            } else {
                "the stream is open"
            }));
        }
        let fork_matches = match (&cmd.fork, &meta.fork) {
            (None, None) => true,
            (Some(spec), Some(origin)) => {
                self.by_path.get(&spec.source) == Some(&origin.source_id)
                    && spec.offset.is_none_or(|offset| offset == origin.offset)
                    && spec.sub_offset == origin.sub_offset
            }
            _ => false,
        };
        if !fork_matches {
            return Err(conflict("different fork origin"));
        }
        Ok(())
    }
}
