//! Row encodings. postcard is compact and its format is stable across versions.

use bytes::Bytes;

use crate::machine::{BucketState, ProducerState, StreamMeta};

use super::StorageError;

/// `value` postcard-encoded into a buffer of exactly its size, for values that may be large
/// (Raft entries and the calls that carry them, snapshot dumps): `to_allocvec` grows its
/// buffer by doubling, which copied a 10 MiB body about twice more and faulted fresh pages in
/// at each step (zeroing fresh pages was a third of the leader's CPU for 10 MiB appends, in
/// perf).
pub fn encode_sized<T: serde::Serialize + ?Sized>(value: &T) -> postcard::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(postcard::experimental::serialized_size(value)?);
    postcard::serialize_with_flavor(value, AppendTo(&mut out))?;
    Ok(out)
}

/// A postcard output that appends to an existing `Vec`, keeping what it holds. Not postcard's
/// `to_extend`: its flavor extends from an iterator, byte by byte in a debug build.
pub struct AppendTo<'a>(pub &'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for AppendTo<'_> {
    type Output = ();

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

pub fn encode_meta(meta: &StreamMeta) -> Vec<u8> {
    // Encoding a plain struct into a Vec cannot fail.
    postcard::to_allocvec(meta).unwrap_or_default()
}

pub fn decode_meta(bytes: &[u8]) -> Result<StreamMeta, StorageError> {
    postcard::from_bytes(bytes).map_err(|e| StorageError::Corrupt(format!("stream meta: {e}")))
}

pub fn encode_producer(state: &ProducerState) -> Vec<u8> {
    postcard::to_allocvec(state).unwrap_or_default()
}

pub fn decode_producer(bytes: &[u8]) -> Result<ProducerState, StorageError> {
    postcard::from_bytes(bytes).map_err(|e| StorageError::Corrupt(format!("producer: {e}")))
}

pub fn bucket_byte(state: &BucketState) -> u8 {
    match state {
        BucketState::Active => 0,
        BucketState::Fenced => 1,
    }
}

pub fn bucket_state(byte: u8) -> BucketState {
    match byte {
        0 => BucketState::Active,
        _ => BucketState::Fenced,
    }
}

/// A cold segment's row: `[until: u64 LE][first: u64 LE][object name, UTF-8]`.
pub fn encode_cold(until: u64, first: u64, key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + key.len());
    out.extend_from_slice(&until.to_le_bytes());
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out
}

pub fn decode_cold(row: &[u8]) -> Result<(u64, u64, &str), StorageError> {
    let corrupt = || StorageError::Corrupt("cold segment row".into());
    let word = |at: usize| -> Result<u64, StorageError> {
        let bytes = row.get(at..at + 8).ok_or_else(corrupt)?;
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| corrupt())?))
    };
    let key = std::str::from_utf8(row.get(16..).ok_or_else(corrupt)?).map_err(|_| corrupt())?;
    Ok((word(0)?, word(8)?, key))
}

/// Consecutive records of one stream, stored as one row:
/// `[count: u32][len: u32; count][bytes of every record]`, little-endian.
pub struct ChunkBuilder {
    first: u64,
    len: u64,
    records: Vec<Bytes>,
}

impl ChunkBuilder {
    pub fn new(first: u64) -> Self {
        Self {
            first,
            len: 0,
            records: Vec::new(),
        }
    }

    pub fn first(&self) -> u64 {
        self.first
    }

    pub fn end(&self) -> u64 {
        self.first + self.len
    }

    /// Record bytes so far.
    pub fn data_len(&self) -> u64 {
        self.len
    }

    pub fn push(&mut self, record: Bytes) {
        self.len += record.len() as u64;
        self.records.push(record);
    }

    pub fn encoded_len(&self) -> usize {
        4 + 4 * self.records.len() + self.len as usize
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out
    }

    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.records.len() as u32).to_le_bytes());
        for record in &self.records {
            out.extend_from_slice(&(record.len() as u32).to_le_bytes());
        }
        for record in &self.records {
            out.extend_from_slice(record);
        }
    }
}

fn chunk_count(chunk: &[u8]) -> Option<usize> {
    let count = u32::from_le_bytes(chunk.get(..4)?.try_into().ok()?) as usize;
    (chunk.len() >= 4 + 4 * count).then_some(count)
}

/// The number of record bytes in an encoded chunk.
pub fn chunk_data_len(chunk: &[u8]) -> u64 {
    chunk_count(chunk).map_or(0, |count| (chunk.len() - 4 - 4 * count) as u64)
}

/// The records of a chunk that starts at `first`, as slices of `chunk`.
pub fn decode_chunk(first: u64, chunk: &Bytes) -> Result<Vec<(u64, Bytes)>, StorageError> {
    let corrupt = || StorageError::Corrupt(format!("record chunk at offset {first}"));
    let count = chunk_count(chunk).ok_or_else(corrupt)?;
    let mut out = Vec::with_capacity(count);
    let mut data = 4 + 4 * count;
    let mut offset = first;
    for i in 0..count {
        let at = 4 + 4 * i;
        let len = u32::from_le_bytes(chunk[at..at + 4].try_into().map_err(|_| corrupt())?) as usize;
        if data + len > chunk.len() {
            return Err(corrupt());
        }
        out.push((offset, chunk.slice(data..data + len)));
        data += len;
        offset += len as u64;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip() {
        let mut chunk = ChunkBuilder::new(100);
        for record in ["a", "bcd", "", "ef"] {
            chunk.push(Bytes::from(record));
        }
        assert_eq!(chunk.end(), 106);
        let encoded = Bytes::from(chunk.encode());
        assert_eq!(chunk_data_len(&encoded), 6);
        let records = decode_chunk(100, &encoded).unwrap();
        let offsets: Vec<u64> = records.iter().map(|r| r.0).collect();
        assert_eq!(offsets, vec![100, 101, 104, 104]);
        assert_eq!(records[1].1, Bytes::from("bcd"));
        assert!(decode_chunk(0, &Bytes::from_static(&[9, 0, 0, 0])).is_err());
    }
}
