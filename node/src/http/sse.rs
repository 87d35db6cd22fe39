//! Server-sent events: `event: data` with the stream's bytes, each followed by an
//! `event: control` with the offset to resume from, the cursor, and the up-to-date and closed
//! signals. The connection ends after the closing control event, or after
//! `server.sse_max_duration`; clients resume from the last `streamNextOffset`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::mpsc;

use super::error::ApiError;
use tokio::time::Instant;
use ursula_wire::headers;

use super::App;
use super::handlers::read::read_chunk;
use super::response::{Body, Reply};
use crate::cursor;
use crate::engine::{Engine, StreamHandle, now_ms};
use crate::machine::StreamMeta;
use crate::machine::stream::normalize_content_type;
use crate::offset;

/// A comment line keeps idle connections (and the proxies on the way) alive.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub fn respond(
    app: &App,
    handle: Arc<StreamHandle>,
    meta: &StreamMeta,
    from: u64,
    client_cursor: Option<String>,
) -> Result<Response<Body>, ApiError> {
    let base64 = !is_text(&meta.content_type);
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let session = Session {
        engine: app.engine(&meta.path.bucket)?.clone(),
        handle,
        base64,
        chunk_size: app.config.server.read_chunk_size,
        deadline: Instant::now() + app.config.server.sse_max_duration,
        client_cursor,
        tx,
        stopping: app.stopping.clone(),
    };
    tokio::spawn(session.run(from));
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(Frame::data(bytes)), rx))
    });
    Ok(Reply::new(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .header_if(base64, headers::STREAM_SSE_DATA_ENCODING, "base64")
        .stream_body(StreamBody::new(events).boxed_unsync())
        .build())
}

/// Text and JSON streams are sent as text; every other type as base64.
fn is_text(content_type: &str) -> bool {
    let normalized = normalize_content_type(content_type);
    normalized.starts_with("text/") || normalized == "application/json"
}

struct Session {
    engine: Arc<Engine>,
    handle: Arc<StreamHandle>,
    base64: bool,
    chunk_size: usize,
    deadline: Instant,
    client_cursor: Option<String>,
    tx: mpsc::Sender<Bytes>,
    stopping: tokio::sync::watch::Receiver<bool>,
}

impl Session {
    async fn run(mut self, mut at: u64) {
        let mut changes = self.handle.subscribe();
        let mut announced = false;
        loop {
            let meta = self.handle.meta();
            if self.handle.is_removed() || meta.soft_deleted {
                return;
            }
            if at < meta.tail {
                let Ok(chunk) = read_chunk(&self.engine, &self.handle, &meta, at, self.chunk_size)
                else {
                    return;
                };
                at = chunk.next;
                let mut event = BytesMut::with_capacity(chunk.body.len() + 128);
                self.data_event(&mut event, &chunk.body);
                let closed = self.control_event(&mut event, &meta, at);
                if self.tx.send(event.freeze()).await.is_err() || closed {
                    return;
                }
                announced = true;
                continue;
            }
            if !announced || meta.closed {
                let mut event = BytesMut::with_capacity(128);
                let closed = self.control_event(&mut event, &meta, at);
                if self.tx.send(event.freeze()).await.is_err() || closed {
                    return;
                }
                announced = true;
            }
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep(KEEP_ALIVE) => {
                    if self.tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep_until(self.deadline) => return,
                () = super::until_stopping(&mut self.stopping) => return,
            }
        }
    }

    fn data_event(&self, out: &mut BytesMut, payload: &[u8]) {
        out.put_slice(b"event: data\n");
        if self.base64 {
            out.put_slice(b"data:");
            out.put_slice(
                base64::engine::general_purpose::STANDARD
                    .encode(payload)
                    .as_bytes(),
            );
            out.put_slice(b"\n");
        } else {
            let text = String::from_utf8_lossy(payload);
            for line in split_lines(&text) {
                out.put_slice(b"data:");
                // A parser strips one leading space; keep the payload's own.
                if line.starts_with(' ') {
                    out.put_slice(b" ");
                }
                out.put_slice(line.as_bytes());
                out.put_slice(b"\n");
            }
        }
        out.put_slice(b"\n");
    }

    /// Writes the control event for position `at`; returns whether it was the closing one.
    fn control_event(&self, out: &mut BytesMut, meta: &StreamMeta, at: u64) -> bool {
        let up_to_date = at == meta.tail;
        let closed = meta.closed && up_to_date;
        let mut control = serde_json::Map::new();
        control.insert("streamNextOffset".into(), offset::format(at).into());
        if closed {
            control.insert("streamClosed".into(), true.into());
        } else {
            let cursor = cursor::next(now_ms(), self.client_cursor.as_deref());
            control.insert("streamCursor".into(), cursor.into());
        }
        if up_to_date {
            control.insert("upToDate".into(), true.into());
        }
        out.put_slice(b"event: control\ndata:");
        out.put_slice(serde_json::Value::Object(control).to_string().as_bytes());
        out.put_slice(b"\n\n");
        closed
    }
}

/// Splits on `\r\n`, `\n` and a lone `\r`, so no payload line can end an event or start a
/// field of its own.
fn split_lines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => {
                lines.push(&text[start..i]);
                start = i + 1;
            }
            b'\r' => {
                lines.push(&text[start..i]);
                if bytes.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    lines.push(&text[start..]);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_on_every_line_ending() {
        assert_eq!(split_lines("a\r\nb\nc\rd"), vec!["a", "b", "c", "d"]);
        assert_eq!(split_lines(""), vec![""]);
        assert_eq!(split_lines("x\n"), vec!["x", ""]);
        assert_eq!(
            split_lines("event: evil\r\n\r\ndata: x"),
            vec!["event: evil", "", "data: x"]
        );
    }

    #[test]
    fn text_types() {
        assert!(is_text("text/plain; charset=utf-8"));
        assert!(is_text("Application/JSON"));
        assert!(!is_text("application/octet-stream"));
        assert!(!is_text("image/png"));
    }
}
