//! The gateway link: a gateway's requests to one node, many at a time on one connection.
//!
//! Over HTTP/1.1 a connection carries one request at a time, so a gateway forwarding the appends
//! of 32 writers makes a send and a receive system call per request on each side of the hop,
//! and on a small machine those calls are most of the gateway's cost. On the link, requests and
//! answers are frames tagged with an ID: each side writes every frame that is ready with one
//! call and reads as many as have arrived with one. A request on the link is the same HTTP
//! request (method, target, headers, body) and the node handles it exactly as one that came over
//! HTTP. Only requests with a bounded answer travel on it; SSE stays on HTTP, where each
//! subscriber's connection has its own flow control.
//!
//! Opening: `GET /_ursula/link` with `Connection: upgrade` and `Upgrade: ursula-link/1`. The
//! node answers `101 Switching Protocols` and both sides speak frames from then on. A node that
//! does not know the link answers anything else, and the gateway keeps using HTTP.
//!
//! A frame is `length: u32` (of what follows it), `kind: u8`, `id: u64`, then
//! - a request (kind 1): `method_len: u8`, method, `target_len: u16`, target, headers, body;
//! - an answer (kind 2): `status: u16`, headers, body;
//! - a go-away (kind 3), from a node that stops: `id` is the last request it read. It answers
//!   every request up to that one and none after it, then closes the connection.
//!
//! Headers are `count: u16`, then for each `name_len: u8`, name, `value_len: u16`, value. The
//! body is the rest of the frame. Integers are big-endian. Answers may come in any order;
//! request IDs increase.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};

/// The path of the upgrade request.
pub const PATH: &str = "/_ursula/link";
/// The `Upgrade` token.
pub const PROTOCOL: &str = "ursula-link/1";
/// No frame is longer; a longer length means the stream is not a link.
pub const MAX_FRAME: usize = 256 * 1024 * 1024;
/// No frame carries more headers (a `HeaderMap` holds at most 32,768).
pub const MAX_HEADERS: usize = 1024;

const REQUEST: u8 = 1;
const ANSWER: u8 = 2;
const GO_AWAY: u8 = 3;
/// `kind` and `id`.
const FRAME_HEAD: usize = 1 + 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a frame of {0} bytes is over the link's limit of {MAX_FRAME}")]
    TooLong(usize),
    #[error("{0} does not fit a link frame")]
    DoesNotFit(&'static str),
    #[error("malformed link frame: {0}")]
    Malformed(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    pub method: Method,
    /// Path and query.
    pub target: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub id: u64,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Request(Request),
    Answer(Answer),
    /// The node answers requests up to this ID, and no later one.
    GoAway {
        last: u64,
    },
}

/// Appends a request frame to `out`; on an error `out` is as it was.
pub fn encode_request(
    out: &mut BytesMut,
    id: u64,
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), FrameError> {
    let start = begin(out, REQUEST, id);
    let written = (|| {
        let method = method.as_str().as_bytes();
        put_u8_len(out, method.len(), "the method")?;
        out.put_slice(method);
        put_u16_len(out, target.len(), "the request target")?;
        out.put_slice(target.as_bytes());
        put_headers(out, headers)?;
        out.put_slice(body);
        finish(out, start)
    })();
    written.inspect_err(|_| out.truncate(start))
}

/// Appends an answer frame to `out`; on an error `out` is as it was.
pub fn encode_answer(
    out: &mut BytesMut,
    id: u64,
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), FrameError> {
    let start = begin(out, ANSWER, id);
    let written = (|| {
        out.put_u16(status.as_u16());
        put_headers(out, headers)?;
        out.put_slice(body);
        finish(out, start)
    })();
    written.inspect_err(|_| out.truncate(start))
}

/// Appends a go-away frame to `out`.
pub fn encode_go_away(out: &mut BytesMut, last: u64) {
    let start = begin(out, GO_AWAY, last);
    // Nine bytes always fit.
    let _ = finish(out, start);
}

/// Takes the first whole frame off `buf`: `None` until one has arrived.
pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
    let Some(length) = frame_length(buf)? else {
        return Ok(None);
    };
    buf.advance(4);
    let mut frame = buf.split_to(length).freeze();
    let kind = frame.get_u8();
    let id = frame.get_u64();
    match kind {
        REQUEST => {
            let method = take_u8_len(&mut frame, "method")?;
            let method =
                Method::from_bytes(&method).map_err(|_| FrameError::Malformed("method"))?;
            let target = take_u16_len(&mut frame, "target")?;
            let target =
                String::from_utf8(target.to_vec()).map_err(|_| FrameError::Malformed("target"))?;
            let headers = take_headers(&mut frame)?;
            Ok(Some(Frame::Request(Request {
                id,
                method,
                target,
                headers,
                body: frame,
            })))
        }
        ANSWER => {
            if frame.remaining() < 2 {
                return Err(FrameError::Malformed("status"));
            }
            let status = StatusCode::from_u16(frame.get_u16())
                .map_err(|_| FrameError::Malformed("status"))?;
            let headers = take_headers(&mut frame)?;
            Ok(Some(Frame::Answer(Answer {
                id,
                status,
                headers,
                body: frame,
            })))
        }
        GO_AWAY => Ok(Some(Frame::GoAway { last: id })),
        _ => Err(FrameError::Malformed("kind")),
    }
}

