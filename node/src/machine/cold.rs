//! The cold tier in the state machine. A stream's records are on local disk or in cold
//! segments (objects in object storage): older records a group's leader flushed there
//! (`Command::ColdFlush`), and bodies a node staged there before proposing them (a payload
//! with `staged`). Segments never overlap; local records fill the ranges between them.

use std::collections::BTreeMap;

use super::{ColdFlush, Effect, Machine, Outcome, StreamMeta, StreamState};

/// A cold segment as a map from its first offset holds it: something that knows its end.
pub trait SegmentEnd {
    fn until(&self) -> u64;
}

impl SegmentEnd for u64 {
    fn until(&self) -> u64 {
        *self
    }
}

/// Where a stream's oldest local records are: from the first offset that is neither behind
/// its retention point, nor (for a fork) in its source, nor in a cold segment, up to the next
/// segment or the tail.
pub fn local_range<S: SegmentEnd>(meta: &StreamMeta, cold: &BTreeMap<u64, S>) -> (u64, u64) {
    let own_from = meta.fork.map_or(0, |origin| origin.offset);
    let mut from = meta.retained_from.max(own_from);
    if let Some((_, segment)) = cold.range(..=from).next_back() {
        from = from.max(segment.until());
    }
    while let Some(segment) = cold.get(&from) {
        from = segment.until();
    }
    let from = from.min(meta.tail);
    let until = cold
        .range(from..)
        .next()
        .map_or(meta.tail, |(start, _)| *start);
    (from, until.min(meta.tail))
}

/// Record bytes of a stream on local disk.
pub fn local_bytes<S: SegmentEnd>(meta: &StreamMeta, cold: &BTreeMap<u64, S>) -> u64 {
    let (from, _) = local_range(meta, cold);
    let cold_above: u64 = cold
        .range(from..)
        .map(|(start, segment)| segment.until().min(meta.tail).saturating_sub(*start))
        .sum();
    (meta.tail - from).saturating_sub(cold_above)
}

impl StreamState {
    pub fn local_range(&self) -> (u64, u64) {
        local_range(&self.meta, &self.cold)
    }
}

impl Machine {
    /// Accepts the object only if its records start at or below the first local offset and
    /// end past it, no further than the next segment; the new segment then covers exactly
    /// what is still local below `until`. Anything else (a repeat of a flush that applied, a
    /// range retention passed, a deleted stream) changes nothing, so leaders need no
    /// coordination beyond the log's order.
    pub(super) fn cold_flush(&mut self, flush: ColdFlush) -> Outcome {
        let Some(state) = self.streams.get_mut(&flush.stream_id) else {
            return Outcome::ColdFlushed { accepted: false };
        };
        let (local_from, local_until) = state.local_range();
        if flush.first > local_from || flush.until <= local_from || flush.until > local_until {
            return Outcome::ColdFlushed { accepted: false };
        }
        // The segment starts where local records do, whatever the object holds below that
        // (a flush read before an earlier one applied): segments never overlap.
        state.cold.insert(local_from, flush.until);
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

    /// A staged body becomes a segment of its own at the stream's tail.
    pub(super) fn add_staged(&mut self, stream_id: u64, offset: u64, len: u64, key: &str) {
        if let Some(state) = self.streams.get_mut(&stream_id) {
            state.cold.insert(offset, offset + len);
        }
        self.emit(Effect::PutColdSegment {
            stream_id,
            from: offset,
            until: offset + len,
            first: offset,
            key: key.into(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::stream::ForkOrigin;

    fn meta(tail: u64, retained_from: u64, fork_at: Option<u64>) -> StreamMeta {
        StreamMeta {
            retained_from,
            fork: fork_at.map(|offset| ForkOrigin {
                source_id: 9,
                offset,
                sub_offset: 0,
            }),
            ..StreamMeta::for_tests(tail)
        }
    }

    #[test]
    fn local_records_are_what_no_segment_retention_or_source_covers() {
        let cold: BTreeMap<u64, u64> = [(0, 10), (10, 20), (30, 40), (50, 60)].into();
        let cases = [
            // (tail, retained_from, fork offset) -> (local range, local bytes)
            ((70, 0, None), ((20, 30), 30)),
            ((70, 25, None), ((25, 30), 25)),
            ((70, 35, None), ((40, 50), 20)),
            ((60, 55, None), ((60, 60), 0)),
            ((70, 0, Some(45)), ((45, 50), 15)),
        ];
        for ((tail, retained, fork), expected) in cases {
            let meta = meta(tail, retained, fork);
            let got = (local_range(&meta, &cold), local_bytes(&meta, &cold));
            assert_eq!(
                got, expected,
                "tail {tail}, retained {retained}, fork {fork:?}"
            );
        }
        let none: BTreeMap<u64, u64> = BTreeMap::new();
        assert_eq!(local_range(&meta(8, 3, None), &none), (3, 8));
        assert_eq!(local_bytes(&meta(8, 3, None), &none), 5);
    }
}
