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
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("cannot read the stream's cold records: {0}")]
    Cold(#[from] crate::cold::ColdError),
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

    /// Up to about `max_bytes` (at least one record) from `from` towards the tail.
    pub async fn read(
        &self,
        handle: &StreamHandle,
        meta: &StreamMeta,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<Slice>, ReadError> {
        self.read_range(handle, meta, from, meta.tail, max_bytes)
            .await
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
        // Older records are in cold segments, newer ones on local disk. A flush can move the
        // line between a look at the segments and the local read, so a local read that finds
        // nothing looks at the segments once more.
        for _ in 0..2 {
            while pos < until && budget > 0 && !handle.caches(pos) {
                let Some(segment) = handle.cold_segment_at(pos) else {
                    break;
                };
                let records = self.cold_records(&segment).await?;
                let end = until.min(segment.until);
                let before = pos;
                let records = records.iter().cloned();
                slice_records(&mut out, records, &mut pos, end, json, &mut budget)?;
                if pos == before {
                    break;
                }
            }
            if pos >= until || budget == 0 {
                return Ok(out);
            }
            let records = self.read_local(Some(handle), meta, pos, until, budget)?;
            if records.is_empty() && handle.cold_segment_at(pos).is_some() {
                continue;
            }
            slice_records(
                &mut out,
                records.into_iter(),
                &mut pos,
                until,
                json,
                &mut budget,
            )?;
            break;
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
        if *budget == 0 {
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
