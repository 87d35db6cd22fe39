//! `GET /{bucket}/{stream}`: catch-up reads and long-polls. SSE lives in `http::sse`.

use std::sync::Arc;

use http::{HeaderMap, Request, Response, StatusCode};
use tokio::time::Instant;
use ursula_wire::{ErrorToken, headers};

use super::chunk::{Chunk, read_chunk};
use super::{invalid_offset, live_stream};
use crate::engine::{Engine, StreamHandle, now_ms};
use crate::http::App;
use crate::http::error::ApiError;
use crate::http::request::{self, Live};
use crate::http::response::{Body, Reply};
use crate::http::sse;
use crate::machine::{Refusal, StreamMeta, StreamPath};
use crate::offset::{self, OffsetParam};
use ursula_wire::cursor;

pub async fn handle<B>(
    app: &App,
    request: Request<B>,
    path: StreamPath,
) -> Result<Response<Body>, ApiError> {
    let query = request::read_query(request.uri().query())?;
    let now = now_ms();
    let (handle, meta) = live_stream(app, &path, now)?;
    app.engine(&meta.path.bucket)?.touch(&handle, &meta, now);
    match query.live {
        Live::No => catch_up(app, &handle, &meta, query.offset, request.headers()).await,
        Live::LongPoll => {
            let param = query.offset.ok_or_else(|| offset_required("long-poll"))?;
            long_poll(app, handle, param, query.cursor.as_deref()).await
        }
        Live::Sse => {
            let param = query.offset.ok_or_else(|| offset_required("SSE"))?;
            let from = resolve_offset(app.engine(&meta.path.bucket)?, &meta, param)?;
            sse::respond(app, handle, &meta, from, query.cursor)
        }
    }
}

fn offset_required(mode: &str) -> ApiError {
    invalid_offset(format!(
        "a {mode} read needs an offset (use -1 or now to start)"
    ))
}

/// Where a read starts: `-1` is the first readable offset, `now` the tail.
pub fn resolve_offset(
    engine: &Engine,
    meta: &StreamMeta,
    param: OffsetParam,
) -> Result<u64, ApiError> {
    match param {
        OffsetParam::Start => Ok(engine.first_offset(meta)),
        OffsetParam::Now => Ok(meta.tail),
        OffsetParam::At(at) if at > meta.tail => Err(invalid_offset(format!(
            "offset {} is beyond the tail {}",
            offset::format(at),
            offset::format(meta.tail)
        ))),
        OffsetParam::At(at) => {
            let first = engine.first_offset(meta);
            if at < first {
                return Err(Refusal::OffsetNotRetained {
                    offset: at,
                    retained_from: first,
                }
                .into());
            }
            Ok(at)
        }
    }
}

async fn catch_up(
    app: &App,
    handle: &StreamHandle,
    meta: &StreamMeta,
    param: Option<OffsetParam>,
    request_headers: &HeaderMap,
) -> Result<Response<Body>, ApiError> {
    let param = param.unwrap_or(OffsetParam::Start);
    let from = resolve_offset(app.engine(&meta.path.bucket)?, meta, param)?;
    if param == OffsetParam::Now {
        // The tail, with no body and no ETag: nothing here may be cached.
        return Ok(Reply::new(StatusCode::OK)
            .header("content-type", &meta.content_type)
            .header(headers::STREAM_NEXT_OFFSET, offset::format(meta.tail))
            .header(headers::STREAM_UP_TO_DATE, "true")
            .header_if(meta.closed, headers::STREAM_CLOSED, "true")
            .header("cache-control", "no-store")
            .body(if meta.is_json() { &b"[]"[..] } else { &b""[..] })
            .build());
    }
    let chunk = read_chunk(
        app.engine(&meta.path.bucket)?,
        handle,
        meta,
        from,
        app.config.server.read_chunk_size,
    )
    .await?;
    let framed = Framed::new(meta, from, &chunk);
    // A chunk short of the tail never changes and may be cached; an answer at the tail
    // changes with the next append, so it must be revalidated (cheaply, by ETag).
    let cache_control = if framed.up_to_date {
        "no-cache"
    } else {
        "public, max-age=60, stale-while-revalidate=300"
    };
    let matches =
        request::header(request_headers, "if-none-match")?.is_some_and(|v| v == framed.etag);
    if matches {
        return Ok(framed
            .reply(StatusCode::NOT_MODIFIED, meta)
            .header("cache-control", cache_control)
            .build());
    }
    Ok(framed
        .reply(StatusCode::OK, meta)
        .header("cache-control", cache_control)
        .body(chunk.body)
        .build())
}

