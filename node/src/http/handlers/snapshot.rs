//! Snapshots, bootstrap and retention.
//!
//! `GET /{b}/{s}/bootstrap` answers `multipart/mixed` with two parts: the latest snapshot
//! (absent when there is none) and the stream's data from the snapshot's offset (or the first
//! retained offset) onwards, each part with its `Content-Type`; the snapshot part carries
//! `Stream-Snapshot-Offset`, the data part `Stream-Next-Offset`.

use bytes::Bytes;
use bytes::{BufMut, BytesMut};
use http::request::Parts;
use http::{Response, StatusCode};
use sha2::{Digest, Sha256};
use ursula_wire::{ErrorToken, headers};

use super::chunk::read_chunk;
use super::{content_type, invalid_offset, live_stream, settle};
use crate::engine::now_ms;
use crate::http::App;
use crate::http::error::ApiError;
use crate::http::response::{Body, Reply};
use crate::machine::stream::DEFAULT_CONTENT_TYPE;
use crate::machine::{Command, Outcome, PublishSnapshot, StreamPath};
use crate::offset;

/// Bootstrap data beyond this is left for the client to read with ordinary GETs from the
/// returned `Stream-Next-Offset`.
const BOOTSTRAP_MAX_DATA: usize = 64 * 1024 * 1024;

fn parse_offset(text: &str) -> Result<u64, ApiError> {
    offset::parse(text).ok_or_else(|| invalid_offset(format!("{text:?} is not an offset")))
}

pub async fn publish(
    app: &App,
    parts: Parts,
    body: Bytes,
    path: StreamPath,
    at: &str,
) -> Result<Response<Body>, ApiError> {
    let at = parse_offset(at)?;
    let kind = content_type(&parts.headers)?.unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_owned());
    let digest: [u8; 32] = Sha256::digest(&body).into();
    let engine = app.engine(&path.bucket)?.clone();
    let command = Command::PublishSnapshot(PublishSnapshot {
        path,
        offset: at,
        content_type: kind,
        body,
        digest,
        now_ms: now_ms(),
    });
    let created = matches!(
        engine.propose(command).await?,
        Outcome::SnapshotPublished { created: true }
    );
    Ok(Reply::new(if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    })
    .header(headers::STREAM_SNAPSHOT_OFFSET, offset::format(at))
    .build())
}

pub async fn read(app: &App, path: &StreamPath, at: &str) -> Result<Response<Body>, ApiError> {
    let at = parse_offset(at)?;
    let (handle, meta) = live_stream(app, path, now_ms())?;
    let missing = || {
        ApiError::new(
            ErrorToken::SnapshotNotFound,
            format!(
                "stream {path} has no snapshot at offset {}",
                offset::format(at)
            ),
        )
    };
    let info = meta.snapshots.get(&at).ok_or_else(missing)?;
    let body = app
        .engine(&path.bucket)?
        .snapshot(&handle, at)
        .await?
        .ok_or_else(missing)?;
    Ok(Reply::new(StatusCode::OK)
        .header("content-type", &info.content_type)
        .header(headers::STREAM_SNAPSHOT_OFFSET, offset::format(at))
        .body(body)
        .build())
}

