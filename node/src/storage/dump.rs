//! A whole state file as one value: what a Raft snapshot carries from a leader to a follower
//! that is too far behind to catch up from the log.

use bytes::Bytes;
use redb::{ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::{
    BUCKETS, COLD, META, PRODUCERS, RAFT, RECORDS, SNAPSHOTS, STREAMS, SUBSCRIPTIONS, StorageError,
    Store,
};

/// Values are `Bytes`, which serde writes and reads as one byte string: as a `Vec<u8>` it went
/// element by element, which in a debug build took about a second per 10 MiB. Postcard
/// encodes both alike, so dumps made before read the same.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct GroupDump {
    meta: Vec<(String, u64)>,
    buckets: Vec<(String, u8)>,
    streams: Vec<(u64, Bytes)>,
    producers: Vec<((u64, String), Bytes)>,
    records: Vec<((u64, u64), Bytes)>,
    snapshots: Vec<((u64, u64), Bytes)>,
    raft: Vec<(String, Bytes)>,
    cold: Vec<((u64, u64), Bytes)>,
    subscriptions: Vec<((String, String), Bytes)>,
}

fn corrupt(e: impl std::fmt::Display) -> StorageError {
    StorageError::Corrupt(e.to_string())
}

impl GroupDump {
    pub fn encode(&self) -> Result<Vec<u8>, StorageError> {
        super::encode_sized(self).map_err(corrupt)
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
            dump.streams
                .push((key.value(), Bytes::copy_from_slice(value.value())));
        }
        for row in txn.open_table(PRODUCERS)?.iter()? {
            let (key, value) = row?;
            let (stream, producer) = key.value();
            dump.producers.push((
                (stream, producer.to_owned()),
                Bytes::copy_from_slice(value.value()),
            ));
        }
        for row in txn.open_table(RECORDS)?.iter()? {
            let (key, value) = row?;
            dump.records
                .push((key.value(), Bytes::copy_from_slice(value.value())));
        }
        for row in txn.open_table(SNAPSHOTS)?.iter()? {
            let (key, value) = row?;
            dump.snapshots
                .push((key.value(), Bytes::copy_from_slice(value.value())));
        }
        for row in txn.open_table(RAFT)?.iter()? {
            let (key, value) = row?;
            dump.raft.push((
                key.value().to_owned(),
                Bytes::copy_from_slice(value.value()),
            ));
        }
        for row in txn.open_table(COLD)?.iter()? {
            let (key, value) = row?;
            dump.cold
                .push((key.value(), Bytes::copy_from_slice(value.value())));
        }
        for row in txn.open_table(SUBSCRIPTIONS)?.iter()? {
            let (key, value) = row?;
            let (bucket, id) = key.value();
            dump.subscriptions.push((
                (bucket.to_owned(), id.to_owned()),
                Bytes::copy_from_slice(value.value()),
            ));
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
                streams.insert(*key, &value[..])?;
            }
            let mut producers = txn.open_table(PRODUCERS)?;
            for ((stream, producer), value) in &dump.producers {
                producers.insert((*stream, producer.as_str()), &value[..])?;
            }
            let mut records = txn.open_table(RECORDS)?;
            for (key, value) in &dump.records {
                records.insert(*key, &value[..])?;
            }
            let mut snapshots = txn.open_table(SNAPSHOTS)?;
            for (key, value) in &dump.snapshots {
                snapshots.insert(*key, &value[..])?;
            }
            let mut cold = txn.open_table(COLD)?;
            for (key, value) in &dump.cold {
                cold.insert(*key, &value[..])?;
            }
            let mut subscriptions = txn.open_table(SUBSCRIPTIONS)?;
            for ((bucket, id), value) in &dump.subscriptions {
                subscriptions.insert((bucket.as_str(), id.as_str()), &value[..])?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_made_when_its_values_were_vecs_reads_the_same() {
        // The shape of `GroupDump` before its values became `Bytes`.
        #[derive(Default, Serialize)]
        struct Before {
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
        let before = Before {
            meta: vec![("applied".into(), 9)],
            records: vec![((1, 0), vec![0, 1, 2, 255]), ((1, 4), vec![7; 300])],
            subscriptions: vec![(("b".into(), "s".into()), vec![42])],
            ..Before::default()
        };
        let encoded = postcard::to_allocvec(&before).unwrap();
        let dump = GroupDump::decode(&encoded).unwrap();
        assert_eq!(dump.records.len(), 2);
        assert_eq!(dump.records[0].1[..], [0, 1, 2, 255]);
        assert_eq!(dump.records[1].1[..], [7; 300]);
        assert_eq!(dump.subscriptions[0].1[..], [42]);
        assert_eq!(dump.encode().unwrap(), encoded, "the same bytes");
    }
}
