//! Server-sent events: `event: data` with the stream's bytes, each followed by an
//! `event: control` with the offset to resume from, the cursor, and the up-to-date and closed
//! signals. The connection ends after the closing control event, or after
//! `server.sse_max_duration`; clients resume from the last `streamNextOffset`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use http::{Response, StatusCode};
use http_body_util::StreamBody;
use hyper::body::Frame;

use super::error::ApiError;
use tokio::time::Instant;
use ursula_wire::headers;

use super::App;
use super::handlers::chunk::read_chunk;
use super::response::{Body, Reply};
use crate::engine::{Engine, RenderKey, Rendered, StreamHandle, now_ms};
use crate::machine::StreamMeta;
use crate::machine::stream::normalize_content_type;
use crate::offset;
use ursula_wire::cursor::{self, Cursor};

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
    let now = Instant::now();
    let deadline = now + app.config.server.sse_max_duration;
    let session = Session {
        engine: app.engine(&meta.path.bucket)?.clone(),
        changes: handle.subscribe(),
        handle,
        base64,
        chunk_size: app.config.server.read_chunk_size,
        deadline,
        timer: Box::pin(tokio::time::sleep_until((now + KEEP_ALIVE).min(deadline))),
        last_sent: now,
        cursor: cursor::Session::new(
            now_ms(),
            client_cursor.as_deref().and_then(Cursor::parse_echo),
        ),
        stopping: app.stopping.clone(),
        at: from,
        announced: false,
        ended: false,
    };
    // The connection itself polls the session for its next event: no task or channel of its
    // own, so an event costs one wake-up (of the connection) per subscriber.
    let events = futures_util::stream::unfold(session, |mut session| async move {
        let event = session.next_event().await?;
        Some((Ok::<_, Infallible>(Frame::data(event)), session))
    });
    Ok(Reply::new(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .header_if(base64, headers::STREAM_SSE_DATA_ENCODING, "base64")
        .stream_body(Body::new(StreamBody::new(events)))
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
    changes: tokio::sync::watch::Receiver<u64>,
    base64: bool,
    chunk_size: usize,
    deadline: Instant,
    /// Fires at the next keep-alive or the deadline, whichever is first. One timer for the
    /// whole session, re-armed only when it fires: a timer set and cancelled around every
    /// event cost ~5% of a node's CPU with 1,000 subscribers.
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// When the last event or keep-alive was sent: a wake-up that sends nothing (a metadata
    /// change, say) does not put the next keep-alive off.
    last_sent: Instant,
    /// Greater than the client's echo when that is at or past the current interval; never
    /// smaller than the last one sent.
    cursor: cursor::Session,
    stopping: tokio::sync::watch::Receiver<bool>,
    /// The offset the next data event starts at.
    at: u64,
    /// Whether a control event has told the client where it is.
    announced: bool,
    /// The closing control event was sent, or the stream is gone: nothing more comes.
    ended: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.handle.reader_leaving();
    }
}

impl Session {
    /// The next event to send (data with its control event, a control event alone, or a
    /// keep-alive comment), waiting for the stream to change; `None` ends the response.
    async fn next_event(&mut self) -> Option<Bytes> {
        loop {
            if self.ended {
                return None;
            }
            let meta = self.handle.meta();
            if self.handle.is_removed() || meta.soft_deleted {
                return None;
            }
            if self.at < meta.tail {
                let key = RenderKey {
                    from: self.at,
                    tail: meta.tail,
                    closed: meta.closed,
                    cursor: self.cursor.at(now_ms()),
                    base64: self.base64,
                    max_bytes: self.chunk_size,
                };
                // Subscribers woken by the same append mostly ask for the same event: the
                // first renders it, the others send the same bytes.
                // A read below a fork point goes through the source, whose own retention or
                // deletion a fresh render must see.
                let own_bytes = meta.fork.is_none_or(|fork| self.at >= fork.offset);
                let shareable = own_bytes && self.at >= meta.retained_from;
                let metrics = &self.engine.metrics;
                let rendered = match shareable.then(|| self.handle.rendered(&key)).flatten() {
                    Some(rendered) => {
                        metrics.sse_events_shared.fetch_add(1, Ordering::Relaxed);
                        rendered
                    }
                    None => {
                        let rendered = Arc::new(self.render(&meta, key).await?);
                        metrics.sse_events_rendered.fetch_add(1, Ordering::Relaxed);
                        if own_bytes {
                            self.handle.keep_rendered(rendered.clone());
                        }
                        rendered
                    }
                };
                self.at = rendered.next;
                self.ended = rendered.closes;
                self.announced = true;
                self.last_sent = Instant::now();
                return Some(rendered.bytes.clone());
            }
            if !self.announced || meta.closed {
                let mut event = BytesMut::with_capacity(128);
                self.ended = self.control_event(&mut event, &meta, self.at);
                self.announced = true;
                self.last_sent = Instant::now();
                return Some(event.freeze());
            }
            tokio::select! {
                changed = self.changes.changed() => {
                    changed.ok()?;
                }
                () = self.timer.as_mut() => {
                    let now = Instant::now();
                    if now >= self.deadline {
                        return None;
                    }
                    let keep_alive_at = self.last_sent + KEEP_ALIVE;
                    if now >= keep_alive_at {
                        self.last_sent = now;
                        self.timer.as_mut().reset((now + KEEP_ALIVE).min(self.deadline));
                        return Some(Bytes::from_static(b": keep-alive\n\n"));
                    }
                    self.timer.as_mut().reset(keep_alive_at.min(self.deadline));
                }
                () = crate::shutdown::until_stopping(&mut self.stopping) => return None,
            }
        }
    }

