//! Row encodings. postcard is compact and its format is stable across versions.

use crate::machine::{BucketState, ProducerState, StreamMeta};

use super::StorageError;

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
