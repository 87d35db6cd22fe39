//! The gateway's end of the link (`ursula_wire::link`): one connection per upstream node,
//! carrying every forwarded request that has a bounded answer. Requests that are ready go out
//! with one system call, and answers that have arrived are read with one.
//!
//! A request the node cannot have seen (the link could not be opened, it was closing, the
//! node's go-away excluded it) is `NotSent`, and the caller sends it over HTTP instead. One that
//! was written but not answered is `Lost`: the node may have applied it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Method};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use ursula_wire::link::{self, Frame};

use crate::upstream::Origin;

/// Requests written with one call at most.
const REQUESTS_PER_WRITE: usize = 256;
const READ_BUFFER: usize = 64 * 1024;
/// The longest upgrade answer read before giving up on it.
const MAX_UPGRADE_ANSWER: usize = 16 * 1024;
/// How long an upstream that refused the link, or could not be reached, is sent HTTP only.
const REFUSED_BACKOFF: Duration = Duration::from_secs(30);
const UNREACHABLE_BACKOFF: Duration = Duration::from_secs(1);
/// How long a node may leave the link's bytes unacknowledged, or its idle probes unanswered.
const DEAD_PEER: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("the request was not sent on the link")]
    NotSent,
    #[error("the link closed before the node answered: {0}")]
    Lost(String),
}

/// An answer from the node.
pub type Answer = link::Answer;

struct Outgoing {
    method: Method,
    target: String,
    headers: HeaderMap,
    body: Bytes,
    reply: oneshot::Sender<Result<Answer, SendError>>,
}

/// The link to each upstream, opened when first needed and again after it closes.
pub struct Links {
    slots: Vec<Slot>,
    connect_timeout: Duration,
}

struct Slot {
    /// `host:port`.
    address: String,
    host: http::HeaderValue,
    /// For an `https://` node: TLS to it, checked against the name in its URL.
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    open: Mutex<Option<Arc<Connection>>>,
    /// Held by the one request that opens the link; the others use HTTP meanwhile.
    opening: tokio::sync::Mutex<()>,
    http_only_until: Mutex<Option<Instant>>,
}

impl Links {
    /// One link per node of `origins`; those that are `https://` go over TLS with `tls`
    /// (which trusts the CA of `upstream_ca_file`).
    pub fn new<'a>(
        origins: impl Iterator<Item = &'a Origin>,
        connect_timeout: Duration,
        tls: &Arc<rustls::ClientConfig>,
    ) -> Self {
        let slots = origins
            .map(|origin| Slot {
                address: origin.address().to_owned(),
                host: http::HeaderValue::from_str(origin.address())
                    .unwrap_or(http::HeaderValue::from_static("localhost")),
                tls: origin
                    .is_tls()
                    .then(|| {
                        let name =
                            rustls::pki_types::ServerName::try_from(origin.host().to_owned())
                                .ok()?;
                        Some((tokio_rustls::TlsConnector::from(tls.clone()), name))
                    })
                    .flatten(),
                open: Mutex::new(None),
                opening: tokio::sync::Mutex::new(()),
                http_only_until: Mutex::new(None),
            })
            .collect();
        Self {
            slots,
            connect_timeout,
        }
    }

    /// Sends a request to upstream `index` and waits for its answer.
    pub async fn send(
        &self,
        index: usize,
        method: Method,
        target: String,
        mut headers: HeaderMap,
        body: Bytes,
    ) -> Result<Answer, SendError> {
        let slot = self.slots.get(index).ok_or(SendError::NotSent)?;
        // As over HTTP, the node sees itself as the host: the URLs it answers with (a created
        // stream's `Location`) name it, and the proxy rewrites them to the gateway's.
        headers.insert(http::header::HOST, slot.host.clone());
        let connection = self.connection(slot).await.ok_or(SendError::NotSent)?;
        let (reply, answer) = oneshot::channel();
        connection
            .outgoing
            .send(Outgoing {
                method,
                target,
                headers,
                body,
                reply,
            })
            .map_err(|_| SendError::NotSent)?;
        // Every request that was not written is answered `NotSent` explicitly; a reply dropped
        // unanswered proves nothing.
        answer
            .await
            .unwrap_or_else(|_| Err(SendError::Lost("the gateway link went away".into())))
    }

    async fn connection(&self, slot: &Slot) -> Option<Arc<Connection>> {
        if let Some(open) = slot.usable() {
            return Some(open);
        }
        if slot.http_only() {
            return None;
        }
        // One request opens the link; the others go over HTTP meanwhile rather than wait.
        let Ok(_opening) = slot.opening.try_lock() else {
            return None;
        };
        // The last opener may have just finished, or just failed.
        if let Some(open) = slot.usable() {
            return Some(open);
        }
        if slot.http_only() {
            return None;
        }
        match tokio::time::timeout(self.connect_timeout, open(slot)).await {
            Ok(Ok(connection)) => {
                *slot.open.lock() = Some(connection.clone());
                Some(connection)
            }
            Ok(Err(Refused::NotALink(answer))) => {
                tracing::info!(upstream = %slot.address, %answer, "upstream does not offer the gateway link; using HTTP");
                *slot.http_only_until.lock() = Some(Instant::now() + REFUSED_BACKOFF);
                None
            }
            Ok(Err(Refused::Io(error))) => {
                tracing::debug!(upstream = %slot.address, %error, "cannot open the gateway link");
                *slot.http_only_until.lock() = Some(Instant::now() + UNREACHABLE_BACKOFF);
                None
            }
            Err(_) => {
                *slot.http_only_until.lock() = Some(Instant::now() + UNREACHABLE_BACKOFF);
                None
            }
        }
    }
}

