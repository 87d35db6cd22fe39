//! Reading a stream's bytes, through its fork chain: below a fork's offset the bytes come from
//! its source, from the fork offset on from the fork itself.

use bytes::Bytes;

use super::{Engine, StreamHandle};
use crate::machine::StreamMeta;
use crate::storage::{Record, StorageError};

/// A piece of one record, at offset `start`. `whole` is true when it is the entire record.
#[derive(Debug, Clone)]
pub struct Slice {
    pub start: u64,
    pub bytes: Bytes,
    pub whole: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("offset {offset} is below the first retained offset {retained_from}")]
    NotRetained { offset: u64, retained_from: u64 },
    #[error("offset {0} is not at a message boundary of this JSON stream")]
    NotBoundary(u64),
    #[error("the fork source of stream {0} is missing")]
    MissingSource(u64),
    #[error("no record of stream {stream} was found at offset {offset}")]
    Missing { stream: u64, offset: u64 },
    #[error("stream {0} was deleted during the read")]
    Removed(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("cannot read the stream's cold records: {0}")]
    Cold(#[from] crate::cold::ColdError),
    #[error(
        "the read got no data within server.request_timeout ({0:?}); nothing changed: retry it"
    )]
    TimedOut(std::time::Duration),
}

impl Engine {
    /// The first offset a read can start at.
    pub fn first_offset(&self, meta: &StreamMeta) -> u64 {
        match meta.fork {
            Some(origin) if meta.retained_from < origin.offset => {
                let source_first = self
                    .stream_by_id(origin.source_id)
                    .map_or(origin.offset, |source| self.first_offset(&source.meta()));
                source_first.max(meta.retained_from).min(origin.offset)
            }
            _ => meta.retained_from,
        }
    }

    /// A snapshot body. Bodies are read from redb, so this first waits until redb holds the
    /// stream's latest change.
    pub async fn snapshot(
        &self,
        handle: &StreamHandle,
        offset: u64,
    ) -> Result<Option<Bytes>, ReadError> {
        let stored = self.registry.wait_stored(handle.changed_seq());
        tokio::time::timeout(self.request_timeout, stored)
            .await
            .map_err(|_| ReadError::TimedOut(self.request_timeout))?;
        Ok(self.store.snapshot(handle.id, offset)?)
    }

