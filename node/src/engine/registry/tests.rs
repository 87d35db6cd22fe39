use std::time::{Duration, Instant};

use super::*;

/// A rendered event is kept only while another live reader could use it.
#[test]
fn a_rendered_event_is_kept_only_for_other_readers() {
    let meta = StreamMeta::for_tests(10);
    let handle = StreamHandle::new(Arc::new(meta), 0);
    let key = RenderKey {
        from: 0,
        tail: 10,
        closed: false,
        cursor: Cursor::Number(7),
        base64: false,
        max_bytes: 1024,
    };
    let render = || {
        Arc::new(Rendered {
            key: key.clone(),
            bytes: Bytes::from_static(b"event"),
            next: 10,
            closes: false,
        })
    };
    let _alone = handle.subscribe();
    handle.keep_rendered(render());
    assert!(handle.rendered(&key).is_none(), "one reader: nothing kept");
    let _another = handle.subscribe();
    handle.keep_rendered(render());
    assert!(handle.rendered(&key).is_some(), "two readers: kept");
    let elsewhere = RenderKey {
        from: 3,
        ..key.clone()
    };
    assert!(
        handle.rendered(&elsewhere).is_none(),
        "another key: not this"
    );
    handle.reader_leaving();
    drop(_another);
    assert!(
        handle.rendered(&key).is_none(),
        "one reader left: nothing kept"
    );
}

/// A burst pinned while redb lacked it leaves the cache once redb has it, even if the stream
/// is never written again.
#[test]
fn a_burst_beyond_the_cache_budget_leaves_it_once_stored() {
    let registry = Registry::new(1 << 30, 0);
    let record = Bytes::from(vec![b'x'; 64 * 1024]);
    let count = 3 * CACHE_BYTES_PER_STREAM / record.len();
    let mut tail = 0;
    for seq in 1..=count as u64 {
        let mut effects = Vec::new();
        if seq == 1 {
            effects.push(Effect::PutStream(Arc::new(StreamMeta::for_tests(0))));
        }
        effects.push(Effect::PutRecord {
            stream_id: 1,
            offset: tail,
            bytes: record.clone(),
        });
        tail += record.len() as u64;
        registry.publish(&effects, seq);
    }
    let handle = registry.stream_by_id(1).unwrap();
    let first_cached = || handle.cached(0, tail, usize::MAX).unwrap().0;
    assert_eq!(first_cached(), 0, "nothing is in redb yet: all pinned");

    registry.set_stored(count as u64, &[1]);
    let kept = tail - first_cached();
    assert!(
        kept <= CACHE_BYTES_PER_STREAM as u64,
        "{kept} bytes kept, over the budget of {CACHE_BYTES_PER_STREAM}"
    );
    assert!(handle.caches(tail - 1), "the newest records stay");
}

/// A reader waiting for redb wakes the applier out of its gathering interval.
#[tokio::test]
async fn a_reader_waiting_for_redb_hurries_the_applier() {
    let registry = Arc::new(Registry::new(1 << 20, 0));
    let applier_side = registry.clone();
    let (parked, is_parked) = std::sync::mpsc::channel();
    let applier = std::thread::spawn(move || {
        applier_side.register_applier();
        let _ = parked.send(());
        let started = Instant::now();
        // As the applier does: gather for up to a minute unless hurried.
        while !applier_side.take_hurry() && started.elapsed() < Duration::from_secs(60) {
            std::thread::park_timeout(Duration::from_secs(60));
        }
        applier_side.set_stored(7, &[]);
        started.elapsed()
    });
    is_parked.recv().unwrap();
    registry.wait_stored(7).await;
    let gathered = applier.join().unwrap();
    assert!(gathered < Duration::from_secs(30), "{gathered:?}");
    assert!(!registry.take_hurry(), "the applier took the request");
    // Nothing to wait for: no hurry.
    registry.wait_stored(5).await;
    assert!(!registry.take_hurry());
}
