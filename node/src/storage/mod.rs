//! Durable state in one redb file: buckets, stream metadata, producers, records and snapshots.
//!
//! Records are stored in chunks keyed by `(stream incarnation ID, first offset)`, so a range scan
//! reads a stream in order and a re-created stream never sees its predecessor's bytes. A chunk
//! holds the consecutive records of one stream written by one transaction.

mod codec;
pub use codec::{AppendTo, encode_sized};
mod dump;
pub mod wal;

pub use codec::{ChunkBuilder, decode_chunk};
pub use dump::GroupDump;

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use crate::machine::{Effect, Limits, Machine, StreamState};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const BUCKETS: TableDefinition<&str, u8> = TableDefinition::new("buckets");
const STREAMS: TableDefinition<u64, &[u8]> = TableDefinition::new("streams");
const PRODUCERS: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("producers");
const RECORDS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("records");
const SNAPSHOTS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("snapshots");
/// Cold segments: `(stream, from)` to the end offset, the object's first offset and its name.
const COLD: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("cold");
/// Subscriptions by `(bucket, ID)`, each as one postcard value.
const SUBSCRIPTIONS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("subscriptions");
/// On a replicated node: the Raft log position and membership the state includes.
const RAFT: TableDefinition<&str, &[u8]> = TableDefinition::new("raft");
const RAFT_APPLIED: &str = "applied";

/// Record bytes per chunk row at most (give or take a record). A read copies whole rows, and
/// the applier gathers a stream's appends of a whole commit interval: unbounded, a busy
/// stream's row grew to tens of MiB, and every 1 MiB page of a catch-up read copied all of it
/// (40 MiB/s from redb, `e2e/bench/cold.sh`).
const MAX_CHUNK_BYTES: u64 = 256 * 1024;

const NEXT_STREAM_ID: &str = "next_stream_id";
/// The last WAL record whose effects this file holds.
const APPLIED_SEQ: &str = "applied_seq";

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage: {0}")]
    Redb(#[from] redb::Error),
    #[error("storage holds a record it cannot decode: {0}")]
    Corrupt(String),
    #[error("storage I/O: {0}")]
    Io(#[from] std::io::Error),
}

macro_rules! redb_errors {
    ($($t:ty),*) => {$(
        impl From<$t> for StorageError {
            fn from(e: $t) -> Self {
                Self::Redb(e.into())
            }
        }
    )*};
}
redb_errors!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

impl crate::machine::cold::SegmentEnd for ColdSegment {
    fn until(&self) -> u64 {
        self.until
    }
}

/// One record: its start offset and its bytes.
pub type Record = (u64, Bytes);

/// Records `[from, until)` of a stream are read from the cold object `key`, whose records
/// start at `first` (at or below `from`: an object may also hold records an earlier segment
/// covers). A stream's segments never overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdSegment {
    pub from: u64,
    pub until: u64,
    pub first: u64,
    pub key: std::sync::Arc<str>,
}

pub struct Store {
    db: Database,
}

impl Store {
    pub fn open(dir: &Path) -> Result<Self, StorageError> {
        std::fs::create_dir_all(dir)?;
        let db = Database::builder()
            .set_cache_size(256 * 1024 * 1024)
            .create(dir.join("ursula.redb"))?;
        let txn = db.begin_write()?;
        txn.open_table(META)?;
        txn.open_table(BUCKETS)?;
        txn.open_table(STREAMS)?;
        txn.open_table(PRODUCERS)?;
        txn.open_table(RECORDS)?;
        txn.open_table(SNAPSHOTS)?;
        txn.open_table(COLD)?;
        txn.open_table(RAFT)?;
        txn.open_table(SUBSCRIPTIONS)?;
        txn.commit()?;
        Ok(Self { db })
    }