    /// Up to about `max_bytes` (at least one record) from `from` towards the tail.
    pub async fn read(
        &self,
        handle: &StreamHandle,
        meta: &StreamMeta,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<Slice>, ReadError> {
        // Object storage, or a record being applied, may keep a read waiting.
        let read = self.read_range(handle, meta, from, meta.tail, max_bytes);
        tokio::time::timeout(self.request_timeout, read)
            .await
            .map_err(|_| ReadError::TimedOut(self.request_timeout))?
    }

    async fn read_range(
        &self,
        handle: &StreamHandle,
        meta: &StreamMeta,
        from: u64,
        until: u64,
        max_bytes: usize,
    ) -> Result<Vec<Slice>, ReadError> {
        if from < meta.retained_from {
            return Err(ReadError::NotRetained {
                offset: from,
                retained_from: meta.retained_from,
            });
        }
        let mut out = Vec::new();
        let mut pos = from;
        let mut budget = max_bytes.max(1);
        if let Some(origin) = meta.fork
            && pos < origin.offset
        {
            let source = self
                .stream_by_id(origin.source_id)
                .ok_or(ReadError::MissingSource(meta.id))?;
            let source_meta = source.meta();
            let inherited_until = origin.offset.min(until);
            let part =
                Box::pin(self.read_range(&source, &source_meta, pos, inherited_until, budget))
                    .await?;
            for slice in &part {
                pos = slice.start + slice.bytes.len() as u64;
                budget = budget.saturating_sub(slice.bytes.len());
            }
            out.extend(part);
            if pos < inherited_until || budget == 0 {
                return Ok(out);
            }
        }
        let json = meta.is_json();
        // Older records are in cold segments, newer ones on local disk (and the most recent in
        // the tail cache). A flush, or the tail cache letting records go, can move the line
        // between a look and the read that follows it; a read that then finds nothing at
        // `pos` looks again. A record is never skipped: `slice_records` stops at a gap.
        let mut misses = 0;
        while pos < until && budget > 0 {
            let before = pos;
            match handle.cold_segment_at(pos).filter(|_| !handle.caches(pos)) {
                Some(segment) => {
                    let records = self.cold_records(&segment).await?;
                    let records = records.iter().cloned();
                    let end = until.min(segment.until);
                    slice_records(&mut out, records, &mut pos, end, json, &mut budget)?;
                }
                None => {
                    // Local records end where the next cold segment (a staged body) starts.
                    let local_until = handle.next_cold_from(pos).map_or(until, |at| at.min(until));
                    let records = self.read_local(Some(handle), meta, pos, local_until, budget)?;
                    let records = records.into_iter();
                    slice_records(&mut out, records, &mut pos, until, json, &mut budget)?;
                    if pos > before && pos < local_until {
                        // The local read went as far as its budget allowed.
                        break;
                    }
                }
            }
            if pos == before {
                if !out.is_empty() {
                    break;
                }
                // Retention or a delete may have come since `meta` was taken.
                let now = handle.meta();
                if handle.is_removed() {
                    return Err(ReadError::Removed(meta.path.to_string()));
                }
                if pos < now.retained_from {
                    return Err(ReadError::NotRetained {
                        offset: pos,
                        retained_from: now.retained_from,
                    });
                }
                misses += 1;
                if misses == 3 {
                    return Err(ReadError::Missing {
                        stream: meta.id,
                        offset: pos,
                    });
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        }
        Ok(out)
    }

    /// Records of the stream overlapping `[from, until)` from local disk (or the tail cache,
    /// which holds every record local disk does not hold yet), up to about `budget` bytes.
    pub(super) fn read_local(
        &self,
        handle: Option<&StreamHandle>,
        meta: &StreamMeta,
        from: u64,
        until: u64,
        budget: usize,
    ) -> Result<Vec<Record>, ReadError> {
        let records = match handle.and_then(|h| h.cached(from, until, budget)) {
            Some((first, cached)) if first <= from => cached,
            Some((first, cached)) => {
                let mut records =
                    self.store
                        .read_records(meta.id, from, first.min(until), budget)?;
                let stored_end = records
                    .last()
                    .map_or(from, |(start, bytes)| start + bytes.len() as u64);
                let stored_bytes: usize = records.iter().map(|(_, b)| b.len()).sum();
                if stored_end >= first && stored_bytes < budget {
                    records.extend(cached);
                }
                records
            }
            None => self.store.read_records(meta.id, from, until, budget)?,
        };
        Ok(records)
    }
}

/// Appends the parts of `records` within `[pos, until)` to `out` while `budget` lasts (at
/// least one), moving `pos` past them. A JSON stream is read only from message boundaries.
fn slice_records(
    out: &mut Vec<Slice>,
    records: impl Iterator<Item = Record>,
    pos: &mut u64,
    until: u64,
    json: bool,
    budget: &mut usize,
) -> Result<(), ReadError> {
    for (start, bytes) in records {
        if *budget == 0 || start > *pos {
            // Out of budget, or a gap: nothing may be skipped.
            break;
        }
        let end = start + bytes.len() as u64;
        let lo = (*pos).max(start);
        let hi = until.min(end);
        if lo >= hi {
            if start >= until {
                break;
            }
            continue;
        }
        if json && lo != start {
            return Err(ReadError::NotBoundary(*pos));
        }
        out.push(Slice {
            start: lo,
            bytes: bytes.slice((lo - start) as usize..(hi - start) as usize),
            whole: lo == start && hi == end,
        });
        *budget = budget.saturating_sub((hi - lo) as usize);
        *pos = hi;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(list: &[(u64, &'static str)]) -> Vec<Record> {
        list.iter()
            .map(|(offset, text)| (*offset, Bytes::from_static(text.as_bytes())))
            .collect()
    }

    /// Slices `0..3 "abc"`, an empty record at 3, `3..5 "de"`, and `9..11 "zz"` (5..9 missing).
    fn slice(from: u64, until: u64, budget: usize) -> (Vec<(u64, String, bool)>, u64) {
        let mut out = Vec::new();
        let mut pos = from;
        let mut budget = budget;
        let stored = records(&[(0, "abc"), (3, ""), (3, "de"), (9, "zz")]);
        slice_records(
            &mut out,
            stored.into_iter(),
            &mut pos,
            until,
            false,
            &mut budget,
        )
        .expect("a text stream reads from any offset");
        let slices = out
            .into_iter()
            .map(|s| {
                (
                    s.start,
                    String::from_utf8(s.bytes.to_vec()).unwrap(),
                    s.whole,
                )
            })
            .collect();
        (slices, pos)
    }

    #[test]
    fn slicing_stops_at_a_gap_and_at_the_budget() {
        // Records 5..9 are missing (a flush moved them between two looks): never skipped.
        let (slices, pos) = slice(1, 20, 100);
        assert_eq!(
            slices,
            vec![(1, "bc".into(), false), (3, "de".into(), true)]
        );
        assert_eq!(pos, 5);
        // At least one record, then stop once the budget is spent.
        let (slices, pos) = slice(0, 20, 2);
        assert_eq!(slices, vec![(0, "abc".into(), true)]);
        assert_eq!(pos, 3);
        // `until` cuts a record.
        let (slices, pos) = slice(0, 4, 100);
        assert_eq!(
            slices,
            vec![(0, "abc".into(), true), (3, "d".into(), false)]
        );
        assert_eq!(pos, 4);
        // Past the gap, nothing at all.
        let (slices, pos) = slice(6, 20, 100);
        assert!(slices.is_empty());
        assert_eq!(pos, 6);
    }

    #[test]
    fn a_json_read_must_start_at_a_message() {
        let mut out = Vec::new();
        let mut pos = 1;
        let mut budget = 100;
        let stored = records(&[(0, "abc")]);
        let result = slice_records(&mut out, stored.into_iter(), &mut pos, 3, true, &mut budget);
        assert!(matches!(result, Err(ReadError::NotBoundary(1))));
    }
}