impl Slot {
    /// Whether the upstream is sent HTTP only for now (it refused the link, or a try to open
    /// one failed a moment ago).
    fn http_only(&self) -> bool {
        self.http_only_until
            .lock()
            .is_some_and(|until| Instant::now() < until)
    }

    fn usable(&self) -> Option<Arc<Connection>> {
        self.open
            .lock()
            .as_ref()
            .filter(|c| c.state.usable.load(Ordering::Acquire))
            .cloned()
    }
}

enum Refused {
    NotALink(String),
    Io(std::io::Error),
}

impl From<std::io::Error> for Refused {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

/// A link's byte stream: TCP, or TLS over it.
trait Wire: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Wire for T {}

/// Connects (over TLS to an `https://` node) and upgrades; frames the node sent right after
/// its `101` are kept.
async fn open(slot: &Slot) -> Result<Arc<Connection>, Refused> {
    let address = slot.address.as_str();
    let stream = TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    // A node whose host dies without a word must not hold the link's requests forever: data
    // unacknowledged for `DEAD_PEER` fails the link, and so does an idle link whose probes
    // go unanswered.
    let socket = socket2::SockRef::from(&stream);
    socket.set_tcp_user_timeout(Some(DEAD_PEER))?;
    socket.set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(DEAD_PEER / 2)
            .with_interval(DEAD_PEER / 10)
            .with_retries(5),
    )?;
    let mut stream: Box<dyn Wire> = match &slot.tls {
        Some((connector, name)) => Box::new(connector.connect(name.clone(), stream).await?),
        None => Box::new(stream),
    };
    let upgrade = format!(
        "GET {} HTTP/1.1\r\nhost: {address}\r\nconnection: upgrade\r\nupgrade: {}\r\n\r\n",
        link::PATH,
        link::PROTOCOL
    );
    stream.write_all(upgrade.as_bytes()).await?;
    let mut buffer = BytesMut::with_capacity(READ_BUFFER);
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if buffer.len() > MAX_UPGRADE_ANSWER {
            return Err(Refused::NotALink("an answer head too long".into()));
        }
        if stream.read_buf(&mut buffer).await? == 0 {
            return Err(Refused::NotALink("the connection closed".into()));
        }
    };
    let head = buffer.split_to(head_end);
    let status_line = head[..]
        .split(|b| *b == b'\r')
        .next()
        .map(|line| String::from_utf8_lossy(line).into_owned())
        .unwrap_or_default();
    if !status_line.starts_with("HTTP/1.1 101") {
        return Err(Refused::NotALink(status_line));
    }
    let (outgoing, queued) = mpsc::unbounded_channel();
    let state = Arc::new(LinkState {
        usable: AtomicBool::new(true),
        pending: Mutex::new(Pending::default()),
    });
    tokio::spawn(drive(state.clone(), stream, queued, buffer));
    Ok(Arc::new(Connection { outgoing, state }))
}

struct Connection {
    outgoing: mpsc::UnboundedSender<Outgoing>,
    state: Arc<LinkState>,
}

struct LinkState {
    /// False once the link is closing: new requests go over a new link, or HTTP.
    usable: AtomicBool,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    next_id: u64,
    /// Requests written and not answered yet.
    waiting: HashMap<u64, oneshot::Sender<Result<Answer, SendError>>>,
    /// Set by a go-away: requests after it are not answered, so none may be written.
    closed: bool,
}

impl LinkState {
    /// Every request still waiting gets `error`; none is written from now on.
    fn close(&self, error: impl Fn() -> SendError) {
        self.close_after(0, error);
    }

    /// Requests after `last` that are still waiting get `error` (IDs start at 1); none is
    /// written from now on.
    fn close_after(&self, last: u64, error: impl Fn() -> SendError) {
        self.usable.store(false, Ordering::Release);
        let mut pending = self.pending.lock();
        pending.closed = true;
        for (_, reply) in pending.waiting.extract_if(|id, _| *id > last) {
            let _ = reply.send(Err(error()));
        }
    }
}