/// How many more bytes `buf` needs before `decode` can return a frame (at least 1 while the
/// length itself has not arrived): a reader reserves that much before its next read.
pub fn wanted(buf: &[u8]) -> usize {
    match declared_length(buf) {
        // A length over the limit is refused by `decode`; never ask for more than a frame.
        Some(length) => (4 + length.min(MAX_FRAME)).saturating_sub(buf.len()).max(1),
        None => 4 - buf.len(),
    }
}

/// The length field, once its four bytes have arrived.
fn declared_length(buf: &[u8]) -> Option<usize> {
    let field: [u8; 4] = buf.get(..4)?.try_into().ok()?;
    Some(u32::from_be_bytes(field) as usize)
}

fn frame_length(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(length) = declared_length(buf) else {
        return Ok(None);
    };
    if length > MAX_FRAME {
        return Err(FrameError::TooLong(length));
    }
    if length < FRAME_HEAD {
        return Err(FrameError::Malformed("length"));
    }
    Ok((buf.len() >= 4 + length).then_some(length))
}

fn begin(out: &mut BytesMut, kind: u8, id: u64) -> usize {
    let start = out.len();
    out.put_u32(0);
    out.put_u8(kind);
    out.put_u64(id);
    start
}

fn finish(out: &mut BytesMut, start: usize) -> Result<(), FrameError> {
    let length = out.len() - start - 4;
    if length > MAX_FRAME {
        return Err(FrameError::TooLong(length));
    }
    out[start..start + 4].copy_from_slice(&(length as u32).to_be_bytes());
    Ok(())
}

fn put_u8_len(out: &mut BytesMut, len: usize, what: &'static str) -> Result<(), FrameError> {
    out.put_u8(u8::try_from(len).map_err(|_| FrameError::DoesNotFit(what))?);
    Ok(())
}

fn put_u16_len(out: &mut BytesMut, len: usize, what: &'static str) -> Result<(), FrameError> {
    out.put_u16(u16::try_from(len).map_err(|_| FrameError::DoesNotFit(what))?);
    Ok(())
}

fn put_headers(out: &mut BytesMut, headers: &HeaderMap) -> Result<(), FrameError> {
    if headers.len() > MAX_HEADERS {
        return Err(FrameError::DoesNotFit("the number of headers"));
    }
    put_u16_len(out, headers.len(), "the number of headers")?;
    for (name, value) in headers {
        put_u8_len(out, name.as_str().len(), "a header name")?;
        out.put_slice(name.as_str().as_bytes());
        put_u16_len(out, value.len(), "a header value")?;
        out.put_slice(value.as_bytes());
    }
    Ok(())
}

fn take(frame: &mut Bytes, len: usize, what: &'static str) -> Result<Bytes, FrameError> {
    if frame.remaining() < len {
        return Err(FrameError::Malformed(what));
    }
    Ok(frame.split_to(len))
}

fn take_u8_len(frame: &mut Bytes, what: &'static str) -> Result<Bytes, FrameError> {
    if frame.remaining() < 1 {
        return Err(FrameError::Malformed(what));
    }
    let len = frame.get_u8() as usize;
    take(frame, len, what)
}

fn take_u16_len(frame: &mut Bytes, what: &'static str) -> Result<Bytes, FrameError> {
    if frame.remaining() < 2 {
        return Err(FrameError::Malformed(what));
    }
    let len = frame.get_u16() as usize;
    take(frame, len, what)
}