pub async fn bootstrap(app: &App, path: &StreamPath) -> Result<Response<Body>, ApiError> {
    let now = now_ms();
    let (handle, meta) = live_stream(app, path, now)?;
    app.engine(&path.bucket)?.touch(&handle, &meta, now);
    let snapshot = match meta.snapshots.last_key_value() {
        Some((at, info)) => app
            .engine(&path.bucket)?
            .snapshot(&handle, *at)
            .await?
            .map(|body| (*at, info.content_type.clone(), body)),
        None => None,
    };
    let engine = app.engine(&path.bucket)?;
    let mut at = snapshot
        .as_ref()
        .map_or_else(|| engine.first_offset(&meta), |(at, _, _)| *at);
    let mut data = BytesMut::new();
    let mut parts = 0;
    loop {
        let chunk = read_chunk(
            app.engine(&path.bucket)?,
            &handle,
            &meta,
            at,
            app.config.server.read_chunk_size,
        )
        .await?;
        // JSON chunks are arrays; merge them into one.
        if meta.is_json() {
            let inner = &chunk.body[1..chunk.body.len() - 1];
            if !inner.is_empty() {
                data.put_slice(if parts > 0 { b"," } else { b"" });
                data.put_slice(inner);
                parts += 1;
            }
        } else {
            data.put_slice(&chunk.body);
        }
        at = chunk.next;
        if at >= meta.tail || data.len() >= BOOTSTRAP_MAX_DATA || chunk.body.is_empty() {
            break;
        }
    }
    let data = if meta.is_json() {
        let mut framed = BytesMut::with_capacity(data.len() + 2);
        framed.put_slice(b"[");
        framed.put_slice(&data);
        framed.put_slice(b"]");
        framed
    } else {
        data
    };

    let boundary = format!("ursula-{:016x}{:016x}", meta.id, now);
    let mut body = BytesMut::with_capacity(data.len() + 512);
    if let Some((snapshot_at, kind, snapshot_body)) = &snapshot {
        body.put_slice(
            format!(
                "--{boundary}\r\ncontent-type: {kind}\r\n{}: {}\r\n\r\n",
                headers::STREAM_SNAPSHOT_OFFSET,
                offset::format(*snapshot_at)
            )
            .as_bytes(),
        );
        body.put_slice(snapshot_body);
        body.put_slice(b"\r\n");
    }
    body.put_slice(
        format!(
            "--{boundary}\r\ncontent-type: {}\r\n{}: {}\r\n\r\n",
            meta.content_type,
            headers::STREAM_NEXT_OFFSET,
            offset::format(at)
        )
        .as_bytes(),
    );
    body.put_slice(&data);
    body.put_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let up_to_date = at == meta.tail;
    Ok(Reply::new(StatusCode::OK)
        .header(
            "content-type",
            format!("multipart/mixed; boundary={boundary}"),
        )
        .header(headers::STREAM_NEXT_OFFSET, offset::format(at))
        .header_if(
            snapshot.is_some(),
            headers::STREAM_SNAPSHOT_OFFSET,
            snapshot
                .as_ref()
                .map(|(s, _, _)| offset::format(*s))
                .unwrap_or_default(),
        )
        .header_if(up_to_date, headers::STREAM_UP_TO_DATE, "true")
        .header_if(up_to_date && meta.closed, headers::STREAM_CLOSED, "true")
        .header("cache-control", "no-store")
        .body(body.freeze())
        .build())
}

/// `PUT /{b}/{s}/retention/{offset}`: reads below the offset answer 410 from now on. On a JSON
/// stream the offset must be a message boundary.
pub async fn retain(app: &App, path: StreamPath, at: &str) -> Result<Response<Body>, ApiError> {
    let at = parse_offset(at)?;
    settle(app, &path.bucket).await?;
    let (handle, meta) = live_stream(app, &path, now_ms())?;
    if meta.is_json() && at < meta.tail && at > meta.retained_from {
        let slices = app
            .engine(&path.bucket)?
            .read(&handle, &meta, at, 1)
            .await?;
        if slices.first().is_none_or(|s| s.start != at) {
            return Err(invalid_offset(format!(
                "offset {} is not at a message boundary",
                offset::format(at)
            )));
        }
    }
    let outcome = app
        .engine(&path.bucket)?
        .clone()
        .propose(Command::AdvanceRetention {
            path,
            offset: at,
            now_ms: now_ms(),
        })
        .await?;
    let Outcome::RetentionAdvanced { retained_from } = outcome else {
        return Err(ApiError::new(
            ErrorToken::Internal,
            "unexpected outcome of a retention advance",
        ));
    };
    Ok(Reply::new(StatusCode::OK)
        .header(
            headers::STREAM_RETAINED_OFFSET,
            offset::format(retained_from),
        )
        .build())
}
