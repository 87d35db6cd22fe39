//! Reading a stream's bytes, through its fork chain: below a fork's offset the bytes come from
//! its source, from the fork offset on from the fork itself.

use bytes::Bytes;

use super::{Engine, StreamHandle};
use crate::machine::StreamMeta;
use crate::storage::StorageError;

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
    pub fn read(
        &self,
        handle: &StreamHandle,
        meta: &StreamMeta,
        from: u64,
        max_bytes: usize,
    ) -> Result<Vec<Slice>, ReadError> {
        self.read_range(Some(handle), meta, from, meta.tail, max_bytes)
    }

    fn read_range(
        &self,
        handle: Option<&StreamHandle>,
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
                self.read_range(Some(&source), &source_meta, pos, inherited_until, budget)?;
            for slice in &part {
                pos = slice.start + slice.bytes.len() as u64;
                budget = budget.saturating_sub(slice.bytes.len());
            }
            out.extend(part);
            if pos < inherited_until || budget == 0 {
                return Ok(out);
            }
        }
        if pos >= until {
            return Ok(out);
        }
        // Recent records are in the tail cache (those redb does not hold yet always are);
        // older ones come from redb.
        let records = match handle.and_then(|h| h.cached(pos, until, budget)) {
            Some((first, cached)) if first <= pos => cached,
            Some((first, cached)) => {
                let mut records =
                    self.store
                        .read_records(meta.id, pos, first.min(until), budget)?;
                let stored_end = records
                    .last()
                    .map_or(pos, |(start, bytes)| start + bytes.len() as u64);
                let stored_bytes: usize = records.iter().map(|(_, b)| b.len()).sum();
                if stored_end >= first && stored_bytes < budget {
                    records.extend(cached);
                }
                records
            }
            None => self.store.read_records(meta.id, pos, until, budget)?,
        };
        let json = meta.is_json();
        for (start, bytes) in records {
            let end = start + bytes.len() as u64;
            let lo = pos.max(start);
            let hi = until.min(end);
            if lo >= hi {
                continue;
            }
            if json && lo != start {
                return Err(ReadError::NotBoundary(pos));
            }
            out.push(Slice {
                start: lo,
                bytes: bytes.slice((lo - start) as usize..(hi - start) as usize),
                whole: lo == start && hi == end,
            });
            pos = hi;
        }
        Ok(out)
    }
}
