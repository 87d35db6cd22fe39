//! The cold tier's object storage: where a stream's older records live once they have left
//! local disk.
//!
//! A group's leader writes a stream's oldest local records into one object (a *segment*) and
//! then proposes `Command::ColdFlush` naming it (`engine::cold`). Objects are named after what
//! they hold, `{prefix}/g{group}/s{stream}/{first}-{until}-{random}`: the random part makes
//! every upload a new object, so a sweep that listed an object before it was written again
//! can never delete the copy a segment refers to. Nothing but the sweep deletes objects, and it
//! deletes only those no applied segment refers to.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parking_lot::Mutex;

use crate::config::ColdConfig;
use crate::storage::{ChunkBuilder, Record, decode_chunk};

/// The first bytes of every segment object: its format, so that a later one can change it.
const MAGIC: &[u8; 4] = b"USG1";

#[derive(Debug, thiserror::Error)]
pub enum ColdError {
    #[error("object storage: {0}")]
    Store(#[from] object_store::Error),
    #[error("cold object {key} is not a segment this node can read: {message}")]
    Corrupt { key: String, message: String },
    #[error("storage.cold.url {0:?} names no bucket or directory")]
    Url(String),
}

/// An object a sweep may consider: its name and when it was last written.
pub struct Listed {
    pub key: String,
    pub modified_ms: i64,
}

pub struct ColdStore {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    cache: Mutex<SegmentCache>,
    /// Fetches in progress: readers that want the same object at once share one GET.
    fetching: Mutex<HashMap<String, Arc<FetchCell>>>,
    pub config: ColdConfig,
}

type FetchCell = tokio::sync::OnceCell<Arc<Vec<Record>>>;

impl ColdStore {
    pub fn open(config: &ColdConfig) -> Result<Self, ColdError> {
        // The object store's HTTPS client takes the process's TLS provider; an error means
        // one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (store, prefix): (Arc<dyn ObjectStore>, String) =
            if let Some(rest) = config.url.strip_prefix("s3://") {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(ColdError::Url(config.url.clone()));
                }
                let mut builder = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_allow_http(config.allow_http);
                if let Some(endpoint) = &config.endpoint {
                    builder = builder.with_endpoint(endpoint);
                }
                if let Some(region) = &config.region {
                    builder = builder.with_region(region);
                }
                if let Some(key) = &config.access_key_id {
                    builder = builder.with_access_key_id(key);
                }
                if let Some(secret) = &config.secret_access_key {
                    builder = builder.with_secret_access_key(secret);
                }
                (
                    Arc::new(builder.build()?),
                    prefix.trim_matches('/').to_owned(),
                )
            } else {
                let dir = config.url.trim_start_matches("file://");
                if dir.trim_matches('/').is_empty() {
                    return Err(ColdError::Url(config.url.clone()));
                }
                std::fs::create_dir_all(dir).map_err(|source| object_store::Error::Generic {
                    store: "LocalFileSystem",
                    source: Box::new(source),
                })?;
                let local = object_store::local::LocalFileSystem::new_with_prefix(dir)?;
                (Arc::new(local), String::new())
            };
        Ok(Self {
            store,
            prefix,
            cache: Mutex::new(SegmentCache::new(config.read_cache_size as usize)),
            fetching: Mutex::new(HashMap::new()),
            config: config.clone(),
        })
    }

    fn group_prefix(&self, group: u32) -> String {
        if self.prefix.is_empty() {
            format!("g{group}")
        } else {
            format!("{}/g{group}", self.prefix)
        }
    }

    /// A new name for an object holding `[first, until)` of a stream of `group`.
    pub fn segment_key(&self, group: u32, stream_id: u64, first: u64, until: u64) -> String {
        format!(
            "{}/s{stream_id}/{first:020}-{until:020}-{:016x}",
            self.group_prefix(group),
            unique()
        )
    }

    /// A new name for a body staged by a node of `group` before it proposes the write.
    pub fn staged_key(&self, group: u32) -> String {
        format!("{}/staged/{:016x}", self.group_prefix(group), unique())
    }

