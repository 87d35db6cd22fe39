//! Shared tails: the clients of this gateway that follow one stream with SSE from the same
//! position share one subscription to the node, whose events the gateway fans out.
//!
//! Without sharing, 1,000 subscribers of one stream are 1,000 subscriptions upstream: the node
//! writes each event 1,000 times and the gateway reads it 1,000 times before it writes it
//! 1,000 times. Shared, the node writes it once and the gateway reads it once.
//!
//! A client joins a subscription only where the node itself would start it: at the
//! subscription's position (the `streamNextOffset` of the last control event relayed), when
//! that is the client's `offset`, or, for `offset=now`, the tail a HEAD of the stream shows.
//! Events are relayed whole, each data event together with the control event after it, so a
//! client that joins between two of them misses nothing and sees nothing twice. A joining
//! client is first sent a control event of its own, as the node would send it. A client too
//! slow to keep up is ended (it resumes from its last `streamNextOffset`, as after any ended
//! SSE response) and never holds the others up. When the node ends the subscription (the
//! stream closed, `sse_max_duration`, a restart) every client's response ends with it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use parking_lot::Mutex;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use ursula_wire::{cursor, headers};

use crate::proxy::{Body, Gateway, Prepared, Refusal};

/// Events a client may fall behind the others by before its response is ended. Each shard
/// keeps its last `BACKLOG` events (shared, not copied, between shards), and an event can be
/// up to the node's `read_chunk_size`, so this also bounds a subscription's memory.
const BACKLOG: usize = 128;
/// Clients are spread over this many channels per subscription. Every client re-registers
/// with its channel after each event, under the channel's lock, while the relay is waking the
/// others under the same lock: with 1,000 clients on one channel, that contention (and the
/// thread parking it causes) cost more delivery latency than the relay's extra sends.
const SHARDS: usize = 16;
/// How long a client waits for the subscription it would join to be answered.
const OPEN_WAIT: Duration = Duration::from_secs(10);
/// How long a client waits for the subscription to reach the client's offset (an event
/// already on its way) before it subscribes on its own.
const CATCH_UP_WAIT: Duration = Duration::from_millis(250);

type Open = Arc<Mutex<HashMap<String, Arc<Tail>>>>;

/// The subscriptions this gateway shares, by stream and query (`offset` and `cursor` aside).
#[derive(Default)]
pub struct Tails {
    open: Open,
}

/// An SSE request that can share a subscription.
pub(crate) struct TailRequest {
    key: String,
    start: Start,
}

enum Start {
    Now,
    At(String),
}

impl TailRequest {
    /// `Some` for a GET with `live=sse`, one `offset` that is `now` or an offset, and no
    /// cursor that would change the cursors the node sends (one at or past the current
    /// interval is bumped by the node for that client alone).
    pub(crate) fn of(prepared: &Prepared) -> Option<Self> {
        if prepared.parts.method != Method::GET {
            return None;
        }
        let mut live = None;
        let mut offset = None;
        let mut echoed = None;
        let mut rest = Vec::new();
        for pair in prepared.parts.uri.query()?.split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match name {
                "live" => &mut live,
                "offset" => &mut offset,
                "cursor" => &mut echoed,
                _ => {
                    rest.push(pair);
                    continue;
                }
            };
            if slot.replace(value).is_some() {
                return None;
            }
        }
        if live != Some("sse") {
            return None;
        }
        if let Some(echoed) = echoed
            && (!echoed.bytes().all(|b| b.is_ascii_digit())
                || !cursor::echo_is_behind(now_ms(), Some(echoed)))
        {
            return None;
        }
        let start = match offset? {
            "now" => Start::Now,
            at if is_offset(at) => Start::At(at.to_owned()),
            _ => return None,
        };
        rest.sort_unstable();
        Some(Self {
            key: format!("{}?{}", prepared.path, rest.join("&")),
            start,
        })
    }
}

