//! A whole state file as one value: what a Raft snapshot carries from a leader to a follower
//! that is too far behind to catch up from the log.

use redb::{ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::{
    BUCKETS, COLD, META, PRODUCERS, RAFT, RECORDS, SNAPSHOTS, STREAMS, SUBSCRIPTIONS, StorageError,
    Store,
};

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct GroupDump {
    meta: Vec<(String, u64)>,
    buckets: Vec<(String, u8)>,
    streams: Vec<(u64, Vec<u8>)>,
    producers: Vec<((u64, String), Vec<u8>)>,
    records: Vec<((u64, u64), Vec<u8>)>,
    snapshots: Vec<((u64, u64), Vec<u8>)>,
    raft: Vec<(String, Vec<u8>)>,
    cold: Vec<((u64, u64), Vec<u8>)>,
    subscriptions: Vec<((String, String), Vec<u8>)>,
}

fn corrupt(e: impl std::fmt::Display) -> StorageError {
    StorageError::Corrupt(e.to_string())
}

impl GroupDump {
    pub fn encode(&self) -> Result<Vec<u8>, StorageError> {
        postcard::to_allocvec(self).map_err(corrupt)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, StorageError> {
        postcard::from_bytes(bytes).map_err(corrupt)
    }
}

impl Store {
    /// A consistent view of the file, for `dump` to read while writes go on.
    pub fn begin_read(&self) -> Result<ReadTransaction, StorageError> {
        Ok(self.db.begin_read()?)
    }

    /// Everything the view holds.
    pub fn dump(txn: &ReadTransaction) -> Result<GroupDump, StorageError> {
        let mut dump = GroupDump::default();
        for row in txn.open_table(META)?.iter()? {
            let (key, value) = row?;
            dump.meta.push((key.value().to_owned(), value.value()));
        }
        for row in txn.open_table(BUCKETS)?.iter()? {
            let (key, value) = row?;
            dump.buckets.push((key.value().to_owned(), value.value()));
        }
        for row in txn.open_table(STREAMS)?.iter()? {
            let (key, value) = row?;
            dump.streams.push((key.value(), value.value().to_vec()));
        }
        for row in txn.open_table(PRODUCERS)?.iter()? {
            let (key, value) = row?;
            let (stream, producer) = key.value();
            dump.producers
                .push(((stream, producer.to_owned()), value.value().to_vec()));
        }
        for row in txn.open_table(RECORDS)?.iter()? {
            let (key, value) = row?;
            dump.records.push((key.value(), value.value().to_vec()));
        }
        for row in txn.open_table(SNAPSHOTS)?.iter()? {
            let (key, value) = row?;
            dump.snapshots.push((key.value(), value.value().to_vec()));
        }
        for row in txn.open_table(RAFT)?.iter()? {
            let (key, value) = row?;
            dump.raft
                .push((key.value().to_owned(), value.value().to_vec()));
        }
        for row in txn.open_table(COLD)?.iter()? {
            let (key, value) = row?;
            dump.cold.push((key.value(), value.value().to_vec()));
        }
        for row in txn.open_table(SUBSCRIPTIONS)?.iter()? {
            let (key, value) = row?;
            let (bucket, id) = key.value();
            dump.subscriptions
                .push(((bucket.to_owned(), id.to_owned()), value.value().to_vec()));
        }
        Ok(dump)
    }

    /// Replaces the whole file with `dump` and makes it durable.
    pub fn replace_with(&self, dump: &GroupDump, raft: &[u8]) -> Result<(), StorageError> {
        let txn = self.db.begin_write()?;
        {
            clear(&txn, META)?;
            clear(&txn, BUCKETS)?;
            clear(&txn, STREAMS)?;
            clear(&txn, PRODUCERS)?;
            clear(&txn, RECORDS)?;
            clear(&txn, SNAPSHOTS)?;
            clear(&txn, RAFT)?;
            clear(&txn, COLD)?;
            clear(&txn, SUBSCRIPTIONS)?;
            let mut meta = txn.open_table(META)?;
            for (key, value) in &dump.meta {
                meta.insert(key.as_str(), *value)?;
            }
            let mut buckets = txn.open_table(BUCKETS)?;
            for (key, value) in &dump.buckets {
                buckets.insert(key.as_str(), *value)?;
            }
            let mut streams = txn.open_table(STREAMS)?;
            for (key, value) in &dump.streams {
                streams.insert(*key, value.as_slice())?;
            }
            let mut producers = txn.open_table(PRODUCERS)?;
            for ((stream, producer), value) in &dump.producers {
                producers.insert((*stream, producer.as_str()), value.as_slice())?;
            }
            let mut records = txn.open_table(RECORDS)?;
            for (key, value) in &dump.records {
                records.insert(*key, value.as_slice())?;
            }
            let mut snapshots = txn.open_table(SNAPSHOTS)?;
            for (key, value) in &dump.snapshots {
                snapshots.insert(*key, value.as_slice())?;
            }
            let mut cold = txn.open_table(COLD)?;
            for (key, value) in &dump.cold {
                cold.insert(*key, value.as_slice())?;
            }
            let mut subscriptions = txn.open_table(SUBSCRIPTIONS)?;
            for ((bucket, id), value) in &dump.subscriptions {
                subscriptions.insert((bucket.as_str(), id.as_str()), value.as_slice())?;
            }
            let mut table = txn.open_table(RAFT)?;
            table.insert(super::RAFT_APPLIED, raft)?;
        }
        txn.commit()?;
        Ok(())
    }
}

fn clear<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::WriteTransaction,
    table: TableDefinition<K, V>,
) -> Result<(), StorageError> {
    txn.delete_table(table)?;
    txn.open_table(table)?;
    Ok(())
}
