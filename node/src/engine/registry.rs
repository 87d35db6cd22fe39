//! What readers see: the committed state of every stream, published by the writer after each
//! batch is durable. Readers never look at the state machine itself, so they can never observe
//! a write that is not yet fsynced.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;

use crate::machine::{BucketState, Effect, StreamMeta, StreamPath};
use crate::storage::Record;

/// Recent records of a stream kept in memory so tail readers (long-poll, SSE fan-out) do not
/// go to storage. It always covers a contiguous range ending at the tail.
#[derive(Default)]
struct TailCache {
    records: VecDeque<Record>,
    bytes: usize,
}

const CACHE_BYTES_PER_STREAM: usize = 256 * 1024;

pub struct StreamHandle {
    pub id: u64,
    meta: RwLock<Arc<StreamMeta>>,
    /// Bumped on every publish; waiters (long-poll, SSE) subscribe to it.
    version: watch::Sender<u64>,
    removed: AtomicBool,
    /// The latest read of a TTL stream, ahead of what the machine knows until the touch lands.
    last_read_ms: AtomicU64,
    cache: Mutex<TailCache>,
}

impl StreamHandle {
    fn new(meta: StreamMeta) -> Self {
        let (version, _) = watch::channel(0);
        Self {
            id: meta.id,
            last_read_ms: AtomicU64::new(meta.last_access_ms),
            meta: RwLock::new(Arc::new(meta)),
            version,
            removed: AtomicBool::new(false),
            cache: Mutex::new(TailCache::default()),
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

    pub fn last_access_ms(&self, meta: &StreamMeta) -> u64 {
        meta.last_access_ms
            .max(self.last_read_ms.load(Ordering::Relaxed))
    }

    pub fn note_read(&self, now_ms: u64) {
        self.last_read_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// Cached records overlapping `[from, until)`, or `None` when the cache does not reach back
    /// to `from`.
    pub fn cached(&self, from: u64, until: u64, max_bytes: usize) -> Option<Vec<Record>> {
        let cache = self.cache.lock();
        let first = cache.records.front()?.0;
        if from < first {
            return None;
        }
        let mut out = Vec::new();
        let mut total = 0;
        for (start, bytes) in &cache.records {
            let end = start + bytes.len() as u64;
            if end <= from {
                continue;
            }
            if *start >= until {
                break;
            }
            total += bytes.len();
            out.push((*start, bytes.clone()));
            if total >= max_bytes {
                break;
            }
        }
        Some(out)
    }

    fn push_cached(&self, offset: u64, bytes: Bytes, budget: &AtomicUsize) {
        let mut cache = self.cache.lock();
        let len = bytes.len();
        if len > CACHE_BYTES_PER_STREAM || budget.load(Ordering::Relaxed) < len {
            budget.fetch_add(cache.bytes, Ordering::Relaxed);
            cache.records.clear();
            cache.bytes = 0;
            return;
        }
        budget.fetch_sub(len, Ordering::Relaxed);
        cache.records.push_back((offset, bytes));
        cache.bytes += len;
        while cache.bytes > CACHE_BYTES_PER_STREAM {
            if let Some((_, old)) = cache.records.pop_front() {
                cache.bytes -= old.len();
                budget.fetch_add(old.len(), Ordering::Relaxed);
            }
        }
    }

    fn clear_cache(&self, budget: &AtomicUsize) {
        let mut cache = self.cache.lock();
        budget.fetch_add(cache.bytes, Ordering::Relaxed);
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
}

pub struct Registry {
    maps: RwLock<Maps>,
    cache_budget: AtomicUsize,
}

impl Registry {
    pub fn new(cache_bytes: usize) -> Self {
        Self {
            maps: RwLock::new(Maps::default()),
            cache_budget: AtomicUsize::new(cache_bytes),
        }
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

    /// Replaces everything (start-up, or recovery after a failed commit).
    pub fn reset<'a>(
        &self,
        buckets: impl Iterator<Item = (&'a String, &'a BucketState)>,
        streams: impl Iterator<Item = &'a StreamMeta>,
    ) {
        let mut maps = self.maps.write();
        for handle in maps.by_id.values() {
            handle.removed.store(true, Ordering::Release);
            handle.clear_cache(&self.cache_budget);
            handle.notify();
        }
        *maps = Maps::default();
        maps.buckets = buckets.map(|(k, v)| (k.clone(), v.clone())).collect();
        for meta in streams {
            let handle = Arc::new(StreamHandle::new(meta.clone()));
            if !meta.soft_deleted || !maps.by_path.contains_key(&meta.path) {
                maps.by_path.insert(meta.path.clone(), handle.clone());
            }
            maps.by_id.insert(meta.id, handle);
        }
    }

    /// Publishes the effects of a durable batch and wakes the readers of changed streams.
    pub fn publish(&self, effects: Vec<Effect>) {
        let mut changed: Vec<Arc<StreamHandle>> = Vec::new();
        let mut records = Vec::new();
        {
            let mut maps = self.maps.write();
            for effect in effects {
                match effect {
                    Effect::PutStream(meta) => {
                        let meta = *meta;
                        if let Some(handle) = maps.by_id.get(&meta.id).cloned() {
                            if meta.retained_from > handle.meta.read().retained_from {
                                handle.clear_cache(&self.cache_budget);
                            }
                            *handle.meta.write() = Arc::new(meta);
                            changed.push(handle);
                        } else {
                            let handle = Arc::new(StreamHandle::new(meta.clone()));
                            maps.by_path.insert(meta.path.clone(), handle.clone());
                            maps.by_id.insert(meta.id, handle.clone());
                            changed.push(handle);
                        }
                    }
                    Effect::DeleteStream { id, path } => {
                        if let Some(handle) = maps.by_id.remove(&id) {
                            handle.removed.store(true, Ordering::Release);
                            handle.clear_cache(&self.cache_budget);
                            changed.push(handle);
                        }
                        if maps.by_path.get(&path).is_some_and(|h| h.id == id) {
                            maps.by_path.remove(&path);
                        }
                    }
                    Effect::PutBucket { bucket, state } => {
                        maps.buckets.insert(bucket, state);
                    }
                    Effect::PutRecord {
                        stream_id,
                        offset,
                        bytes,
                    } => records.push((stream_id, offset, bytes)),
                    _ => {}
                }
            }
            for (stream_id, offset, bytes) in records {
                if let Some(handle) = maps.by_id.get(&stream_id) {
                    handle.push_cached(offset, bytes, &self.cache_budget);
                }
            }
        }
        changed.sort_by_key(|h| h.id);
        changed.dedup_by_key(|h| h.id);
        for handle in changed {
            handle.notify();
        }
    }
}
