//! The node's end of the gateway link (`ursula_wire::link`): request frames in, each handled
//! exactly as the same request over HTTP, answer frames out, every answer that is ready
//! written with one system call.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use http::header::{CONTENT_LENGTH, UPGRADE};
use http::response::Parts;
use http::{HeaderValue, Method, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tower::ServiceExt;
use ursula_wire::ErrorToken;
use ursula_wire::link::{self, Frame};

use super::App;
use super::error::ApiError;
use super::layers::ClientService;
use super::marking::Stage;
use super::request::{self, Live};
use super::response::{Body, Reply};
use crate::shutdown::until_stopping;

/// The read buffer's size between frames; a larger frame grows it for as long as it takes.
const READ_BUFFER: usize = 64 * 1024;

/// How many links are open.
pub struct Links(watch::Sender<usize>);

impl Default for Links {
    fn default() -> Self {
        Self(watch::Sender::new(0))
    }
}

impl Links {
    pub async fn all_closed(&self) {
        let _ = self.0.subscribe().wait_for(|open| *open == 0).await;
    }
}

/// Counts a link open from its accepted upgrade until its last answer is written.
struct OpenLink(Arc<App>);

impl OpenLink {
    fn new(app: Arc<App>) -> Self {
        app.links.0.send_modify(|open| *open += 1);
        Self(app)
    }
}

impl Drop for OpenLink {
    fn drop(&mut self) {
        self.0.links.0.send_modify(|open| *open -= 1);
    }
}

/// `GET /_ursula/link` asking to upgrade to `ursula-link/1`: agrees, and the link runs once
/// hyper hands the connection over, its requests answered by `service`, counted open (the
/// listener's shutdown waits) until its last answer is written. Without the upgrade, the path
/// is no route.
pub fn accept(app: Arc<App>, mut request: Request, service: ClientService) -> Response<Body> {
    let upgrade = request.method() == Method::GET
        && request
            .headers()
            .get(UPGRADE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(link::PROTOCOL.as_bytes()));
    if !upgrade {
        return super::extract::unrouted(&app, request.method(), request.uri().path())
            .into_response();
    }
    let upgrading = hyper::upgrade::on(&mut request);
    let open = OpenLink::new(app);
    tokio::spawn(async move {
        let upgraded = match upgrading.await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                tracing::debug!(%error, "gateway link upgrade failed");
                return;
            }
        };
        // Bytes hyper read past the upgrade request are the upgraded stream's first.
        serve(&open.0, service, TokioIo::new(upgraded)).await;
    });
    Reply::new(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "upgrade")
        .header("upgrade", link::PROTOCOL)
        .build()
}

/// An answer ready to be written.
struct Finished {
    id: u64,
    head: Parts,
    body: Bytes,
}

/// Where the link's input is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Input {
    Requests,
    /// After the go-away: what still arrives is read and dropped, so that closing does not
    /// reset the connection (a reset discards answers not yet delivered), until the gateway
    /// ends its side or `DRAIN_LIMIT` passes.
    Draining,
    Ended,
}

