//! One read of a stream's bytes, framed for its mode: what catch-up reads, long-polls, SSE and
//! bootstrap each send.

use bytes::{Bytes, BytesMut};

use crate::engine::{Engine, StreamHandle};
use crate::http::error::ApiError;
use crate::machine::StreamMeta;

/// The bytes of one read, framed for the stream's mode: a JSON stream answers one array.
pub struct Chunk {
    pub body: Bytes,
    pub next: u64,
}

pub async fn read_chunk(
    engine: &Engine,
    handle: &StreamHandle,
    meta: &StreamMeta,
    from: u64,
    max_bytes: usize,
) -> Result<Chunk, ApiError> {
    let slices = if from < meta.tail {
        engine.read(handle, meta, from, max_bytes).await?
    } else {
        Vec::new()
    };
    let next = slices
        .last()
        .map_or(from, |s| s.start + s.bytes.len() as u64);
    let body = if meta.is_json() {
        let mut out =
            BytesMut::with_capacity(slices.iter().map(|s| s.bytes.len() + 1).sum::<usize>() + 2);
        out.extend_from_slice(b"[");
        for (i, slice) in slices.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b",");
            }
            out.extend_from_slice(&slice.bytes);
        }
        out.extend_from_slice(b"]");
        out.freeze()
    } else if slices.len() == 1 {
        slices[0].bytes.clone()
    } else {
        let mut out = BytesMut::with_capacity(slices.iter().map(|s| s.bytes.len()).sum());
        for slice in &slices {
            out.extend_from_slice(&slice.bytes);
        }
        out.freeze()
    };
    Ok(Chunk { body, next })
}