    /// A data event from `key.from` with the control event after it.
    async fn render(&self, meta: &StreamMeta, key: RenderKey) -> Option<Rendered> {
        let chunk = read_chunk(&self.engine, &self.handle, meta, key.from, key.max_bytes)
            .await
            .ok()?;
        let mut event = BytesMut::with_capacity(chunk.body.len() + 128);
        self.data_event(&mut event, &chunk.body);
        let closes = write_control(&mut event, chunk.next, key.tail, key.closed, &key.cursor);
        Some(Rendered {
            key,
            bytes: event.freeze(),
            next: chunk.next,
            closes,
        })
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
    fn control_event(&mut self, out: &mut BytesMut, meta: &StreamMeta, at: u64) -> bool {
        let cursor = self.cursor.at(now_ms());
        write_control(out, at, meta.tail, meta.closed, &cursor)
    }
}

/// An `event: control` for position `at` of a stream whose tail is `tail`; returns whether
/// it is the closing one (the stream is closed and `at` is its tail). Offsets and cursors are
/// digits (and `_`), so the JSON needs no escaping.
fn write_control(
    out: &mut BytesMut,
    at: u64,
    tail: u64,
    stream_closed: bool,
    cursor: &Cursor,
) -> bool {
    let up_to_date = at == tail;
    let closed = stream_closed && up_to_date;
    out.put_slice(b"event: control\ndata:{\"streamNextOffset\":\"");
    out.put_slice(offset::format(at).as_bytes());
    if closed {
        out.put_slice(b"\",\"streamClosed\":true");
    } else {
        out.put_slice(b"\",\"streamCursor\":\"");
        // Digits written in place: a control event goes to every subscriber, every event.
        let _ = std::fmt::Write::write_fmt(out, format_args!("{cursor}"));
        out.put_slice(b"\"");
    }
    if up_to_date {
        out.put_slice(b",\"upToDate\":true");
    }
    out.put_slice(b"}\n\n");
    closed
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

    fn control(at: u64, tail: u64, closed: bool) -> (bool, serde_json::Value) {
        let mut out = BytesMut::new();
        let closing = write_control(&mut out, at, tail, closed, &Cursor::Number(1234));
        let text = std::str::from_utf8(&out).unwrap();
        let data = text
            .strip_prefix("event: control\ndata:")
            .and_then(|rest| rest.strip_suffix("\n\n"))
            .unwrap_or_else(|| panic!("not one control event: {text:?}"));
        (closing, serde_json::from_str(data).unwrap())
    }

    #[test]
    fn control_events_say_where_to_resume_and_whether_it_is_over() {
        let (closing, behind) = control(5, 9, false);
        assert!(!closing);
        assert_eq!(
            behind,
            serde_json::json!({"streamNextOffset": offset::format(5), "streamCursor": "1234"})
        );
        let (closing, at_tail) = control(9, 9, false);
        assert!(!closing);
        assert_eq!(at_tail["upToDate"], true);
        assert_eq!(at_tail["streamCursor"], "1234");
        // Closed but not yet caught up: not the last event.
        let (closing, _) = control(5, 9, true);
        assert!(!closing);
        let (closing, last) = control(9, 9, true);
        assert!(closing);
        assert_eq!(
            last,
            serde_json::json!({
                "streamNextOffset": offset::format(9),
                "streamClosed": true,
                "upToDate": true,
            })
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