    /// Writes a segment: `records`, consecutive, starting at `first`.
    pub async fn put_segment(
        &self,
        key: &str,
        first: u64,
        records: &[Record],
    ) -> Result<(), ColdError> {
        let mut chunk = ChunkBuilder::new(first);
        for (_, bytes) in records {
            chunk.push(bytes.clone());
        }
        let mut object = Vec::with_capacity(MAGIC.len() + chunk.encoded_len());
        object.extend_from_slice(MAGIC);
        chunk.encode_into(&mut object);
        self.store
            .put(&Path::from(key), PutPayload::from(object))
            .await?;
        Ok(())
    }

    /// The records of the segment `key`, which starts at `first`; recently read segments come
    /// from memory, and readers that ask at once share one fetch. Also says whether this call
    /// fetched it from object storage.
    pub async fn segment(
        &self,
        key: &str,
        first: u64,
    ) -> Result<(Arc<Vec<Record>>, bool), ColdError> {
        if let Some(records) = self.cache.lock().get(key) {
            return Ok((records, false));
        }
        let cell = self
            .fetching
            .lock()
            .entry(key.to_owned())
            .or_default()
            .clone();
        let fetched = std::sync::atomic::AtomicBool::new(false);
        let result = cell
            .get_or_try_init(|| async {
                fetched.store(true, std::sync::atomic::Ordering::Relaxed);
                let (records, size) = self.fetch(key, first).await?;
                // Cached before the fetch is forgotten, so that a later reader finds one or
                // the other.
                self.cache.lock().insert(key, records.clone(), size);
                Ok::<_, ColdError>(records)
            })
            .await
            .cloned();
        {
            let mut fetching = self.fetching.lock();
            if fetching.get(key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                fetching.remove(key);
            }
        }
        Ok((result?, fetched.into_inner()))
    }

    /// One GET of a segment object, decoded; also its size.
    async fn fetch(&self, key: &str, first: u64) -> Result<(Arc<Vec<Record>>, usize), ColdError> {
        let object = self.store.get(&Path::from(key)).await?.bytes().await?;
        let corrupt = |message: String| ColdError::Corrupt {
            key: key.to_owned(),
            message,
        };
        if !object.starts_with(MAGIC) {
            return Err(corrupt(
                "it does not start with the segment format's mark".into(),
            ));
        }
        let chunk: Bytes = object.slice(MAGIC.len()..);
        let records = Arc::new(decode_chunk(first, &chunk).map_err(|e| corrupt(e.to_string()))?);
        Ok((records, chunk.len()))
    }

    /// Every object under `group`'s prefix.
    pub async fn list(&self, group: u32) -> Result<Vec<Listed>, ColdError> {
        let prefix = Path::from(self.group_prefix(group));
        let objects: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        Ok(objects
            .into_iter()
            .map(|object| Listed {
                key: object.location.to_string(),
                modified_ms: object.last_modified.timestamp_millis(),
            })
            .collect())
    }

    pub async fn delete(&self, key: &str) -> Result<(), ColdError> {
        self.cache.lock().remove(key);
        match self.store.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

/// 64 random bits from the kernel (or, should that fail, from the clock and a counter).
fn unique() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: the kernel writes at most `bytes.len()` bytes into the buffer.
    let filled = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if filled == bytes.len() as isize {
        return u64::from_le_bytes(bytes);
    }
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos
        ^ COUNTER
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .rotate_left(40)
}

/// Decoded segments, least recently used first, within a byte budget.
struct SegmentCache {
    entries: VecDeque<(String, Arc<Vec<Record>>, usize)>,
    bytes: usize,
    budget: usize,
}

impl SegmentCache {
    fn new(budget: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            bytes: 0,
            budget,
        }
    }

    fn get(&mut self, key: &str) -> Option<Arc<Vec<Record>>> {
        let at = self.entries.iter().position(|(k, _, _)| k == key)?;
        let entry = self.entries.remove(at)?;
        let records = entry.1.clone();
        self.entries.push_back(entry);
        Some(records)
    }