/// The node's offsets: 16 digits, `_`, 16 digits. They sort as they compare.
fn is_offset(text: &str) -> bool {
    text.len() == 33
        && text.bytes().enumerate().all(|(i, b)| {
            if i == 16 {
                b == b'_'
            } else {
                b.is_ascii_digit()
            }
        })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One subscription to the node and the clients it is relayed to.
struct Tail {
    state: Mutex<TailState>,
    /// Complete events, in order, each sent on every shard. Sent, and subscribed to, only
    /// under `state`'s lock, so that a client's first event is the one after the position it
    /// joined at.
    shards: Vec<broadcast::Sender<Bytes>>,
    next_shard: AtomicUsize,
    /// Bumped whenever `state` changes, for clients waiting to join.
    changes: watch::Sender<u64>,
}

#[derive(Default)]
struct TailState {
    phase: Phase,
    /// The node's answer, given to every client.
    head: Option<(StatusCode, HeaderMap)>,
    /// `streamNextOffset` of the last control event relayed.
    position: Option<String>,
    up_to_date: bool,
}

#[derive(Default, PartialEq, Eq)]
enum Phase {
    #[default]
    Opening,
    Open,
    Ended,
}

impl Tail {
    fn new() -> Self {
        Self {
            state: Mutex::new(TailState::default()),
            shards: (0..SHARDS).map(|_| broadcast::channel(BACKLOG).0).collect(),
            next_shard: AtomicUsize::new(0),
            changes: watch::channel(0).0,
        }
    }

    /// Call with `state` locked.
    fn subscribe(&self) -> broadcast::Receiver<Bytes> {
        let shard = self.next_shard.fetch_add(1, Ordering::Relaxed) % self.shards.len();
        self.shards[shard].subscribe()
    }

    /// Call with `state` locked.
    fn send(&self, event: &Bytes) {
        for shard in &self.shards {
            // A shard without clients refuses the event; nobody is missing it.
            let _ = shard.send(event.clone());
        }
    }

    fn clients(&self) -> usize {
        self.shards
            .iter()
            .map(broadcast::Sender::receiver_count)
            .sum()
    }

    /// Resolves once every shard has been without clients (maybe not all at once).
    async fn emptied(&self) {
        futures_util::future::join_all(self.shards.iter().map(broadcast::Sender::closed)).await;
    }

    fn notify(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    fn end(&self) {
        self.state.lock().phase = Phase::Ended;
        self.notify();
    }
}

/// Ends and forgets a tail whose opening client went away before the node answered, so the
/// clients waiting for it and those after them do not wait on a subscription nobody opens.
struct Opening {
    open: Open,
    key: String,
    tail: Arc<Tail>,
    done: bool,
}

impl Drop for Opening {
    fn drop(&mut self) {
        if !self.done {
            forget(&self.open, &self.key, &self.tail);
        }
    }
}

fn forget(open: &Open, key: &str, tail: &Arc<Tail>) {
    tail.end();
    let mut open = open.lock();
    if open.get(key).is_some_and(|t| Arc::ptr_eq(t, tail)) {
        open.remove(key);
    }
}

impl Tails {
    pub(crate) async fn serve(
        &self,
        gateway: &Gateway,
        prepared: Prepared,
        request: TailRequest,
    ) -> Result<Response<Body>, Refusal> {
        let (tail, opening) = {
            let mut open = self.open.lock();
            match open.get(&request.key) {
                Some(tail) if tail.state.lock().phase != Phase::Ended => (tail.clone(), false),
                _ => {
                    let tail = Arc::new(Tail::new());
                    open.insert(request.key.clone(), tail.clone());
                    (tail, true)
                }
            }
        };
        if opening {
            return self.open_tail(gateway, &prepared, request.key, tail).await;
        }
        match join(gateway, &prepared, &request.start, &tail).await {
            Some(response) => {
                gateway
                    .metrics
                    .shared_tail_joins
                    .fetch_add(1, Ordering::Relaxed);
                Ok(response)
            }
            None => gateway.send(&prepared).await,
        }
    }

    /// Subscribes on behalf of this client and of those that join it later.
    async fn open_tail(
        &self,
        gateway: &Gateway,
        prepared: &Prepared,
        key: String,
        tail: Arc<Tail>,
    ) -> Result<Response<Body>, Refusal> {
        let mut opening = Opening {
            open: self.open.clone(),
            key,
            tail,
            done: false,
        };
        let answer = gateway.send(prepared).await?;
        let is_event_stream = answer
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if answer.status() != StatusCode::OK || !is_event_stream {
            return Ok(answer);
        }
        gateway
            .metrics
            .shared_tails_opened
            .fetch_add(1, Ordering::Relaxed);
        let (parts, upstream) = answer.into_parts();
        let tail = opening.tail.clone();
        let first = {
            let mut state = tail.state.lock();
            state.phase = Phase::Open;
            state.head = Some((parts.status, parts.headers.clone()));
            tail.subscribe()
        };
        tail.notify();
        opening.done = true;
        tokio::spawn(relay(
            self.open.clone(),
            opening.key.clone(),
            tail,
            upstream,
        ));
        Ok(Response::from_parts(parts, client_body(None, first)))
    }
}

/// Joins `tail` where the node would start this client, or `None` if it cannot.
async fn join(
    gateway: &Gateway,
    prepared: &Prepared,
    start: &Start,
    tail: &Tail,
) -> Option<Response<Body>> {
    let mut changes = tail.changes.subscribe();
    let target = match start {
        Start::At(offset) => offset.clone(),
        Start::Now => stream_tail(gateway, prepared).await?,
    };
    let mut deadline = Instant::now() + OPEN_WAIT;
    loop {
        {
            let state = tail.state.lock();
            match state.phase {
                Phase::Ended => return None,
                Phase::Opening => {}
                Phase::Open => match state.position.as_deref() {
                    Some(position) if position == target => {
                        let (status, headers) = state.head.clone()?;
                        let first = control_event(position, state.up_to_date);
                        let events = tail.subscribe();
                        drop(state);
                        let mut response = Response::new(client_body(Some(first), events));
                        *response.status_mut() = status;
                        *response.headers_mut() = headers;
                        return Some(response);
                    }
                    Some(position) if position > target.as_str() => return None,
                    _ => deadline = deadline.min(Instant::now() + CATCH_UP_WAIT),
                },
            }
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            _ => return None,
        }
    }
}

/// The stream's tail now, by a HEAD sent under the redirect rule like any other request.
async fn stream_tail(gateway: &Gateway, prepared: &Prepared) -> Option<String> {
    let mut request = Request::builder()
        .method(Method::HEAD)
        .uri(prepared.path.as_str())
        .body(())
        .ok()?;
    *request.headers_mut() = prepared.parts.headers.clone();
    let head = Prepared {
        parts: request.into_parts().0,
        path: prepared.path.clone(),
        path_and_query: prepared.path.clone(),
        body: Bytes::new(),
        origin: None,
        write: false,
    };
    let answer = gateway.send(&head).await.ok()?;
    if answer.status() != StatusCode::OK {
        return None;
    }
    let offset = answer.headers().get(headers::STREAM_NEXT_OFFSET)?;
    offset.to_str().ok().map(str::to_owned)
}

/// The control event the node sends a client that starts at `position`.
fn control_event(position: &str, up_to_date: bool) -> Bytes {
    let cursor = cursor::next(now_ms(), None);
    let up_to_date = if up_to_date { ",\"upToDate\":true" } else { "" };
    Bytes::from(format!(
        "event: control\ndata:{{\"streamNextOffset\":\"{position}\",\"streamCursor\":\"{cursor}\"{up_to_date}}}\n\n"
    ))
}

fn client_body(first: Option<Bytes>, events: broadcast::Receiver<Bytes>) -> Body {
    let frames = futures_util::stream::unfold((first, events), |(first, mut events)| async move {
        let next = match first {
            Some(first) => first,
            // Closed: the subscription ended. Lagged: this client fell `BACKLOG` events
            // behind; it resumes from its last control event.
            None => events.recv().await.ok()?,
        };
        Some((Ok(Frame::data(next)), (None, events)))
    });
    StreamBody::new(frames).boxed_unsync()
}

/// Reads the node's events and relays them whole until the node ends the subscription or the
/// last client leaves.
async fn relay(open: Open, key: String, tail: Arc<Tail>, mut upstream: Body) {
    let mut pending = Events::default();
    loop {
        let frame = tokio::select! {
            frame = upstream.frame() => frame,
            () = tail.emptied() => {
                // A client may have joined since; it is checked under the lock joins take.
                let mut state = tail.state.lock();
                if tail.clients() == 0 {
                    state.phase = Phase::Ended;
                    break;
                }
                continue;
            }
        };
        let Some(Ok(frame)) = frame else { break };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        pending.push(&data);
        if let Some(released) = pending.release() {
            let mut state = tail.state.lock();
            if let Some(control) = released.control {
                // After the closing control event nobody joins: the node ends the
                // subscription, and a client that comes now must be told the stream closed.
                let control = control.filter(|c| !c.closed);
                state.up_to_date = control.as_ref().is_some_and(|c| c.up_to_date);
                state.position = control.map(|c| c.next_offset);
            }
            tail.send(&released.bytes);
            drop(state);
            tail.notify();
        }
    }
    forget(&open, &key, &tail);
}

/// Bytes of the node's event stream not yet relayed.
#[derive(Default)]
struct Events {
    buffer: BytesMut,
    /// How far `buffer` has been split into complete events.
    scanned: usize,
    /// The end of the complete events that can be relayed: a data event waits for the
    /// control event after it, and so does anything behind it.
    releasable: usize,
    /// The last control event among the releasable ones, if there is one: `None` inside if
    /// it could not be read, and then no client joins until one can.
    last_control: Option<Option<Control>>,
}

/// What a control event says of the position after it.
#[derive(Debug, PartialEq, Eq)]
struct Control {
    next_offset: String,
    up_to_date: bool,
    /// The closing control event: the node ends the subscription after it.
    closed: bool,
}

struct Released {
    bytes: Bytes,
    control: Option<Option<Control>>,
}

impl Events {
    fn push(&mut self, data: &[u8]) {
        self.buffer.extend_from_slice(data);
        while let Some(length) = first_event_length(&self.buffer[self.scanned..]) {
            let event = &self.buffer[self.scanned..self.scanned + length];
            let nothing_waits = self.releasable == self.scanned;
            let end = self.scanned + length;
            if event.starts_with(b"event: control\n") {
                self.last_control = Some(parse_control(event));
                self.releasable = end;
            } else if nothing_waits && !event.starts_with(b"event: data\n") {
                // A comment (keep-alive) with no data event waiting before it.
                self.releasable = end;
            }
            self.scanned = end;
        }
    }

    fn release(&mut self) -> Option<Released> {
        if self.releasable == 0 {
            return None;
        }
        let bytes = self.buffer.split_to(self.releasable).freeze();
        self.scanned -= self.releasable;
        self.releasable = 0;
        Some(Released {
            bytes,
            control: self.last_control.take(),
        })
    }
}

/// The length of the first complete event in `text`, its blank line included.
fn first_event_length(text: &[u8]) -> Option<usize> {
    text.windows(2).position(|w| w == b"\n\n").map(|at| at + 2)
}

fn parse_control(event: &[u8]) -> Option<Control> {
    let text = std::str::from_utf8(event).ok()?;
    let data = text.lines().find_map(|line| line.strip_prefix("data:"))?;
    let value: serde_json::Value = serde_json::from_str(data.trim_start()).ok()?;
    let flag = |name: &str| value.get(name).and_then(serde_json::Value::as_bool) == Some(true);
    Some(Control {
        next_offset: value.get("streamNextOffset")?.as_str()?.to_owned(),
        up_to_date: flag("upToDate"),
        closed: flag("streamClosed"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const P1: &str = "0000000000000000_0000000000000005";
    const P2: &str = "0000000000000000_0000000000000009";

    fn control(offset: &str) -> String {
        format!(
            "event: control\ndata:{{\"streamNextOffset\":\"{offset}\",\"streamCursor\":\"7\",\"upToDate\":true}}\n\n"
        )
    }

    fn data(text: &str) -> String {
        format!("event: data\ndata:{text}\n\n")
    }

    /// Every way of cutting the node's bytes into frames relays the same events, each data
    /// event together with its control event, and the position after them.
    #[test]
    fn events_are_relayed_whole_however_the_bytes_arrive() {
        let stream = format!(
            "{}{}{}: keep-alive\n\n{}{}",
            control(P1),
            data("a"),
            control(P2),
            data("b"),
            "event: control\ndata:{\"streamNextOffset\":\"0000000000000000_0000000000000011\",\"streamClosed\":true,\"upToDate\":true}\n\n"
        );
        let bytes = stream.as_bytes();
        for cut in 1..bytes.len() {
            for second in [cut, (cut + 7).min(bytes.len())] {
                let mut events = Events::default();
                let mut relayed = Vec::new();
                for piece in [&bytes[..cut], &bytes[cut..second], &bytes[second..]] {
                    events.push(piece);
                    if let Some(released) = events.release() {
                        let text = String::from_utf8(released.bytes.to_vec()).unwrap();
                        // Nothing relayed ends inside an event or between data and control.
                        assert!(text.ends_with("\n\n"), "{text:?}");
                        assert!(!text.ends_with(&data("a")) && !text.ends_with(&data("b")));
                        relayed.push((text, released.control));
                    }
                }
                let all: String = relayed.iter().map(|(t, _)| t.as_str()).collect();
                assert_eq!(all, stream, "cut at {cut}, {second}");
                let last = relayed
                    .last()
                    .unwrap()
                    .1
                    .as_ref()
                    .unwrap()
                    .as_ref()
                    .unwrap();
                assert!(last.closed && last.up_to_date);
            }
        }
    }

    #[test]
    fn a_keep_alive_waits_behind_a_data_event_and_controls_are_read() {
        let mut events = Events::default();
        events.push(data("a").as_bytes());
        events.push(b": keep-alive\n\n");
        assert!(events.release().is_none());
        events.push(control(P2).as_bytes());
        let released = events.release().unwrap();
        assert_eq!(
            released.control,
            Some(Some(Control {
                next_offset: P2.into(),
                up_to_date: true,
                closed: false,
            }))
        );
        events.push(b": keep-alive\n\n");
        let released = events.release().unwrap();
        assert_eq!(&released.bytes[..], b": keep-alive\n\n");
        assert_eq!(released.control, None);
        // A control event that cannot be read is relayed, and leaves no position to join at.
        events.push(b"event: control\ndata:{oops\n\n");
        assert_eq!(events.release().unwrap().control, Some(None));
    }

    #[test]
    fn joining_clients_get_the_control_event_the_node_would_send() {
        let event = control_event(P1, true);
        let text = std::str::from_utf8(&event).unwrap();
        let json = text
            .strip_prefix("event: control\ndata:")
            .and_then(|t| t.strip_suffix("\n\n"))
            .unwrap();
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(value["streamNextOffset"], P1);
        assert_eq!(value["upToDate"], true);
        assert_eq!(
            value["streamCursor"].as_str().unwrap(),
            cursor::next(now_ms(), None)
        );
        let behind = control_event(P1, false);
        assert!(!std::str::from_utf8(&behind).unwrap().contains("upToDate"));
    }

    #[test]
    fn which_requests_share_a_subscription() {
        let current = cursor::interval(now_ms());
        let behind = format!("/d/s?offset=now&live=sse&cursor={}", current - 1);
        let ahead = format!("/d/s?offset=now&live=sse&cursor={current}");
        let at = format!("/d/s?live=sse&offset={P1}");
        let cases: Vec<(Method, &str, Option<&str>)> = vec![
            (Method::GET, "/d/s?offset=now&live=sse", Some("/d/s?")),
            (Method::GET, &at, Some("/d/s?")),
            (
                Method::GET,
                "/d/s?x=2&offset=now&a=1&live=sse",
                Some("/d/s?a=1&x=2"),
            ),
            (Method::GET, &behind, Some("/d/s?")),
            (Method::GET, &ahead, None),
            (Method::GET, "/d/s?offset=now&live=sse&cursor=%31", None),
            (Method::GET, "/d/s?offset=-1&live=sse", None),
            (Method::GET, "/d/s?live=sse", None),
            (Method::GET, "/d/s?offset=now&offset=now&live=sse", None),
            (Method::GET, "/d/s?offset=now&live=sse&live=sse", None),
            (Method::GET, "/d/s?offset=now&live=long-poll", None),
            (Method::GET, "/d/s?offset=now", None),
            (Method::HEAD, "/d/s?offset=now&live=sse", None),
        ];
        for (method, uri, key) in cases {
            let (parts, ()) = Request::builder()
                .method(method.clone())
                .uri(uri)
                .body(())
                .unwrap()
                .into_parts();
            let prepared = Prepared {
                path: parts.uri.path().to_owned(),
                path_and_query: uri.to_owned(),
                parts,
                body: Bytes::new(),
                origin: None,
                write: false,
            };
            let found = TailRequest::of(&prepared).map(|r| r.key);
            assert_eq!(found.as_deref(), key, "{method} {uri}");
        }
        assert!(is_offset(P1));
        assert!(!is_offset("0000000000000000-0000000000000005"));
        assert!(!is_offset("5"));
    }
}
