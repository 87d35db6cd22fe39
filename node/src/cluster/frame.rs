//! The peer links' wire format on the cluster listener: a connection that opens with `MAGIC`
//! carries length-prefixed frames instead of HTTP. Each frame is
//! `[len: u32 LE][exchange: u64 LE][payload: len bytes]`; a request's payload is a postcard
//! `Vec<BatchCall>` and its answer, under the same exchange number, a `Vec<BatchAnswer>`.
//!
//! A link has one exchange in flight at a time, so the listener answers a connection's frames
//! in order. HTTP/2 framing, header compression, flow control and a task per request cost
//! more CPU than the Raft calls they carried; this is one write and one read each way.

use std::io;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// What a peer link writes first. Neither an HTTP/1 method nor the HTTP/2 preface
/// (`PRI * HTTP/2.0`) starts so, which lets the cluster listener tell links from HTTP.
pub const MAGIC: &[u8; 8] = b"URSLINK1";

/// Bytes before a frame's payload.
pub const HEADER: usize = 12;

/// Payloads up to this size are allocated whole from the header; larger ones as they arrive.
const EAGER_BYTES: usize = 1024 * 1024;

/// A frame buffer with room for the header; append the payload, then `finish` it.
pub fn start() -> Vec<u8> {
    vec![0; HEADER]
}

/// Fills in the header of a frame built on `start()`.
pub fn finish(mut frame: Vec<u8>, exchange: u64) -> io::Result<Vec<u8>> {
    let len = u32::try_from(frame.len() - HEADER)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    frame[4..HEADER].copy_from_slice(&exchange.to_le_bytes());
    Ok(frame)
}

pub async fn write<W: AsyncWrite + Unpin>(writer: &mut W, frame: &[u8]) -> io::Result<()> {
    writer.write_all(frame).await?;
    writer.flush().await
}

/// Reads one frame: its exchange number and payload. A payload over `max` bytes is an error
/// (the peer is broken or is not a peer); a clean end of stream before a frame is `None`.
pub async fn read<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> io::Result<Option<(u64, Bytes)>> {
    let mut header = [0u8; HEADER];
    match reader.read_exact(&mut header[..1]).await {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error),
    }
    reader.read_exact(&mut header[1..]).await?;
    let mut len_bytes = [0u8; 4];
    len_bytes.copy_from_slice(&header[..4]);
    let mut exchange_bytes = [0u8; 8];
    exchange_bytes.copy_from_slice(&header[4..]);
    let len = u32::from_le_bytes(len_bytes) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes is over the limit of {max}"),
        ));
    }
    let payload = if len <= EAGER_BYTES {
        let mut payload = vec![0; len];
        reader.read_exact(&mut payload).await?;
        payload
    } else {
        // Grown as the bytes arrive: a header alone does not get `max` bytes allocated.
        let mut payload = Vec::with_capacity(EAGER_BYTES);
        (&mut *reader)
            .take(len as u64)
            .read_to_end(&mut payload)
            .await?;
        if payload.len() < len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        payload
    };
    Ok(Some((
        u64::from_le_bytes(exchange_bytes),
        Bytes::from(payload),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_in_order_and_end_cleanly() {
        let mut wire = Vec::new();
        for (exchange, payload) in [(1u64, &b"first"[..]), (2, b""), (u64::MAX, &[7u8; 300])] {
            let mut frame = start();
            frame.extend_from_slice(payload);
            wire.extend(finish(frame, exchange).unwrap());
        }
        let mut reader = &wire[..];
        let (exchange, payload) = read(&mut reader, 1024).await.unwrap().unwrap();
        assert_eq!((exchange, &payload[..]), (1, &b"first"[..]));
        let (exchange, payload) = read(&mut reader, 1024).await.unwrap().unwrap();
        assert_eq!((exchange, payload.len()), (2, 0));
        let (exchange, payload) = read(&mut reader, 1024).await.unwrap().unwrap();
        assert_eq!((exchange, &payload[..]), (u64::MAX, &[7u8; 300][..]));
        assert!(read(&mut reader, 1024).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_large_frame_arrives_whole_and_a_short_one_is_torn() {
        let mut frame = start();
        frame.extend((0..3 * EAGER_BYTES).map(|i| i as u8));
        let frame = finish(frame, 4).unwrap();
        let (exchange, payload) = read(&mut &frame[..], usize::MAX).await.unwrap().unwrap();
        assert_eq!((exchange, payload.len()), (4, 3 * EAGER_BYTES));
        assert_eq!(&payload[..], &frame[HEADER..]);
        let error = read(&mut &frame[..frame.len() - 1], usize::MAX)
            .await
            .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn oversized_and_torn_frames_are_errors() {
        let mut frame = start();
        frame.extend_from_slice(&[0u8; 100]);
        let frame = finish(frame, 9).unwrap();
        let error = read(&mut &frame[..], 99).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        let error = read(&mut &frame[..50], 1024).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        let error = read(&mut &frame[..5], 1024).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
    }
}
