//! What readers see: the state of every stream as of the last durable batch, published by the
//! writer right after the batch's WAL fsync. Readers never look at the state machine itself, so
//! they can never observe a write that is not yet durable.
//!
//! Records reach redb a little later (the applier thread). Until they have, they are pinned in
//! the stream's tail cache, so every record is always readable from the cache or from redb.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;
use ursula_wire::cursor::Cursor;

use crate::machine::{BucketState, Effect, Machine, StreamMeta, StreamPath, Subscription};
use crate::storage::{ColdSegment, Record};

/// Records a stream keeps in memory beyond what must stay pinned.
const CACHE_BYTES_PER_STREAM: usize = 256 * 1024;

struct CachedRecord {
    offset: u64,
    bytes: Bytes,
    /// The WAL record it was written in; pinned until redb holds that record.
    seq: u64,
}

/// Recent records of a stream. It always covers a contiguous range that ends at the tail.
#[derive(Default)]
struct TailCache {
    records: VecDeque<CachedRecord>,
    bytes: usize,
}

pub struct StreamHandle {
    pub id: u64,
    meta: RwLock<Arc<StreamMeta>>,
    /// Bumped on every publish; waiters (long-poll, SSE) subscribe to it.
    version: watch::Sender<u64>,
    removed: AtomicBool,
    /// The latest read of a TTL stream, ahead of what the machine knows until the touch lands.
    last_read_ms: AtomicU64,
    /// The WAL record that last changed this stream.
    changed_seq: AtomicU64,
    cache: Mutex<TailCache>,
    /// The last live event rendered for this stream (see `Rendered`).
    rendered: Mutex<Option<Arc<Rendered>>>,
    /// Its cold segments, by `from`.
    cold: RwLock<BTreeMap<u64, ColdSegment>>,
}

/// A live read's event as the HTTP layer rendered it, kept for the next subscriber at the
/// same position: with many subscribers on one stream every new record would otherwise be
/// read, framed and formatted once per subscriber. The engine only stores it; `key` says
/// what it was rendered from, and a reader that asks with a different key renders its own.
pub struct Rendered {
    pub key: RenderKey,
    pub bytes: Bytes,
    /// The offset after the event's data.
    pub next: u64,
    /// Whether its control event is the closing one.
    pub closes: bool,
}

/// Everything a live event's bytes depend on besides the stream's immutable records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderKey {
    pub from: u64,
    pub tail: u64,
    pub closed: bool,
    pub cursor: Cursor,
    pub base64: bool,
    pub max_bytes: usize,
}

impl StreamHandle {
    fn new(meta: Arc<StreamMeta>, seq: u64) -> Self {
        let (version, _) = watch::channel(0);
        Self {
            id: meta.id,
            last_read_ms: AtomicU64::new(meta.last_access_ms),
            meta: RwLock::new(meta),
            version,
            removed: AtomicBool::new(false),
            changed_seq: AtomicU64::new(seq),
            cache: Mutex::new(TailCache::default()),
            rendered: Mutex::new(None),
            cold: RwLock::new(BTreeMap::new()),
        }
    }

    /// Whether the tail cache holds the record at `at`.
    pub fn caches(&self, at: u64) -> bool {
        let cache = self.cache.lock();
        let skip = cache
            .records
            .partition_point(|record| record.offset + record.bytes.len() as u64 <= at);
        cache
            .records
            .get(skip)
            .is_some_and(|record| record.offset <= at)
    }

    /// The cold segment holding offset `at`, if one does.
    pub fn cold_segment_at(&self, at: u64) -> Option<ColdSegment> {
        self.cold
            .read()
            .range(..=at)
            .next_back()
            .map(|(_, segment)| segment)
            .filter(|segment| segment.until > at)
            .cloned()
    }