/// The headers every answer carrying a chunk has.
struct Framed {
    next: u64,
    up_to_date: bool,
    at_eof: bool,
    etag: String,
}

impl Framed {
    fn new(meta: &StreamMeta, from: u64, chunk: &Chunk) -> Self {
        let up_to_date = chunk.next == meta.tail;
        let at_eof = meta.closed && up_to_date;
        // The ETag names the incarnation and range, and changes when the stream is closed.
        let etag = format!(
            "\"{}:{}:{}{}\"",
            meta.id,
            from,
            chunk.next,
            if at_eof { ":c" } else { "" }
        );
        Self {
            next: chunk.next,
            up_to_date,
            at_eof,
            etag,
        }
    }

    fn reply(&self, status: StatusCode, meta: &StreamMeta) -> Reply {
        Reply::new(status)
            .header("content-type", &meta.content_type)
            .header(headers::STREAM_NEXT_OFFSET, offset::format(self.next))
            .header_if(self.up_to_date, headers::STREAM_UP_TO_DATE, "true")
            .header_if(self.at_eof, headers::STREAM_CLOSED, "true")
            .header("etag", &self.etag)
    }
}

/// Waits for data past the offset, up to the configured timeout. Answers at once when data is
/// there or the stream is closed at the offset.
async fn long_poll(
    app: &App,
    handle: Arc<StreamHandle>,
    param: OffsetParam,
    client_cursor: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let deadline = Instant::now() + app.config.server.long_poll_timeout;
    let mut changes = handle.subscribe();
    let mut stopping = app.stopping.clone();
    let mut from = None;
    loop {
        let meta = handle.meta();
        if handle.is_removed() {
            return Err(Refusal::StreamNotFound(meta.path.to_string()).into());
        }
        if meta.soft_deleted {
            return Err(Refusal::StreamDeleted(meta.path.to_string()).into());
        }
        let at = match from {
            Some(at) => at,
            None => *from.insert(resolve_offset(
                app.engine(&meta.path.bucket)?,
                &meta,
                param,
            )?),
        };
        let cursor = cursor::next(now_ms(), client_cursor);
        if at < meta.tail {
            let chunk = read_chunk(
                app.engine(&meta.path.bucket)?,
                &handle,
                &meta,
                at,
                app.config.server.read_chunk_size,
            )
            .await?;
            let framed = Framed::new(&meta, at, &chunk);
            return Ok(framed
                .reply(StatusCode::OK, &meta)
                .header_if(!framed.at_eof, headers::STREAM_CURSOR, &cursor)
                .header("cache-control", "no-cache")
                .body(chunk.body)
                .build());
        }
        let timed_out = Instant::now() >= deadline || *stopping.borrow();
        if meta.closed || timed_out {
            return Ok(Reply::new(StatusCode::NO_CONTENT)
                .header(headers::STREAM_NEXT_OFFSET, offset::format(meta.tail))
                .header(headers::STREAM_UP_TO_DATE, "true")
                .header_if(meta.closed, headers::STREAM_CLOSED, "true")
                .header_if(!meta.closed, headers::STREAM_CURSOR, &cursor)
                .header("cache-control", "no-cache")
                .build());
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return Err(ApiError::new(ErrorToken::Unavailable, "the node is shutting down"));
                }
            }
            () = tokio::time::sleep_until(deadline) => {}
            () = crate::http::until_stopping(&mut stopping) => {}
        }
    }
}