/// The link's one task: writes the queued requests as they come (every request that is
/// ready in one call), and hands each answer that arrives to its request. Reading goes on
/// while requests are written, so that neither side can wait for the other with both
/// directions full. Ends when the node closes the link, or once every `Connection` is gone
/// (the slot opened a new link) and no answer is awaited.
async fn drive(
    link: Arc<LinkState>,
    stream: Box<dyn Wire>,
    mut queued: mpsc::UnboundedReceiver<Outgoing>,
    mut buffer: BytesMut,
) {
    // However this task ends (a panic included), no request is left waiting.
    let mut closing = CloseOnDrop {
        link: link.clone(),
        reason: "the gateway link's task ended".to_owned(),
    };
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut batch = Vec::with_capacity(REQUESTS_PER_WRITE);
    let mut out = BytesMut::with_capacity(READ_BUFFER);
    let mut accepting = true;
    let mut writing = true;
    let reason = loop {
        match take_answers(&link, &mut buffer) {
            Err(reason) => break reason,
            Ok(Taken::GoAway) if writing => {
                // The node reads nothing more: what is not written yet never will be (the
                // requests were answered `NotSent`), and ending our side lets it close.
                out.clear();
                writing = false;
                let _ = writer.shutdown().await;
            }
            Ok(_) => {}
        }
        if !accepting && out.is_empty() && link.pending.lock().waiting.is_empty() {
            break "no longer used".to_owned();
        }
        // In steps: a frame's claimed length is not memory to set aside before it comes.
        buffer.reserve(link::wanted(&buffer).clamp(READ_BUFFER, 16 * READ_BUFFER));
        let event = tokio::select! {
            read = reader.read_buf(&mut buffer) => Event::Read(read),
            written = writer.write(&out), if writing && !out.is_empty() => Event::Written(written),
            taken = queued.recv_many(&mut batch, REQUESTS_PER_WRITE), if accepting => Event::Queued(taken),
        };
        match event {
            Event::Read(Ok(0)) => break "the node closed the link".to_owned(),
            Event::Read(Ok(_)) => {}
            Event::Read(Err(error)) => break format!("read failed: {error}"),
            Event::Written(Ok(written)) if written > 0 => {
                out.advance(written);
                if out.is_empty() && out.capacity() > 16 * READ_BUFFER {
                    out = BytesMut::with_capacity(READ_BUFFER);
                }
            }
            Event::Written(result) => break format!("write failed: {result:?}"),
            Event::Queued(0) => accepting = false,
            Event::Queued(_) => {
                // The client connections whose requests are parsed and about to be queued
                // run first: their requests then share this write instead of one each.
                tokio::task::yield_now().await;
                while batch.len() < REQUESTS_PER_WRITE {
                    match queued.try_recv() {
                        Ok(request) => batch.push(request),
                        Err(_) => break,
                    }
                }
                encode_requests(&link, &mut batch, &mut out);
            }
        }
    };
    tracing::debug!(%reason, "gateway link closed");
    closing.reason = reason;
    drop(closing);
    // What is still queued was never written.
    queued.close();
    while let Ok(request) = queued.try_recv() {
        let _ = request.reply.send(Err(SendError::NotSent));
    }
}

enum Event {
    Read(std::io::Result<usize>),
    Written(std::io::Result<usize>),
    Queued(usize),
}

/// Closes the link when dropped: every request still waiting gets `Lost` with the reason.
struct CloseOnDrop {
    link: Arc<LinkState>,
    reason: String,
}

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.link.close(|| SendError::Lost(self.reason.clone()));
    }
}

/// Encodes the batch into `out`, giving each request the next ID.
fn encode_requests(link: &LinkState, batch: &mut Vec<Outgoing>, out: &mut BytesMut) {
    let mut pending = link.pending.lock();
    for request in batch.drain(..) {
        if pending.closed {
            let _ = request.reply.send(Err(SendError::NotSent));
            continue;
        }
        let id = pending.next_id + 1;
        let encoded = link::encode_request(
            out,
            id,
            &request.method,
            &request.target,
            &request.headers,
            &request.body,
        );
        match encoded {
            Ok(()) => {
                pending.next_id = id;
                pending.waiting.insert(id, request.reply);
            }
            // HTTP carries what a frame cannot (a target over 64 KiB, say).
            Err(_) => {
                let _ = request.reply.send(Err(SendError::NotSent));
            }
        }
    }
}

enum Taken {
    Answers,
    GoAway,
}

/// Hands every whole answer in `buffer` to its request; an error ends the link.
fn take_answers(link: &LinkState, buffer: &mut BytesMut) -> Result<Taken, String> {
    let mut taken = Taken::Answers;
    loop {
        match link::decode(buffer) {
            Ok(Some(Frame::Answer(answer))) => {
                let waiting = link.pending.lock().waiting.remove(&answer.id);
                if let Some(reply) = waiting {
                    let _ = reply.send(Ok(answer));
                }
            }
            Ok(Some(Frame::GoAway { last })) => {
                // The node answers up to `last` and never saw the rest.
                link.close_after(last, || SendError::NotSent);
                taken = Taken::GoAway;
            }
            Ok(Some(Frame::Request(_))) => return Err("the node sent a request frame".to_owned()),
            Ok(None) => return Ok(taken),
            Err(error) => return Err(error.to_string()),
        }
    }
}