    /// Where the first cold segment after `at` starts, if one does: local records end there.
    pub fn next_cold_from(&self, at: u64) -> Option<u64> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.cold
            .read()
            .range((Excluded(at), Unbounded))
            .next()
            .map(|(from, _)| *from)
    }

    /// Its oldest local records, from where to where, and its record bytes on local disk
    /// (see `machine::cold::local_range`).
    pub fn local_records(&self, meta: &StreamMeta) -> (u64, u64, u64) {
        let cold = self.cold.read();
        let (from, until) = crate::machine::cold::local_range(meta, &cold);
        (from, until, crate::machine::cold::local_bytes(meta, &cold))
    }

    /// The objects its cold segments are in.
    pub fn cold_keys(&self) -> Vec<Arc<str>> {
        self.cold
            .read()
            .values()
            .map(|segment| segment.key.clone())
            .collect()
    }

    /// The event last rendered for `key`, if that is what was last rendered.
    pub fn rendered(&self, key: &RenderKey) -> Option<Arc<Rendered>> {
        self.rendered
            .lock()
            .as_ref()
            .filter(|rendered| rendered.key == *key)
            .cloned()
    }

    /// Keeps `rendered` for the stream's other live readers; with none, keeps nothing, so
    /// that a stream followed by one reader does not hold its last event in memory.
    pub fn keep_rendered(&self, rendered: Arc<Rendered>) {
        let shared = self.version.receiver_count() > 1;
        *self.rendered.lock() = shared.then_some(rendered);
    }

    /// Called by a live reader as it goes, while it still counts as one: with at most one
    /// reader left, the kept event is let go.
    pub fn reader_leaving(&self) {
        if self.version.receiver_count() <= 2 {
            *self.rendered.lock() = None;
        }
    }

    pub fn meta(&self) -> Arc<StreamMeta> {
        self.meta.read().clone()
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    pub fn changed_seq(&self) -> u64 {
        self.changed_seq.load(Ordering::Acquire)
    }

    pub fn last_access_ms(&self, meta: &StreamMeta) -> u64 {
        meta.last_access_ms
            .max(self.last_read_ms.load(Ordering::Relaxed))
    }

    pub fn note_read(&self, now_ms: u64) {
        self.last_read_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// The first offset the cache holds, and its records overlapping `[from, until)` (from
    /// that first offset on, when `from` is below it).
    pub fn cached(&self, from: u64, until: u64, max_bytes: usize) -> Option<(u64, Vec<Record>)> {
        let cache = self.cache.lock();
        let first = cache.records.front()?.offset;
        let mut out = Vec::new();
        let mut total = 0;
        // Live readers ask for the last few records of a cache that can hold thousands: find
        // the first record ending past `from` by bisection (records are in offset order).
        let skip = cache
            .records
            .partition_point(|record| record.offset + record.bytes.len() as u64 <= from);
        for record in cache.records.range(skip..) {
            if record.offset >= until || total >= max_bytes {
                break;
            }
            total += record.bytes.len();
            out.push((record.offset, record.bytes.clone()));
        }
        Some((first, out))
    }

    fn push_cached(&self, record: CachedRecord, registry: &Registry) {
        let mut cache = self.cache.lock();
        registry
            .cache_budget
            .fetch_sub(record.bytes.len() as isize, Ordering::Relaxed);
        cache.bytes += record.bytes.len();
        cache.records.push_back(record);
        Self::trim(&mut cache, registry);
    }

    /// Evicts the oldest records while over the per-stream or global budget, never one that
    /// redb does not hold yet.
    fn trim(cache: &mut TailCache, registry: &Registry) {
        let stored = registry.stored_seq();
        while cache.bytes > CACHE_BYTES_PER_STREAM
            || registry.cache_budget.load(Ordering::Relaxed) < 0
        {
            match cache.records.front() {
                Some(oldest) if oldest.seq <= stored => Self::pop_oldest(cache, registry),
                _ => break,
            }
        }
    }

    /// Drops records wholly below `offset` (after a retention advance).
    fn drop_below(&self, offset: u64, registry: &Registry) {
        *self.rendered.lock() = None;
        let mut cache = self.cache.lock();
        while let Some(oldest) = cache.records.front() {
            if oldest.offset + oldest.bytes.len() as u64 > offset {
                break;
            }
            Self::pop_oldest(&mut cache, registry);
        }
    }

    fn pop_oldest(cache: &mut TailCache, registry: &Registry) {
        if let Some(oldest) = cache.records.pop_front() {
            cache.bytes -= oldest.bytes.len();
            registry
                .cache_budget
                .fetch_add(oldest.bytes.len() as isize, Ordering::Relaxed);
        }
    }

    fn clear_cache(&self, registry: &Registry) {
        *self.rendered.lock() = None;
        let mut cache = self.cache.lock();
        registry
            .cache_budget
            .fetch_add(cache.bytes as isize, Ordering::Relaxed);
        cache.records.clear();
        cache.bytes = 0;
    }

    fn notify(&self) {
        self.version.send_modify(|v| *v += 1);
    }
}

#[derive(Default)]
struct Maps {
    by_path: HashMap<StreamPath, Arc<StreamHandle>>,
    by_id: HashMap<u64, Arc<StreamHandle>>,
    buckets: HashMap<String, BucketState>,
    /// By bucket, then ID.
    subscriptions: BTreeMap<(String, String), Arc<Subscription>>,
}

pub struct Registry {
    maps: RwLock<Maps>,
    cache_budget: AtomicIsize,
    /// The last WAL record redb holds (readable by new read transactions).
    stored: watch::Sender<u64>,
    /// The applier's thread, woken when a reader waits for redb.
    applier: parking_lot::Mutex<Option<std::thread::Thread>>,
    /// A reader waits for redb: the applier should commit without finishing its interval.
    hurry: std::sync::atomic::AtomicBool,
    /// Bumped whenever a subscription changes; the leader's deliverer waits on it.
    subscriptions_changed: watch::Sender<u64>,
    /// The subscriptions changed since the deliverer last took them.
    changed_subscriptions: Mutex<std::collections::HashSet<(String, String)>>,
}

impl Registry {
    pub fn new(cache_bytes: usize, stored_seq: u64) -> Self {
        Self {
            maps: RwLock::new(Maps::default()),
            cache_budget: AtomicIsize::new(cache_bytes as isize),
            stored: watch::channel(stored_seq).0,
            applier: parking_lot::Mutex::new(None),
            hurry: std::sync::atomic::AtomicBool::new(false),
            subscriptions_changed: watch::channel(0).0,
            changed_subscriptions: Mutex::new(Default::default()),
        }
    }

    /// The subscriptions changed (or deleted) since the last call.
    pub fn take_changed_subscriptions(&self) -> Vec<(String, String)> {
        let mut changed = self.changed_subscriptions.lock();
        if changed.is_empty() {
            return Vec::new();
        }
        changed.drain().collect()
    }

    pub fn subscription(&self, bucket: &str, id: &str) -> Option<Arc<Subscription>> {
        let key = (bucket.to_owned(), id.to_owned());
        self.maps.read().subscriptions.get(&key).cloned()
    }

    pub fn subscriptions(&self) -> Vec<Arc<Subscription>> {
        self.maps.read().subscriptions.values().cloned().collect()
    }

    /// Changes whenever a subscription does.
    pub fn watch_subscriptions(&self) -> watch::Receiver<u64> {
        self.subscriptions_changed.subscribe()
    }

    /// The tail of the live stream at `path`, as readers see it.
    pub fn tail_of(&self, path: &StreamPath) -> Option<u64> {
        let handle = self.stream(path)?;
        let meta = handle.meta();
        (!meta.soft_deleted).then_some(meta.tail)
    }

    /// Called on the applier's thread as it starts, so that `wait_stored` can wake it.
    pub fn register_applier(&self) {
        *self.applier.lock() = Some(std::thread::current());
    }

    /// Whether a reader has waited for redb since the last call (and forgets it).
    pub fn take_hurry(&self) -> bool {
        self.hurry.swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    pub fn stream(&self, path: &StreamPath) -> Option<Arc<StreamHandle>> {
        self.maps.read().by_path.get(path).cloned()
    }

    pub fn stream_by_id(&self, id: u64) -> Option<Arc<StreamHandle>> {
        self.maps.read().by_id.get(&id).cloned()
    }

    pub fn bucket(&self, bucket: &str) -> Option<BucketState> {
        self.maps.read().buckets.get(bucket).cloned()
    }

    pub fn stored_seq(&self) -> u64 {
        *self.stored.borrow()
    }

    /// Waits until redb holds WAL record `seq`.
    pub async fn wait_stored(&self, seq: u64) {
        let mut stored = self.stored.subscribe();
        if *stored.borrow() >= seq {
            return;
        }
        // The applier gathers for a while before it commits; nobody should wait that out.
        self.hurry.store(true, std::sync::atomic::Ordering::Release);
        if let Some(applier) = self.applier.lock().as_ref() {
            applier.unpark();
        }
        let _ = stored.wait_for(|s| *s >= seq).await;
    }

    /// Called by the applier once redb holds everything up to `seq`, with the streams whose
    /// records it just wrote: records pinned while redb lacked them may now leave a cache that
    /// is over budget. Without this a stream written in a burst and then left alone would keep
    /// its whole burst in memory until its next write.
    pub fn set_stored(&self, seq: u64, wrote_to: &[u64]) {
        self.stored.send_replace(seq);
        for &id in wrote_to {
            if let Some(handle) = self.stream_by_id(id) {
                StreamHandle::trim(&mut handle.cache.lock(), self);
            }
        }
    }

    /// Every stream it holds, deleted or not.
    pub fn handles(&self) -> Vec<Arc<StreamHandle>> {
        self.maps.read().by_id.values().cloned().collect()
    }

    /// Replaces everything (start-up); redb holds all of it.
    pub fn reset(&self, machine: &Machine, mut cold: HashMap<u64, Vec<ColdSegment>>) {
        let mut maps = self.maps.write();
        for handle in maps.by_id.values() {
            handle.removed.store(true, Ordering::Release);
            handle.clear_cache(self);
            handle.notify();
        }
        *maps = Maps::default();
        maps.buckets = machine
            .buckets()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        maps.subscriptions = machine
            .subscriptions()
            .map(|sub| ((sub.bucket.clone(), sub.id.clone()), Arc::new(sub.clone())))
            .collect();
        let seq = self.stored_seq();
        for meta in machine.streams().map(|s| &s.meta) {
            let handle = Arc::new(StreamHandle::new(Arc::new(meta.clone()), seq));
            *handle.cold.write() = cold
                .remove(&meta.id)
                .unwrap_or_default()
                .into_iter()
                .map(|segment| (segment.from, segment))
                .collect();
            if !meta.soft_deleted || !maps.by_path.contains_key(&meta.path) {
                maps.by_path.insert(meta.path.clone(), handle.clone());
            }
            maps.by_id.insert(meta.id, handle);
        }
        self.changed_subscriptions
            .lock()
            .extend(maps.subscriptions.keys().cloned());
        drop(maps);
        self.subscriptions_changed.send_modify(|v| *v += 1);
    }

    /// What a stream gains before its new metadata is published: a record for the tail cache,
    /// or a cold segment.
    fn add_data(&self, handle: &StreamHandle, effect: &Effect, seq: u64) {
        match effect {
            Effect::PutRecord { offset, bytes, .. } => {
                let record = CachedRecord {
                    offset: *offset,
                    bytes: bytes.clone(),
                    seq,
                };
                handle.push_cached(record, self);
            }
            Effect::PutColdSegment {
                from,
                until,
                first,
                key,
                ..
            } => {
                let segment = ColdSegment {
                    from: *from,
                    until: *until,
                    first: *first,
                    key: key.clone(),
                };
                handle.cold.write().insert(*from, segment);
            }
            _ => {}
        }
    }

    /// The stream a record or cold segment belongs to.
    fn data_stream(effect: &Effect) -> Option<u64> {
        match effect {
            Effect::PutRecord { stream_id, .. } | Effect::PutColdSegment { stream_id, .. } => {
                Some(*stream_id)
            }
            _ => None,
        }
    }

    /// Publishes the effects of WAL record `seq`, now durable, and wakes the readers of the
    /// streams it changed.
    pub fn publish(&self, effects: &[Effect], seq: u64) {
        let mut changed: Vec<Arc<StreamHandle>> = Vec::new();
        let mut subscriptions_changed = false;
        {
            let mut maps = self.maps.write();
            // Records and cold segments before metadata: a reader holds a stream's handle
            // without the lock, and one that sees a new tail must find what lies below it.
            for effect in effects {
                if let Some(stream_id) = Self::data_stream(effect)
                    && let Some(handle) = maps.by_id.get(&stream_id)
                {
                    self.add_data(handle, effect, seq);
                }
            }
            // Streams this batch creates (their records and segments are added below).
            let mut created = Vec::new();
            for effect in effects {
                match effect {
                    Effect::PutStream(meta) => {
                        let meta = meta.clone();
                        let handle = match maps.by_id.get(&meta.id).cloned() {
                            Some(handle) => {
                                let retained_from = handle.meta.read().retained_from;
                                if meta.retained_from > retained_from {
                                    handle.drop_below(meta.retained_from, self);
                                }
                                *handle.meta.write() = meta;
                                handle
                            }
                            None => {
                                created.push(meta.id);
                                let handle = Arc::new(StreamHandle::new(meta.clone(), seq));
                                maps.by_path.insert(meta.path.clone(), handle.clone());
                                maps.by_id.insert(meta.id, handle.clone());
                                handle
                            }
                        };
                        handle.changed_seq.store(seq, Ordering::Release);
                        changed.push(handle);
                    }
                    Effect::DeleteStream { id, path } => {
                        if let Some(handle) = maps.by_id.remove(id) {
                            handle.removed.store(true, Ordering::Release);
                            handle.clear_cache(self);
                            changed.push(handle);
                        }
                        if maps.by_path.get(path).is_some_and(|h| h.id == *id) {
                            maps.by_path.remove(path);
                        }
                    }
                    Effect::PutBucket { bucket, state } => {
                        maps.buckets.insert(bucket.clone(), state.clone());
                    }
                    Effect::PutSubscription(sub) => {
                        let key = (sub.bucket.clone(), sub.id.clone());
                        self.changed_subscriptions.lock().insert(key.clone());
                        maps.subscriptions.insert(key, sub.clone());
                        subscriptions_changed = true;
                    }
                    Effect::DeleteSubscription { bucket, id } => {
                        let key = (bucket.clone(), id.clone());
                        maps.subscriptions.remove(&key);
                        self.changed_subscriptions.lock().insert(key);
                        subscriptions_changed = true;
                    }
                    Effect::DeleteRecordsBelow { stream_id, offset } => {
                        if let Some(handle) = maps.by_id.get(stream_id) {
                            handle
                                .cold
                                .write()
                                .retain(|_, segment| segment.until > *offset);
                        }
                    }
                    _ => {}
                }
            }
            // The streams created by this batch get their records and segments last: nobody
            // can look them up before the lock is released.
            for effect in effects.iter().filter(|_| !created.is_empty()) {
                if let Some(stream_id) = Self::data_stream(effect)
                    && created.contains(&stream_id)
                    && let Some(handle) = maps.by_id.get(&stream_id)
                {
                    self.add_data(handle, effect, seq);
                }
            }
        }
        if subscriptions_changed {
            self.subscriptions_changed.send_modify(|v| *v += 1);
        }
        changed.sort_by_key(|h| h.id);
        changed.dedup_by_key(|h| h.id);
        for handle in changed {
            handle.notify();
        }
    }
}

#[cfg(test)]
mod tests;
