//! Appends and closes, with `Stream-Seq` and idempotent producers.

use super::producer::{self, ProducerCheck};
use super::stream::same_media_type;
use super::{
    AppendOutcome, AppendStream, Effect, Machine, Outcome, ProducerAck, Refusal, StreamPath,
};

impl Machine {
    /// Checks run in this order: producer duplicate and fencing, closed, producer sequence,
    /// content type, `Stream-Seq`, producer room. The first refusal wins and changes nothing.
    pub(super) fn append(&mut self, cmd: AppendStream) -> Result<Outcome, Refusal> {
        let id = self.live_stream(&cmd.path, cmd.now_ms)?;
        let limits = self.limits;
        let state = self.streams.get(&id).ok_or_else(|| {
            // `live_stream` just returned this ID, so the stream is present.
            Refusal::StreamNotFound(cmd.path.to_string())
        })?;
        let meta = &state.meta;

        let mut producer_next = None;
        if let Some(claim) = &cmd.producer {
            match producer::check(state.producers.get(&claim.id), claim, cmd.now_ms) {
                ProducerCheck::Duplicate { epoch, last_seq } => {
                    let outcome = AppendOutcome {
                        next_offset: meta.tail,
                        closed: meta.closed,
                        producer: Some(ProducerAck {
                            epoch,
                            seq: last_seq,
                        }),
                        duplicate: true,
                    };
                    self.touch_stream(id, cmd.now_ms);
                    return Ok(Outcome::Appended(outcome));
                }
                ProducerCheck::Refuse(fenced @ Refusal::ProducerFenced { .. }) => {
                    return Err(fenced);
                }
                ProducerCheck::Refuse(refusal) => {
                    if meta.closed {
                        return Err(Refusal::StreamClosed {
                            next_offset: meta.tail,
                        });
                    }
                    return Err(refusal);
                }
                ProducerCheck::Accept { next } => producer_next = Some((claim.id.clone(), next)),
            }
        }

        if meta.closed {
            if cmd.payload.is_none() && cmd.close && cmd.producer.is_none() {
                let outcome = AppendOutcome {
                    next_offset: meta.tail,
                    closed: true,
                    producer: None,
                    duplicate: false,
                };
                self.touch_stream(id, cmd.now_ms);
                return Ok(Outcome::Appended(outcome));
            }
            return Err(Refusal::StreamClosed {
                next_offset: meta.tail,
            });
        }

        if cmd.payload.is_some() {
            let requested = cmd.content_type.as_deref().unwrap_or_default();
            if !same_media_type(requested, &meta.content_type) {
                return Err(Refusal::ContentTypeMismatch {
                    stream: meta.content_type.clone(),
                    request: requested.to_owned(),
                });
            }
        }

        if let (Some(received), Some(last)) = (&cmd.stream_seq, &meta.stream_seq)
            && received.as_bytes() <= last.as_bytes()
        {
            return Err(Refusal::StreamSeqConflict {
                last: last.clone(),
                received: received.clone(),
            });
        }

        let mut evicted = None;
        if let Some((producer_id, _)) = &producer_next
            && !state.producers.contains_key(producer_id)
            && state.producers.len() >= limits.max_producers_per_stream as usize
        {
            // Room is made only by evicting the producer idle the longest, and only if it has
            // been idle for at least `producer_idle_ms`; otherwise the new producer waits.
            let idlest = state
                .producers
                .iter()
                .min_by(|a, b| a.1.last_write_ms.cmp(&b.1.last_write_ms).then(a.0.cmp(b.0)))
                .filter(|(_, p)| {
                    cmd.now_ms.saturating_sub(p.last_write_ms) >= limits.producer_idle_ms
                })
                .map(|(id, _)| id.clone());
            match idlest {
                Some(victim) => evicted = Some(victim),
                None => {
                    return Err(Refusal::TooManyProducers {
                        limit: limits.max_producers_per_stream,
                    });
                }
            }
        }

        // Every check passed: apply.
        let Some(state) = self.streams.get_mut(&id) else {
            return Err(Refusal::StreamNotFound(cmd.path.to_string()));
        };
        let meta = &mut state.meta;
        let tail_before = meta.tail;
        let mut effects = Vec::with_capacity(4);
        let mut staged = None;
        if let Some(payload) = cmd.payload {
            let len = payload.len();
            match payload.staged {
                Some(body) => staged = Some((meta.tail, body)),
                None => effects.push(Effect::PutRecord {
                    stream_id: id,
                    offset: meta.tail,
                    bytes: payload.bytes.clone(),
                }),
            }
            meta.tail += len;
        }
        if cmd.close {
            meta.closed = true;
        }
        if let Some(seq) = cmd.stream_seq {
            meta.stream_seq = Some(seq);
        }
        meta.last_access_ms = meta.last_access_ms.max(cmd.now_ms);
        if let Some(victim) = evicted {
            state.producers.remove(&victim);
            effects.push(Effect::DeleteProducer {
                stream_id: id,
                producer_id: victim,
            });
        }
        let mut ack = None;
        if let Some((producer_id, next)) = producer_next {
            ack = Some(ProducerAck {
                epoch: next.epoch,
                seq: next.last_seq,
            });
            state.producers.insert(producer_id.clone(), next);
            effects.push(Effect::PutProducer {
                stream_id: id,
                producer_id,
                state: next,
            });
        }
        let outcome = AppendOutcome {
            next_offset: meta.tail,
            closed: meta.closed,
            producer: ack,
            duplicate: false,
        };
        let appended = meta.tail > tail_before;
        let wrote_record = !effects.is_empty() && matches!(effects[0], Effect::PutRecord { .. });
        self.effects.extend(effects);
        if let Some((offset, body)) = staged {
            self.add_staged(id, offset, body.len, &body.key);
        }
        if wrote_record {
            // The batch's end writes the stream's metadata once for all its appends.
            self.defer_meta(id);
        } else {
            self.emit_meta(id);
        }
        if appended {
            self.subscriptions_see_data(&cmd.path, cmd.now_ms);
        }
        Ok(Outcome::Appended(outcome))
    }

    /// Appends one JSON message the machine wrote itself (a subscription's wake event) to a
    /// live, open JSON stream; anything else is left alone. It wakes no subscription, so that
    /// wake streams cannot wake each other.
    pub(super) fn append_event(&mut self, path: &StreamPath, message: Vec<u8>) {
        let Some(&id) = self.by_path.get(path) else {
            return;
        };
        let Some(state) = self.streams.get_mut(&id) else {
            return;
        };
        let meta = &mut state.meta;
        if meta.soft_deleted || meta.closed || !meta.is_json() || message.is_empty() {
            return;
        }
        let offset = meta.tail;
        meta.tail += message.len() as u64;
        self.emit(Effect::PutRecord {
            stream_id: id,
            offset,
            bytes: message.into(),
        });
        self.defer_meta(id);
    }
}