    fn insert(&mut self, key: &str, records: Arc<Vec<Record>>, size: usize) {
        self.remove(key);
        self.entries.push_back((key.to_owned(), records, size));
        self.bytes += size;
        while self.bytes > self.budget {
            match self.entries.pop_front() {
                Some((_, _, size)) => self.bytes -= size,
                None => break,
            }
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some(at) = self.entries.iter().position(|(k, _, _)| k == key)
            && let Some((_, _, size)) = self.entries.remove(at)
        {
            self.bytes -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(dir: &std::path::Path) -> ColdStore {
        let config = ColdConfig {
            url: format!("file://{}", dir.display()),
            read_cache_size: 1024,
            ..ColdConfig::default()
        };
        ColdStore::open(&config).unwrap()
    }

    #[tokio::test]
    async fn a_segment_reads_back_as_the_records_written() {
        let dir = tempfile::tempdir().unwrap();
        let cold = local(dir.path());
        let key = cold.segment_key(3, 7, 100, 106);
        assert!(
            key.starts_with("g3/s7/00000000000000000100-00000000000000000106-"),
            "{key}"
        );
        assert_ne!(
            key,
            cold.segment_key(3, 7, 100, 106),
            "every upload is a new object"
        );
        let records: Vec<Record> = [(100, "abc"), (103, ""), (103, "def")]
            .into_iter()
            .map(|(offset, text)| (offset, Bytes::from(text)))
            .collect();
        cold.put_segment(&key, 100, &records).await.unwrap();
        let (read, fetched) = cold.segment(&key, 100).await.unwrap();
        assert_eq!((*read).clone(), records);
        assert!(fetched);
        let (_, fetched) = cold.segment(&key, 100).await.unwrap();
        assert!(!fetched, "the second read comes from memory");
        let listed = cold.list(3).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].key, key);
        assert!(cold.list(4).await.unwrap().is_empty());
        cold.delete(&key).await.unwrap();
        cold.delete(&key).await.unwrap();
        assert!(cold.list(3).await.unwrap().is_empty());
        assert!(matches!(
            cold.segment(&key, 100).await,
            Err(ColdError::Store(_))
        ));
    }

    /// An HTTPS endpoint builds a TLS client (with the process's one provider) and fails as a
    /// connection, not as a panic.
    #[tokio::test]
    async fn an_unreachable_https_store_is_an_error() {
        let config = ColdConfig {
            url: "s3://ursula/prefix".into(),
            endpoint: Some("https://127.0.0.1:9".into()),
            region: Some("us-east-1".into()),
            access_key_id: Some("key".into()),
            secret_access_key: Some("secret".into()),
            ..ColdConfig::default()
        };
        let cold = ColdStore::open(&config).unwrap();
        assert!(matches!(cold.list(0).await, Err(ColdError::Store(_))));
        let bad = ColdConfig {
            url: "s3:///prefix".into(),
            ..config
        };
        assert!(matches!(ColdStore::open(&bad), Err(ColdError::Url(_))));
    }

    /// Readers that first ask for one object at the same time share one fetch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_first_reads_share_one_fetch() {
        let dir = tempfile::tempdir().unwrap();
        let cold = Arc::new(local(dir.path()));
        let key = cold.segment_key(0, 1, 0, 3);
        cold.put_segment(&key, 0, &[(0, Bytes::from("abc"))])
            .await
            .unwrap();
        let readers: Vec<_> = (0..8)
            .map(|_| {
                let (cold, key) = (cold.clone(), key.clone());
                tokio::spawn(async move { cold.segment(&key, 0).await.unwrap() })
            })
            .collect();
        let mut fetches = 0;
        for reader in readers {
            let (records, fetched) = reader.await.unwrap();
            assert_eq!(records[0].1, Bytes::from("abc"));
            fetches += usize::from(fetched);
        }
        assert_eq!(fetches, 1);
        assert!(cold.fetching.lock().is_empty());
    }

    #[tokio::test]
    async fn an_object_that_is_not_a_segment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cold = local(dir.path());
        std::fs::create_dir_all(dir.path().join("g0")).unwrap();
        std::fs::write(dir.path().join("g0/odd"), b"hello").unwrap();
        let error = cold.segment("g0/odd", 0).await.unwrap_err();
        assert!(error.to_string().contains("g0/odd"), "{error}");
    }

    #[test]
    fn the_read_cache_keeps_the_most_recently_used_within_its_budget() {
        let mut cache = SegmentCache::new(10);
        let records = Arc::new(Vec::new());
        cache.insert("a", records.clone(), 4);
        cache.insert("b", records.clone(), 4);
        assert!(cache.get("a").is_some());
        cache.insert("c", records, 4);
        assert!(cache.get("b").is_none(), "least recently used goes first");
        assert!(cache.get("a").is_some() && cache.get("c").is_some());
        assert_eq!(cache.bytes, 8);
    }
}