    /// Rebuilds the state machine from the committed state; also returns the last WAL record
    /// that state includes.
    pub fn load(&self, limits: Limits) -> Result<(Machine, u64), StorageError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(META)?;
        let next_id = meta.get(NEXT_STREAM_ID)?.map_or(1, |v| v.value());
        let applied_seq = meta.get(APPLIED_SEQ)?.map_or(0, |v| v.value());
        let mut buckets = Vec::new();
        for entry in txn.open_table(BUCKETS)?.iter()? {
            let (name, state) = entry?;
            buckets.push((name.value().to_owned(), codec::bucket_state(state.value())));
        }
        let mut streams = std::collections::HashMap::new();
        for entry in txn.open_table(STREAMS)?.iter()? {
            let (_, bytes) = entry?;
            let meta = codec::decode_meta(bytes.value())?;
            streams.insert(
                meta.id,
                StreamState {
                    meta,
                    producers: Default::default(),
                    cold: Default::default(),
                },
            );
        }
        for entry in txn.open_table(PRODUCERS)?.iter()? {
            let (key, bytes) = entry?;
            let (stream_id, producer_id) = key.value();
            if let Some(state) = streams.get_mut(&stream_id) {
                let producer = codec::decode_producer(bytes.value())?;
                state.producers.insert(producer_id.to_owned(), producer);
            }
        }
        for entry in txn.open_table(COLD)?.iter()? {
            let (key, value) = entry?;
            let (stream_id, from) = key.value();
            let (until, _, _) = codec::decode_cold(value.value())?;
            if let Some(state) = streams.get_mut(&stream_id) {
                state.cold.insert(from, until);
            }
        }
        let mut subscriptions = Vec::new();
        for entry in txn.open_table(SUBSCRIPTIONS)?.iter()? {
            let (_, value) = entry?;
            subscriptions.push(
                postcard::from_bytes(value.value())
                    .map_err(|e| StorageError::Corrupt(format!("a subscription: {e}")))?,
            );
        }
        let machine = Machine::restore(
            limits,
            next_id,
            buckets,
            streams.into_values(),
            subscriptions,
        );
        Ok((machine, applied_seq))
    }

    /// Every stream's cold segments, in offset order.
    pub fn cold_segments(&self) -> Result<HashMap<u64, Vec<ColdSegment>>, StorageError> {
        let txn = self.db.begin_read()?;
        let mut out: HashMap<u64, Vec<ColdSegment>> = HashMap::new();
        for entry in txn.open_table(COLD)?.iter()? {
            let (key, value) = entry?;
            let (stream_id, from) = key.value();
            let (until, first, key) = codec::decode_cold(value.value())?;
            out.entry(stream_id).or_default().push(ColdSegment {
                from,
                until,
                first,
                key: key.into(),
            });
        }
        Ok(out)
    }

    /// Writes the effects of WAL records up to `applied_seq` in one transaction. The WAL makes
    /// them durable; a `durable` commit (a checkpoint) also fsyncs this file, after which the
    /// WAL up to `applied_seq` is no longer needed.
    /// On a replicated node `raft` is the Raft position of `applied_seq`, stored with it.
    pub fn commit(
        &self,
        effects: &[Effect],
        applied_seq: u64,
        durable: bool,
        raft: Option<&[u8]>,
    ) -> Result<(), StorageError> {
        let mut txn = self.db.begin_write()?;
        if !durable {
            txn.set_durability(Durability::None)?;
        }
        {
            let mut meta = txn.open_table(META)?;
            let mut buckets = txn.open_table(BUCKETS)?;
            let mut streams = txn.open_table(STREAMS)?;
            let mut producers = txn.open_table(PRODUCERS)?;
            let mut records = txn.open_table(RECORDS)?;
            let mut snapshots = txn.open_table(SNAPSHOTS)?;
            let mut cold = txn.open_table(COLD)?;
            let mut subscriptions = txn.open_table(SUBSCRIPTIONS)?;
            meta.insert(APPLIED_SEQ, applied_seq)?;
            if let Some(raft) = raft {
                txn.open_table(RAFT)?.insert(RAFT_APPLIED, raft)?;
            }
            // Consecutive records of a stream in one transaction are stored as one chunk row.
            let mut pending: HashMap<u64, codec::ChunkBuilder> = HashMap::new();
            for effect in effects {
                match effect {
                    Effect::PutBucket { bucket, state } => {
                        buckets.insert(bucket.as_str(), codec::bucket_byte(state))?;
                    }
                    Effect::SetNextStreamId(id) => {
                        meta.insert(NEXT_STREAM_ID, *id)?;
                    }
                    Effect::PutStream(stream) => {
                        streams.insert(stream.id, codec::encode_meta(stream).as_slice())?;
                    }
                    Effect::DeleteStream { id, .. } => {
                        pending.remove(id);
                        streams.remove(*id)?;
                        let id = *id;
                        records.retain_in((id, 0)..=(id, u64::MAX), |_, _| false)?;
                        snapshots.retain_in((id, 0)..=(id, u64::MAX), |_, _| false)?;
                        cold.retain_in((id, 0)..=(id, u64::MAX), |_, _| false)?;
                        producers.retain_in((id, "")..(id + 1, ""), |_, _| false)?;
                    }
                    Effect::PutRecord {
                        stream_id,
                        offset,
                        bytes,
                    } => {
                        let chunk = pending
                            .entry(*stream_id)
                            .or_insert_with(|| codec::ChunkBuilder::new(*offset));
                        if chunk.end() != *offset || chunk.data_len() >= MAX_CHUNK_BYTES {
                            let full = std::mem::replace(chunk, codec::ChunkBuilder::new(*offset));
                            records.insert((*stream_id, full.first()), full.encode().as_slice())?;
                        }
                        chunk.push(bytes.clone());
                    }
                    Effect::DeleteRecordsBelow { stream_id, offset } => {
                        drop_records_below(&mut records, &mut pending, *stream_id, *offset)?;
                        let limit = *offset;
                        cold.retain_in((*stream_id, 0)..(*stream_id, limit), |_, value| {
                            codec::decode_cold(value).is_ok_and(|(until, _, _)| until > limit)
                        })?;
                    }
                    Effect::PutColdSegment {
                        stream_id,
                        from,
                        until,
                        first,
                        key,
                    } => {
                        cold.insert(
                            (*stream_id, *from),
                            codec::encode_cold(*until, *first, key).as_slice(),
                        )?;
                    }
                    Effect::DropLocalBelow { stream_id, offset } => {
                        drop_records_below(&mut records, &mut pending, *stream_id, *offset)?;
                    }
                    Effect::PutProducer {
                        stream_id,
                        producer_id,
                        state,
                    } => {
                        producers.insert(
                            (*stream_id, producer_id.as_str()),
                            codec::encode_producer(state).as_slice(),
                        )?;
                    }
                    Effect::DeleteProducer {
                        stream_id,
                        producer_id,
                    } => {
                        producers.remove((*stream_id, producer_id.as_str()))?;
                    }
                    Effect::PutSnapshot {
                        stream_id,
                        offset,
                        body,
                        ..
                    } => {
                        snapshots.insert((*stream_id, *offset), body.as_ref())?;
                    }
                    Effect::DeleteSnapshot { stream_id, offset } => {
                        snapshots.remove((*stream_id, *offset))?;
                    }
                    Effect::PutSubscription(sub) => {
                        let value = postcard::to_allocvec(sub.as_ref())
                            .map_err(|e| StorageError::Corrupt(format!("a subscription: {e}")))?;
                        subscriptions
                            .insert((sub.bucket.as_str(), sub.id.as_str()), value.as_slice())?;
                    }
                    Effect::DeleteSubscription { bucket, id } => {
                        subscriptions.remove((bucket.as_str(), id.as_str()))?;
                    }
                }
            }
            for (stream_id, chunk) in pending {
                records.insert((stream_id, chunk.first()), chunk.encode().as_slice())?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Records of a stream overlapping `[from, until)`, in order, stopping once `max_bytes` are
    /// collected (at least one record is returned when any overlaps).
    pub fn read_records(
        &self,
        stream_id: u64,
        from: u64,
        until: u64,
        max_bytes: usize,
    ) -> Result<Vec<Record>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(RECORDS)?;
        // The chunk that contains `from` may start before it.
        let start = match table.range((stream_id, 0)..=(stream_id, from))?.next_back() {
            Some(entry) => entry?.0.value().1,
            None => from,
        };
        let mut out = Vec::new();
        let mut total = 0usize;
        for entry in table.range((stream_id, start)..(stream_id, until))? {
            let (key, value) = entry?;
            let chunk = Bytes::copy_from_slice(value.value());
            for (offset, bytes) in codec::decode_chunk(key.value().1, &chunk)? {
                let end = offset + bytes.len() as u64;
                if end <= from {
                    continue;
                }
                if offset >= until || total >= max_bytes {
                    return Ok(out);
                }
                total += bytes.len();
                out.push((offset, bytes));
            }
        }
        Ok(out)
    }

    /// The Raft position the stored state includes, as `commit` was given it.
    pub fn raft_state(&self) -> Result<Option<Vec<u8>>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(RAFT)?;
        Ok(table.get(RAFT_APPLIED)?.map(|value| value.value().to_vec()))
    }

    pub fn snapshot(&self, stream_id: u64, offset: u64) -> Result<Option<Bytes>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(SNAPSHOTS)?;
        Ok(table
            .get((stream_id, offset))?
            .map(|value| Bytes::copy_from_slice(value.value())))
    }
}

/// Deletes a stream's record chunks wholly below `limit` (the transaction's pending chunk of
/// the stream is written first). A chunk that straddles `limit` is kept whole.
fn drop_records_below(
    records: &mut redb::Table<(u64, u64), &[u8]>,
    pending: &mut HashMap<u64, codec::ChunkBuilder>,
    stream_id: u64,
    limit: u64,
) -> Result<(), StorageError> {
    if let Some(chunk) = pending.remove(&stream_id) {
        records.insert((stream_id, chunk.first()), chunk.encode().as_slice())?;
    }
    records.retain_in((stream_id, 0)..(stream_id, limit), |key, value| {
        key.1 + codec::chunk_data_len(value) > limit
    })?;
    Ok(())
}

#[cfg(test)]
mod tests;
