//! Cold flush: a range of a stream's records has been written to object storage by the
//! group's leader, and from now on is read from there instead of local disk.

use super::{ColdFlush, Effect, Machine, Outcome, StreamMeta, StreamState};

/// The first offset whose record a stream holds on local disk: past its cold segments (which
/// end at `cold_until`), its retention point, and (for a fork) the bytes its source holds.
pub fn local_from(meta: &StreamMeta, cold_until: u64) -> u64 {
    let own_from = meta.fork.map_or(0, |origin| origin.offset);
    cold_until
        .max(meta.retained_from)
        .max(own_from)
        .min(meta.tail)
}

impl StreamState {
    pub fn local_from(&self) -> u64 {
        local_from(&self.meta, self.cold_until)
    }
}

impl Machine {
    /// Accepts the object only if its records start at or below the first local offset and
    /// end past it, within the stream; the new segment then covers exactly what is still
    /// local below `until`. Anything else (a repeat of a flush that applied, a range retention
    /// passed, a deleted stream) changes nothing, so leaders need no coordination beyond the
    /// log's order.
    pub(super) fn cold_flush(&mut self, flush: ColdFlush) -> Outcome {
        let Some(state) = self.streams.get_mut(&flush.stream_id) else {
            return Outcome::ColdFlushed { accepted: false };
        };
        let local_from = state.local_from();
        if flush.first > local_from || flush.until <= local_from || flush.until > state.meta.tail {
            return Outcome::ColdFlushed { accepted: false };
        }
        // The segment starts where local records do, whatever the object holds below that
        // (a flush read before an earlier one applied): segments never overlap.
        state.cold_until = flush.until;
        self.emit(Effect::PutColdSegment {
            stream_id: flush.stream_id,
            from: local_from,
            until: flush.until,
            first: flush.first,
            key: flush.key.into(),
        });
        self.emit(Effect::DropLocalBelow {
            stream_id: flush.stream_id,
            offset: flush.until,
        });
        Outcome::ColdFlushed { accepted: true }
    }
}
