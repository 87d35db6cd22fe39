use bytes::Bytes;

use super::*;
use crate::machine::{Effect, Limits};

fn record(stream_id: u64, offset: u64, text: &str) -> Effect {
    Effect::PutRecord {
        stream_id,
        offset,
        bytes: Bytes::copy_from_slice(text.as_bytes()),
    }
}

fn texts(records: &[Record]) -> Vec<(u64, String)> {
    records
        .iter()
        .map(|(o, b)| (*o, String::from_utf8_lossy(b).into_owned()))
        .collect()
}

#[test]
fn records_read_back_across_chunks_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store
        .commit(
            &[record(1, 0, "ab"), record(1, 2, "cde"), record(2, 0, "zz")],
            1,
            false,
            None,
        )
        .unwrap();
    store
        .commit(&[record(1, 5, "f"), record(1, 6, "gh")], 2, true, None)
        .unwrap();
    let all = store.read_records(1, 0, u64::MAX, usize::MAX).unwrap();
    assert_eq!(
        texts(&all),
        vec![
            (0, "ab".into()),
            (2, "cde".into()),
            (5, "f".into()),
            (6, "gh".into())
        ]
    );
    // From the middle of a record: that record, then the rest.
    let middle = store.read_records(1, 3, 6, usize::MAX).unwrap();
    assert_eq!(texts(&middle), vec![(2, "cde".into()), (5, "f".into())]);
    // A byte budget stops at whole records, returning at least one.
    assert_eq!(store.read_records(1, 0, u64::MAX, 1).unwrap().len(), 1);
    assert_eq!(
        texts(&store.read_records(2, 0, 2, 100).unwrap()),
        vec![(0, "zz".into())]
    );

    store
        .commit(
            &[Effect::DeleteRecordsBelow {
                stream_id: 1,
                offset: 6,
            }],
            3,
            false,
            None,
        )
        .unwrap();
    // The chunk holding offsets 0..5 is gone; the one straddling 6 stays whole.
    assert_eq!(
        texts(&store.read_records(1, 0, u64::MAX, usize::MAX).unwrap()),
        vec![(5, "f".into()), (6, "gh".into())]
    );
    store
        .commit(
            &[Effect::DeleteStream {
                id: 1,
                path: crate::machine::StreamPath::new("b", "s"),
            }],
            4,
            true,
            None,
        )
        .unwrap();
    assert!(
        store
            .read_records(1, 0, u64::MAX, usize::MAX)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .read_records(2, 0, u64::MAX, usize::MAX)
            .unwrap()
            .len(),
        1
    );
    drop(store);
    let reopened = Store::open(dir.path()).unwrap();
    let (_, applied) = reopened.load(Limits::default()).unwrap();
    assert_eq!(applied, 4);
}

/// One transaction's appends to a stream are split into rows of about `MAX_CHUNK_BYTES`, so
/// that a read of a page copies about that much, not the whole transaction's worth.
#[test]
fn a_large_transaction_is_stored_in_bounded_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let record_len = 60 * 1024u64;
    let effects: Vec<Effect> = (0..50)
        .map(|i| Effect::PutRecord {
            stream_id: 7,
            offset: i * record_len,
            bytes: Bytes::from(vec![b'a' + (i % 26) as u8; record_len as usize]),
        })
        .collect();
    store.commit(&effects, 1, true, None).unwrap();
    let txn = store.db.begin_read().unwrap();
    let table = txn.open_table(RECORDS).unwrap();
    let rows: Vec<u64> = table
        .iter()
        .unwrap()
        .map(|row| codec::chunk_data_len(row.unwrap().1.value()))
        .collect();
    assert!(rows.len() >= 10, "{} rows", rows.len());
    assert!(
        rows.iter().all(|&len| len <= MAX_CHUNK_BYTES + record_len),
        "{rows:?}"
    );
    let all = store.read_records(7, 0, u64::MAX, usize::MAX).unwrap();
    assert_eq!(all.len(), 50);
    assert!(all.iter().enumerate().all(|(i, (offset, bytes))| {
        *offset == i as u64 * record_len && bytes[0] == b'a' + (i % 26) as u8
    }));
    // A page from the middle reads a few rows, starting with the one holding its offset.
    let page = store
        .read_records(7, 20 * record_len + 5, u64::MAX, 1 << 20)
        .unwrap();
    assert_eq!(page[0].0, 20 * record_len);
    assert!(page.len() <= 18, "{}", page.len());
}
