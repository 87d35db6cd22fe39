//! Shared tails: the clients of this gateway that follow one stream with SSE from the same
//! position share one subscription to the node, whose events the gateway fans out.
//!
//! Without sharing, 1,000 subscribers of one stream are 1,000 subscriptions upstream: the node
//! writes each event 1,000 times and the gateway reads it 1,000 times before it writes it
//! 1,000 times. Shared, the node writes it once and the gateway reads it once.
//!
//! A client joins a subscription only where the node itself would start it: at the
//! subscription's position (the `streamNextOffset` of the last control event relayed), when
//! that is the client's `offset`, or, for `offset=now`, the tail a read of the stream at
//! `offset=now` shows (that read also resets a sliding TTL, as the client's own request
//! would). Events are relayed whole, each data event together with the control event after
//! it, so a client that joins between two of them misses nothing and sees nothing twice. A
//! joining client is first sent a control event of its own, as the node would send it; a
//! client that echoed a cursor the node would bump gets control events with cursors of its
//! own. A client too slow to keep up is ended (it resumes from its last `streamNextOffset`,
//! as after any ended SSE response) and never holds the others up. When the node ends the
//! subscription (the stream closed, `sse_max_duration`, a restart) every client's response
//! ends with it.

mod events;
mod request;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use parking_lot::Mutex;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use ursula_wire::{cursor, headers};

use crate::prepared::{Prepared, Upstream};
use crate::refusal::{Body, Refusal};
use events::{Batch, Events, control_event};
use request::Start;
pub(crate) use request::TailRequest;

/// Batches a client may fall behind the others by before its response is ended. The channel
/// keeps its last `BACKLOG` batches, and a batch can be up to the node's `read_chunk_size`,
/// so this also bounds a subscription's memory (its slots take ~5 KiB: a gateway may hold a
/// subscription for each of many streams with a single client). One channel for all the
/// clients: 16 channels, to spread the lock every client re-registers under after each batch,
/// measured no better at 1,000 clients (p99 better in 5 of 10 alternating pairs).
const BACKLOG: usize = 128;
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

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One subscription to the node and the clients it is relayed to.
struct Tail {
    state: Mutex<TailState>,
    /// Batches of whole events, in order. Sent, and subscribed to, only under `state`'s lock,
    /// so that a client's first batch is the one after the position it joined at. Closed when
    /// the last `Arc<Tail>` goes (the relay's, once it ended and forgot the tail), which ends
    /// every client's response once it has what was sent.
    events: broadcast::Sender<Arc<Batch>>,
    /// Bumped whenever `state` changes, for clients waiting to join.
    changes: watch::Sender<u64>,
}

#[derive(Default)]
struct TailState {
    phase: Phase,
    /// The node's answer, given to every client.
    head: Option<(StatusCode, HeaderMap)>,
    /// `streamNextOffset` of the last control event relayed; `None` after one that closed
    /// the stream or could not be read.
    position: Option<String>,
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
            events: broadcast::channel(BACKLOG).0,
            changes: watch::channel(0).0,
        }
    }

    /// Call with `state` locked.
    fn subscribe(&self) -> broadcast::Receiver<Arc<Batch>> {
        self.events.subscribe()
    }

    /// Call with `state` locked.
    fn send(&self, batch: Arc<Batch>) {
        // Without clients the channel refuses the batch; nobody is missing it.
        let _ = self.events.send(batch);
    }

    fn clients(&self) -> usize {
        self.events.receiver_count()
    }

    fn notify(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    fn end(&self) {
        self.state.lock().phase = Phase::Ended;
        self.notify();
    }
}

/// Ends and forgets a tail unless the node answered its opening client with an event
/// stream, so that the clients waiting for it, and those after them, do not wait on a
/// subscription nobody opens (the opening client went away, or was answered otherwise).
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
    /// Subscriptions open now, and the clients they are relayed to.
    pub fn gauges(&self) -> (usize, usize) {
        let open = self.open.lock();
        (open.len(), open.values().map(|tail| tail.clients()).sum())
    }

    pub(crate) async fn serve(
        &self,
        gateway: &impl Upstream,
        mut prepared: Prepared,
        request: TailRequest,
    ) -> Result<Response<Body>, Refusal> {
        let joining = {
            let mut open = self.open.lock();
            match open.get(&request.key) {
                Some(tail) if tail.state.lock().phase != Phase::Ended => Ok(tail.clone()),
                _ => {
                    let tail = Arc::new(Tail::new());
                    open.insert(request.key.clone(), tail.clone());
                    Err(Opening {
                        open: self.open.clone(),
                        key: request.key.clone(),
                        tail,
                        done: false,
                    })
                }
            }
        };
        match joining {
            Err(opening) => {
                prepared.path_and_query = request.upstream_path_and_query;
                open_tail(gateway, &prepared, opening, request.echo).await
            }
            Ok(tail) => match join(gateway, &prepared, &request, &tail).await {
                Some(response) => {
                    gateway
                        .metrics()
                        .shared_tail_joins
                        .fetch_add(1, Ordering::Relaxed);
                    Ok(response)
                }
                None => gateway.send(&prepared).await,
            },
        }
    }
}

