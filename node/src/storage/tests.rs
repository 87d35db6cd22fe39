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