/// Requests of one link handled at once at most; past it, reading waits.
const MAX_IN_FLIGHT: usize = 4096;
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// Reads requests until the gateway closes the link, it breaks the framing, or the node
/// stops; then the answers of requests already read are still written.
///
/// One task does it all: it reads every frame that has arrived, starts each request's
/// handler, and writes the answers that are ready as they come. Handlers finish on the
/// storage threads' wake-ups; nothing is handed between tasks, so a burst of requests costs
/// one wake-up of this task, not one per request. Reading goes on while answers are written,
/// so that neither side can wait for the other with both directions full.
async fn serve(app: &App, service: ClientService, io: TokioIo<Upgraded>) {
    let (mut reader, mut writer) = tokio::io::split(io);
    let mut buffer = BytesMut::with_capacity(READ_BUFFER);
    let mut out = BytesMut::with_capacity(READ_BUFFER);
    let mut in_flight = FuturesUnordered::new();
    let mut stopping = app.stopping.clone();
    let mut last = 0;
    let mut input = Input::Requests;
    let drain_until = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(drain_until);
    loop {
        while input == Input::Requests && in_flight.len() < MAX_IN_FLIGHT {
            match link::decode(&mut buffer) {
                Ok(Some(Frame::Request(frame))) => {
                    last = frame.id;
                    in_flight.push(answer(service.clone(), frame));
                }
                Ok(None) => break,
                Ok(Some(Frame::Answer(_) | Frame::GoAway { .. })) => {
                    tracing::warn!("the gateway sent a frame only nodes send; link closed");
                    input = Input::Ended;
                }
                Err(error) => {
                    tracing::warn!(%error, "gateway link closed");
                    input = Input::Ended;
                }
            }
        }
        // Starts the new handlers, and takes every answer that is ready.
        while let Some(Some(done)) = in_flight.next().now_or_never() {
            encode(&mut out, done);
        }
        if input == Input::Ended && in_flight.is_empty() && out.is_empty() {
            break;
        }
        let reads = match input {
            Input::Requests => in_flight.len() < MAX_IN_FLIGHT,
            Input::Draining => true,
            Input::Ended => false,
        };
        if reads {
            // In steps: a frame's claimed length is not memory to set aside before it comes.
            buffer.reserve(link::wanted(&buffer).clamp(READ_BUFFER, 16 * READ_BUFFER));
        }
        let event = tokio::select! {
            read = reader.read_buf(&mut buffer), if reads => Event::Read(read),
            written = writer.write(&out), if !out.is_empty() => Event::Written(written),
            Some(done) = in_flight.next(), if !in_flight.is_empty() => Event::Answered(done),
            () = until_stopping(&mut stopping), if input == Input::Requests => Event::Stopping,
            () = &mut drain_until, if input == Input::Draining => Event::Drained,
        };
        match event {
            Event::Read(Ok(0)) => input = Input::Ended,
            Event::Read(Ok(_)) => {
                if input == Input::Draining {
                    buffer.clear();
                }
            }
            Event::Read(Err(error)) => {
                tracing::debug!(%error, "gateway link read failed");
                input = Input::Ended;
            }
            Event::Written(Ok(written)) if written > 0 => {
                out.advance(written);
                if out.is_empty() && out.capacity() > 16 * READ_BUFFER {
                    out = BytesMut::with_capacity(READ_BUFFER);
                }
            }
            Event::Written(result) => {
                tracing::debug!(?result, "gateway link write failed");
                return;
            }
            Event::Answered(done) => encode(&mut out, done),
            Event::Stopping => {
                // Requests after `last` are left unread: the gateway may send them elsewhere.
                link::encode_go_away(&mut out, last);
                input = Input::Draining;
                buffer.clear();
                drain_until
                    .as_mut()
                    .reset(tokio::time::Instant::now() + DRAIN_LIMIT);
            }
            Event::Drained => input = Input::Ended,
        }
    }
    let _ = writer.shutdown().await;
}

enum Event {
    Read(std::io::Result<usize>),
    Written(std::io::Result<usize>),
    Answered(Finished),
    Stopping,
    Drained,
}

fn encode(out: &mut BytesMut, done: Finished) {
    let Finished { id, head, body } = done;
    if let Err(error) = link::encode_answer(out, id, head.status, &head.headers, &body) {
        let refusal = ApiError::new(
            ErrorToken::Internal,
            format!("the answer cannot be sent on the gateway link: {error}"),
        )
        .at(Stage::Unknown);
        // An error answer is whole when made, and ours always fits a frame.
        if let Some((head, body)) = collected(refusal.into_response()).now_or_never() {
            let _ = link::encode_answer(out, id, head.status, &head.headers, &body);
        }
    }
}

/// Answers one request as the listener does over HTTP.
async fn answer(service: ClientService, frame: link::Request) -> Finished {
    let id = frame.id;
    let response = match into_request(frame) {
        Ok(request) => match service.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        },
        Err(refusal) => refusal.into_response(),
    };
    let (head, body) = collected(response).await;
    Finished { id, head, body }
}

fn into_request(frame: link::Request) -> Result<Request, ApiError> {
    let uri: http::Uri = frame.target.parse().map_err(|error| {
        ApiError::new(
            ErrorToken::InvalidHeader,
            format!("the request target is not a URI: {error}"),
        )
    })?;
    // SSE answers never end, and the link carries answers whole: SSE goes over HTTP.
    if frame.method == Method::GET
        && request::read_query(uri.query()).is_ok_and(|query| query.live == Live::Sse)
    {
        return Err(ApiError::new(
            ErrorToken::MethodNotAllowed,
            "live=sse is not carried on the gateway link; open it over HTTP",
        ));
    }
    let mut headers = frame.headers;
    // A frame's body has an exact length, as a body with `Content-Length` over HTTP: say so,
    // so that admission sees a body (a client's chunked upload reaches here without one).
    if !frame.body.is_empty() || headers.contains_key(CONTENT_LENGTH) {
        headers.insert(CONTENT_LENGTH, HeaderValue::from(frame.body.len()));
    }
    let mut request = Request::new(Body::from(frame.body));
    *request.method_mut() = frame.method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok(request)
}

/// The whole answer. Every answer but SSE's (which the link does not carry) is complete once
/// its handler returns, so this does not wait.
async fn collected(response: Response<Body>) -> (Parts, Bytes) {
    // Handlers set no connection-scoped headers (hyper adds those when it writes HTTP).
    let (head, body) = response.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        // Only SSE's bodies are streams, and the link carries no SSE.
        Err(error) => {
            tracing::warn!(%error, "an answer's body failed on the gateway link");
            Bytes::new()
        }
    };
    (head, body)
}
