//! The node's end of the gateway link (`ursula_wire::link`): request frames in, each handled
//! exactly as the same request over HTTP, answer frames out, every answer that is ready
//! written with one system call.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, UPGRADE};
use http::response::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::io::{ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use ursula_wire::ErrorToken;
use ursula_wire::link::{self, Frame};

use super::error::ApiError;
use super::request::{self, Live};
use super::response::{Body, Reply};
use super::{App, handle, until_stopping};

/// Answers written with one call at most; more wait for the next.
const ANSWERS_PER_WRITE: usize = 256;
/// The read buffer's size between frames; a larger frame grows it for as long as it takes.
const READ_BUFFER: usize = 64 * 1024;

/// A request for the link: `GET /_ursula/link` asking to upgrade to `ursula-link/1`.
pub fn is_upgrade(request: &Request<Incoming>) -> bool {
    request.method() == Method::GET
        && request.uri().path() == link::PATH
        && request
            .headers()
            .get(UPGRADE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(link::PROTOCOL.as_bytes()))
}

/// Agrees to the upgrade; the link runs once hyper hands the connection over, holding `alive`
/// (which the listener's shutdown waits for) until its last answer is written.
pub fn accept(
    app: Arc<App>,
    mut request: Request<Incoming>,
    alive: mpsc::Sender<()>,
) -> Response<Body> {
    let upgrading = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let _alive = alive;
        let upgraded = match upgrading.await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                tracing::debug!(%error, "gateway link upgrade failed");
                return;
            }
        };
        // Bytes hyper read past the upgrade request are the upgraded stream's first.
        let (reader, writer) = tokio::io::split(TokioIo::new(upgraded));
        serve(app, reader, writer, BytesMut::with_capacity(READ_BUFFER)).await;
    });
    Reply::new(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "upgrade")
        .header("upgrade", link::PROTOCOL)
        .build()
}

/// What the writer sends: an answer, or the go-away that ends the link.
enum Out {
    Answer { id: u64, head: Parts, body: Bytes },
    GoAway { last: u64 },
}

/// Reads requests until the gateway closes the link, it breaks the framing, or the node
/// stops; then the answers of requests already read are still written.
async fn serve(
    app: Arc<App>,
    mut reader: ReadHalf<TokioIo<Upgraded>>,
    writer: WriteHalf<TokioIo<Upgraded>>,
    mut buffer: BytesMut,
) {
    let (answers, finished) = mpsc::unbounded_channel();
    let writing = tokio::spawn(write_answers(writer, finished));
    let mut stopping = app.stopping.clone();
    let mut last = 0;
    'reading: loop {
        loop {
            match link::decode(&mut buffer) {
                Ok(Some(Frame::Request(frame))) => {
                    last = frame.id;
                    tokio::spawn(answer(app.clone(), frame, answers.clone()));
                }
                Ok(None) => break,
                Ok(Some(Frame::Answer(_) | Frame::GoAway { .. })) => {
                    tracing::warn!("the gateway sent a frame only nodes send; link closed");
                    break 'reading;
                }
                Err(error) => {
                    tracing::warn!(%error, "gateway link closed");
                    break 'reading;
                }
            }
        }
        buffer.reserve(link::wanted(&buffer).max(READ_BUFFER));
        let read = tokio::select! {
            read = reader.read_buf(&mut buffer) => read,
            () = until_stopping(&mut stopping) => {
                // Requests after `last` are left unread: the gateway may send them elsewhere.
                let _ = answers.send(Out::GoAway { last });
                break;
            }
        };
        match read {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(%error, "gateway link read failed");
                break;
            }
        }
    }
    drop(answers);
    let _ = writing.await;
}

async fn write_answers(
    mut writer: WriteHalf<TokioIo<Upgraded>>,
    mut finished: mpsc::UnboundedReceiver<Out>,
) {
    let mut batch = Vec::with_capacity(ANSWERS_PER_WRITE);
    let mut out = BytesMut::with_capacity(READ_BUFFER);
    while finished.recv_many(&mut batch, ANSWERS_PER_WRITE).await > 0 {
        for done in batch.drain(..) {
            let (id, head, body) = match done {
                Out::Answer { id, head, body } => (id, head, body),
                Out::GoAway { last } => {
                    link::encode_go_away(&mut out, last);
                    continue;
                }
            };
            if let Err(error) = link::encode_answer(&mut out, id, head.status, &head.headers, &body)
            {
                let refusal = ApiError::new(
                    ErrorToken::Internal,
                    format!("the answer cannot be sent on the gateway link: {error}"),
                )
                .after_proposal();
                let (head, body) = collected(refusal.into_response()).await;
                // An error body of our own always fits.
                let _ = link::encode_answer(&mut out, id, head.status, &head.headers, &body);
            }
        }
        if let Err(error) = writer.write_all(&out).await {
            tracing::debug!(%error, "gateway link write failed");
            return;
        }
        out.clear();
        if out.capacity() > 16 * READ_BUFFER {
            out = BytesMut::with_capacity(READ_BUFFER);
        }
    }
}

/// Handles one request as `http::handle` does for HTTP.
async fn answer(app: Arc<App>, frame: link::Request, answers: mpsc::UnboundedSender<Out>) {
    let id = frame.id;
    let response = match into_request(frame) {
        Ok(request) => match handle(app, request).await {
            Ok(response) => response,
            Err(never) => match never {},
        },
        Err(refusal) => refusal.into_response(),
    };
    let (head, body) = collected(response).await;
    let _ = answers.send(Out::Answer { id, head, body });
}

fn into_request(frame: link::Request) -> Result<Request<Full<Bytes>>, ApiError> {
    let writes = matches!(frame.method, Method::PUT | Method::POST | Method::DELETE);
    let mark = |error: ApiError| {
        if writes {
            error.marked_if_unproposed()
        } else {
            error.unmarked()
        }
    };
    let uri: http::Uri = frame.target.parse().map_err(|error| {
        mark(ApiError::new(
            ErrorToken::InvalidHeader,
            format!("the request target is not a URI: {error}"),
        ))
    })?;
    // SSE answers never end, and the link carries answers whole: SSE goes over HTTP.
    if frame.method == Method::GET
        && request::read_query(uri.query()).is_ok_and(|query| query.live == Live::Sse)
    {
        return Err(ApiError::new(
            ErrorToken::MethodNotAllowed,
            "live=sse is not carried on the gateway link; open it over HTTP",
        )
        .unmarked());
    }
    let mut request = Request::new(Full::new(frame.body));
    *request.method_mut() = frame.method;
    *request.uri_mut() = uri;
    *request.headers_mut() = frame.headers;
    Ok(request)
}

/// The whole answer. Every answer but SSE's (which the link does not carry) is complete once
/// its handler returns, so this does not wait.
async fn collected(response: Response<Body>) -> (Parts, Bytes) {
    let (mut head, body) = response.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(never) => match never {},
    };
    // Hop-by-hop framing of HTTP; the frame carries the length.
    head.headers.remove(CONNECTION);
    head.headers.remove(http::header::TRANSFER_ENCODING);
    (head, body)
}