/// Subscribes on behalf of this client and of those that join it later.
async fn open_tail(
    gateway: &impl Upstream,
    prepared: &Prepared,
    mut opening: Opening,
    echo: Option<cursor::Cursor>,
) -> Result<Response<Body>, Refusal> {
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
        .metrics()
        .shared_tails_opened
        .fetch_add(1, Ordering::Relaxed);
    let (parts, upstream) = answer.into_parts();
    let tail = opening.tail.clone();
    let first = {
        let mut state = tail.state.lock();
        state.phase = Phase::Open;
        let mut head = parts.headers.clone();
        // Each client's answer gets its own date.
        head.remove(header::DATE);
        state.head = Some((parts.status, head));
        tail.subscribe()
    };
    tail.notify();
    opening.done = true;
    tokio::spawn(relay(
        opening.open.clone(),
        opening.key.clone(),
        tail,
        upstream,
    ));
    let cursor = cursor::Session::new(now_ms(), echo);
    Ok(Response::from_parts(
        parts,
        client_body(None, first, cursor),
    ))
}

/// Joins `tail` where the node would start this client, or `None` if it cannot.
async fn join(
    gateway: &impl Upstream,
    prepared: &Prepared,
    request: &TailRequest,
    tail: &Tail,
) -> Option<Response<Body>> {
    let mut changes = tail.changes.subscribe();
    let stream_tail = read_tail(gateway, prepared).await?;
    let target = match &request.start {
        Start::At(offset) => offset.as_str(),
        Start::Now => stream_tail.as_str(),
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
                        let mut cursor = cursor::Session::new(now_ms(), request.echo.clone());
                        let first = control_event(
                            position,
                            &cursor.at(now_ms()).to_string(),
                            position == stream_tail,
                        );
                        let events = tail.subscribe();
                        drop(state);
                        let body = client_body(Some(first), events, cursor);
                        let mut response = Response::new(body);
                        *response.status_mut() = status;
                        *response.headers_mut() = headers;
                        return Some(response);
                    }
                    Some(position) if position > target => return None,
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

/// The stream's tail now, by a read at `offset=now` sent under the redirect rule like any
/// other request. It also resets the stream's sliding TTL, as the client's own read would.
async fn read_tail(gateway: &impl Upstream, prepared: &Prepared) -> Option<String> {
    let read = prepared.read_of_stream("offset=now")?;
    let answer = gateway.send(&read).await.ok()?;
    if answer.status() != StatusCode::OK {
        return None;
    }
    let offset = answer.headers().get(headers::STREAM_NEXT_OFFSET)?;
    offset
        .to_str()
        .ok()
        .filter(|o| request::is_offset(o))
        .map(str::to_owned)
}

/// One client's events: `first` (its own control event, when it joined), then every batch,
/// as the node sent it or, while the client's cursors are its own (it echoed one the node
/// would bump), with control events carrying them.
fn client_body(
    first: Option<Bytes>,
    events: broadcast::Receiver<Arc<Batch>>,
    cursor: cursor::Session,
) -> Body {
    let queue: VecDeque<Bytes> = first.into_iter().collect();
    let state = (queue, events, cursor);
    let frames = futures_util::stream::unfold(state, |(mut queue, mut events, mut cursor)| {
        async move {
            while queue.is_empty() {
                // Closed: the subscription ended. Lagged: this client fell `BACKLOG` batches
                // behind; it resumes from its last control event.
                let batch = events.recv().await.ok()?;
                let now = now_ms();
                if cursor.is_ahead(now) {
                    batch.render(|| cursor.at(now).to_string(), &mut queue);
                } else {
                    queue.push_back(batch.bytes.clone());
                }
            }
            let next = queue.pop_front()?;
            Some((
                Ok::<_, std::convert::Infallible>(Frame::data(next)),
                (queue, events, cursor),
            ))
        }
    });
    Body::new(StreamBody::new(frames))
}

/// Reads the node's events and relays them whole until the node ends the subscription or the
/// last client leaves.
async fn relay(open: Open, key: String, tail: Arc<Tail>, mut upstream: Body) {
    let mut pending = Events::default();
    loop {
        let frame = tokio::select! {
            frame = upstream.frame() => frame,
            () = tail.events.closed() => {
                // A client may have joined since; it is checked under the lock joins take.
                let mut state = tail.state.lock();
                if tail.clients() == 0 {
                    state.phase = Phase::Ended;
                    break;
                }
                continue;
            }
        };
        let Some(Ok(frame)) = frame else {
            // Nobody joins from here on: what the node did not send will not come.
            tail.state.lock().phase = Phase::Ended;
            break;
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        pending.push(&data);
        if let Some(batch) = pending.release() {
            {
                let mut state = tail.state.lock();
                if let Some(at) = batch.last_control() {
                    // After the closing control event nobody joins: the node ends the
                    // subscription, and a client that comes now must be told it closed.
                    state.position = at
                        .control
                        .as_ref()
                        .filter(|c| !c.closed)
                        .map(|c| c.next_offset.clone());
                }
                tail.send(Arc::new(batch));
            }
            tail.notify();
        }
    }
    forget(&open, &key, &tail);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_client_gets_every_batch_until_the_subscription_ends() {
        let tail = Arc::new(Tail::new());
        let mut receivers: Vec<_> = (0..100).map(|_| tail.subscribe()).collect();
        assert_eq!(tail.clients(), 100);
        let mut events = Events::default();
        events.push(b": keep-alive\n\n");
        tail.send(Arc::new(events.release().unwrap()));
        drop(tail);
        for receiver in &mut receivers {
            assert_eq!(
                &receiver.recv().await.unwrap().bytes[..],
                b": keep-alive\n\n"
            );
            assert!(receiver.recv().await.is_err(), "closed with the last tail");
        }
    }
}