fn take_headers(frame: &mut Bytes) -> Result<HeaderMap, FrameError> {
    if frame.remaining() < 2 {
        return Err(FrameError::Malformed("header count"));
    }
    let count = frame.get_u16() as usize;
    if count > MAX_HEADERS {
        return Err(FrameError::Malformed("header count"));
    }
    // Receivers add a header or two (the node a `content-length`, the gateway its vouch);
    // room for them here saves the map a rehash per frame.
    let mut headers = HeaderMap::with_capacity(count + 2);
    for _ in 0..count {
        let name = take_u8_len(frame, "header name")?;
        let name =
            HeaderName::from_bytes(&name).map_err(|_| FrameError::Malformed("header name"))?;
        let value = take_u16_len(frame, "header value")?;
        let value = HeaderValue::from_maybe_shared(value)
            .map_err(|_| FrameError::Malformed("header value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn frames_read_back_as_written_whatever_the_read_boundaries() {
        let mut out = BytesMut::new();
        let request_headers = headers(&[
            ("content-type", "text/plain"),
            ("producer-id", "p1"),
            ("x-repeat", "a"),
            ("x-repeat", "b"),
        ]);
        encode_request(
            &mut out,
            7,
            &Method::POST,
            "/demo/s?x=1",
            &request_headers,
            b"hello",
        )
        .unwrap();
        let answer_headers = headers(&[("stream-next-offset", "0000000000000005")]);
        encode_answer(&mut out, 3, StatusCode::NO_CONTENT, &answer_headers, b"").unwrap();
        encode_request(&mut out, 8, &Method::GET, "/", &HeaderMap::new(), b"").unwrap();
        encode_go_away(&mut out, 8);
        let expected = vec![
            Frame::Request(Request {
                id: 7,
                method: Method::POST,
                target: "/demo/s?x=1".into(),
                headers: request_headers,
                body: Bytes::from_static(b"hello"),
            }),
            Frame::Answer(Answer {
                id: 3,
                status: StatusCode::NO_CONTENT,
                headers: answer_headers,
                body: Bytes::new(),
            }),
            Frame::Request(Request {
                id: 8,
                method: Method::GET,
                target: "/".into(),
                headers: HeaderMap::new(),
                body: Bytes::new(),
            }),
            Frame::GoAway { last: 8 },
        ];
        let wire = out.freeze();
        for step in [1, 3, 17, wire.len()] {
            let mut buf = BytesMut::new();
            let mut frames = Vec::new();
            for chunk in wire.chunks(step) {
                assert!(wanted(&buf) >= 1);
                buf.extend_from_slice(chunk);
                while let Some(frame) = decode(&mut buf).unwrap() {
                    frames.push(frame);
                }
            }
            assert_eq!(frames, expected, "read {step} bytes at a time");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn wanted_is_what_completes_the_frame() {
        let mut out = BytesMut::new();
        encode_answer(&mut out, 1, StatusCode::OK, &HeaderMap::new(), b"abc").unwrap();
        assert_eq!(wanted(&out[..0]), 4);
        assert_eq!(wanted(&out[..2]), 2);
        assert_eq!(wanted(&out[..5]), out.len() - 5);
        assert_eq!(wanted(&out), 1);
        assert_eq!(wanted(&[0xff, 0xff, 0xff, 0xff]), MAX_FRAME);
    }

    #[test]
    fn what_does_not_fit_is_refused_and_leaves_the_buffer_as_it_was() {
        let mut out = BytesMut::new();
        encode_answer(&mut out, 1, StatusCode::OK, &HeaderMap::new(), b"kept").unwrap();
        let before = out.clone();
        let long_target = format!("/demo/{}", "x".repeat(70_000));
        assert_eq!(
            encode_request(
                &mut out,
                2,
                &Method::GET,
                &long_target,
                &HeaderMap::new(),
                b""
            ),
            Err(FrameError::DoesNotFit("the request target"))
        );
        let long_value = headers(&[("x-big", &"v".repeat(70_000))]);
        assert_eq!(
            encode_answer(&mut out, 2, StatusCode::OK, &long_value, b""),
            Err(FrameError::DoesNotFit("a header value"))
        );
        assert_eq!(out, before);
    }

    #[test]
    fn a_stream_that_is_not_a_link_is_refused() {
        for bytes in [
            &b"GET / HTTP/1.1\r\n"[..],                   // a length over the limit
            &[0, 0, 0, 3, 1, 0, 0][..],                   // shorter than kind and id
            &[0, 0, 0, 9, 9, 0, 0, 0, 0, 0, 0, 0, 1][..], // an unknown kind
            &[0, 0, 0, 10, 1, 0, 0, 0, 0, 0, 0, 0, 1, 5][..], // a method longer than the frame
            &[
                0, 0, 0, 15, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 200, 0xff, 0xff, 0, 0,
            ][..], // 65,535 headers
        ] {
            let mut buf = BytesMut::from(bytes);
            assert!(decode(&mut buf).is_err(), "{bytes:?}");
        }
    }
}
