//! `PUT /{bucket}/{stream}`: create a stream, possibly closed, with a body, or as a fork.

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Response, StatusCode};
use serde_json::value::RawValue;
use ursula_wire::{ErrorToken, headers};

use super::{content_type, live_stream, settle};
use crate::engine::now_ms;
use crate::http::App;
use crate::http::error::ApiError;
use crate::http::request::{self, strict_integer};
use crate::http::response::{Body, Reply};
use crate::http::route::parse_stream_reference;
use crate::machine::stream::{DEFAULT_CONTENT_TYPE, is_json_content_type};
use crate::machine::{
    Command, CreateStream, ForkSpec, Outcome, PartialRecord, Payload, StreamPath,
};
use crate::offset;

pub async fn handle(
    app: &App,
    parts: Parts,
    body: Bytes,
    path: StreamPath,
) -> Result<Response<Body>, ApiError> {
    let headers = &parts.headers;
    let requested_type = content_type(headers)?;
    let ttl_secs = request::ttl(headers)?;
    let expires_at = request::expires_at(headers)?;
    if ttl_secs.is_some() && expires_at.is_some() {
        return Err(ApiError::new(
            ErrorToken::InvalidHeader,
            "Stream-TTL and Stream-Expires-At cannot both be given",
        ));
    }
    let closed = request::flag(headers, headers::STREAM_CLOSED);
    let fork = fork_headers(app, headers)?;
    let now = now_ms();

    let fork = match fork {
        Some(headers) => Some(prepare_fork(app, headers, now).await?),
        None => None,
    };
    // A fork without a content type takes its source's, and so does its initial body.
    let effective_type = match (&requested_type, &fork) {
        (Some(requested), _) => requested.clone(),
        (None, Some((_, source_type))) => source_type.clone(),
        (None, None) => DEFAULT_CONTENT_TYPE.to_owned(),
    };
    let body_len = body.len() as u64;
    let initial = if body.is_empty() {
        None
    } else if is_json_content_type(&effective_type) {
        request::json_payload(&body)?
    } else {
        Some(Payload::inline(body, 1))
    };

    // Bodies are staged once nothing but the proposal can refuse the create: a marked refusal
    // after this deletes every object staged for it (`propose_staged`).
    let engine = app.engine(&path.bucket)?.clone();
    let mut fork = fork.map(|(spec, _)| spec);
    // A part of a staged record can be as large: staged too, rather than sent through Raft.
    if let Some(partial) = fork.as_mut().and_then(|spec| spec.partial.as_mut()) {
        let len = partial.payload.bytes.len() as u64;
        let staged = super::stage_if_large(&engine, Some(partial.payload.clone()), len).await?;
        partial.payload = staged.unwrap_or_else(|| Payload::inline(bytes::Bytes::new(), 0));
    }
    let initial = match super::stage_if_large(&engine, initial, body_len).await {
        Ok(initial) => initial,
        Err(error) => {
            let partial = fork.as_ref().and_then(|spec| spec.partial.as_ref());
            let staged = partial.and_then(|partial| partial.payload.staged.as_ref());
            if let Some(staged) = staged {
                engine.discard_staged(staged.key.clone());
            }
            return Err(error);
        }
    };
    let command = Command::Create(CreateStream {
        path,
        content_type: requested_type,
        ttl_secs,
        expires_at,
        closed,
        initial,
        fork,
        now_ms: now,
    });
    let Outcome::StreamCreated { created, meta } = super::propose_staged(&engine, command).await?
    else {
        return Err(ApiError::new(
            ErrorToken::Internal,
            "unexpected outcome of a create",
        ));
    };
    let location = format!(
        "http://{}{}",
        parts
            .headers
            .get("host")
            .and_then(|h| h.to_str().ok())
            .unwrap_or("localhost"),
        parts.uri.path()
    );
    Ok(Reply::new(if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    })
    .header("content-type", &meta.content_type)
    .header(headers::STREAM_NEXT_OFFSET, offset::format(meta.tail))
    .header_if(meta.closed, headers::STREAM_CLOSED, "true")
    .header_if(created, "location", location)
    .build())
}

struct ForkHeaders {
    source: StreamPath,
    offset: Option<u64>,
    sub_offset: u64,
}

fn fork_headers(app: &App, headers: &HeaderMap) -> Result<Option<ForkHeaders>, ApiError> {
    let invalid = |message: String| ApiError::new(ErrorToken::InvalidForkRequest, message);
    let source = request::header(headers, headers::STREAM_FORKED_FROM)?;
    let offset = request::header(headers, headers::STREAM_FORK_OFFSET)?;
    let sub_offset = request::header(headers, headers::STREAM_FORK_SUB_OFFSET)?;
    let Some(source) = source else {
        if offset.is_some() || sub_offset.is_some() {
            return Err(invalid(
                "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From".into(),
            ));
        }
        return Ok(None);
    };
    let source = parse_stream_reference(source, &app.config.server.compat_bucket)?;
    let offset = offset
        .map(|text| {
            offset::parse(text)
                .ok_or_else(|| invalid(format!("Stream-Fork-Offset {text:?} is not an offset")))
        })
        .transpose()?;
    let sub_offset = sub_offset
        .map(|text| {
            strict_integer(text).ok_or_else(|| {
                invalid(format!(
                    "Stream-Fork-Sub-Offset {text:?} is not a non-negative integer"
                ))
            })
        })
        .transpose()?
        .unwrap_or(0);
    if sub_offset > 0 && offset.is_none() {
        return Err(invalid(
            "Stream-Fork-Sub-Offset above 0 needs Stream-Fork-Offset".into(),
        ));
    }
    Ok(Some(ForkHeaders {
        source,
        offset,
        sub_offset,
    }))
}

/// Checks the fork point against the source's committed bytes and, with a sub-offset, cuts
/// the partial message the fork starts with. Returns the spec and the source's content type.
async fn prepare_fork(
    app: &App,
    fork: ForkHeaders,
    now: u64,
) -> Result<(ForkSpec, String), ApiError> {
    let mut spec = ForkSpec {
        source: fork.source,
        offset: fork.offset,
        sub_offset: fork.sub_offset,
        partial: None,
    };
    // A missing or deleted source is left to the state machine, which answers 404 or 409.
    settle(app, &spec.source.bucket).await?;
    let Ok((handle, meta)) = live_stream(app, &spec.source, now) else {
        return Ok((spec, DEFAULT_CONTENT_TYPE.to_owned()));
    };
    let source_type = meta.content_type.clone();
    let invalid = |message: String| ApiError::new(ErrorToken::InvalidForkRequest, message);
    let Some(at) = fork.offset.filter(|at| *at < meta.tail) else {
        if fork.sub_offset > 0 {
            return Err(invalid(format!(
                "Stream-Fork-Sub-Offset {} has no message to fall in at the fork offset",
                fork.sub_offset
            )));
        }
        return Ok((spec, source_type));
    };
    let slices = app
        .engine(&meta.path.bucket)?
        .read(&handle, &meta, at, 1)
        .await?;
    let message = slices.first().filter(|slice| slice.start == at);
    let json = meta.is_json();
    if json && message.is_none() {
        return Err(invalid(format!(
            "Stream-Fork-Offset {} is not at a message boundary",
            offset::format(at)
        )));
    }
    if fork.sub_offset == 0 {
        return Ok((spec, source_type));
    }
    let Some(message) = message else {
        return Err(invalid("no message starts at Stream-Fork-Offset".into()));
    };
    let payload = if json {
        let text = std::str::from_utf8(&message.bytes)
            .map_err(|_| ApiError::new(ErrorToken::Internal, "stored JSON is not UTF-8"))?;
        let wrapped = format!("[{text}]");
        let items: Vec<&RawValue> = serde_json::from_str(&wrapped)
            .map_err(|_| ApiError::new(ErrorToken::Internal, "stored JSON does not parse"))?;
        let count = items.len() as u64;
        if fork.sub_offset > count {
            return Err(invalid(format!(
                "Stream-Fork-Sub-Offset {} is past the {count} messages at the fork offset",
                fork.sub_offset
            )));
        }
        request::join_messages(&items[..fork.sub_offset as usize])
    } else {
        let len = message.bytes.len() as u64;
        if fork.sub_offset > len {
            return Err(invalid(format!(
                "Stream-Fork-Sub-Offset {} is past the {len} bytes of the message at the fork offset",
                fork.sub_offset
            )));
        }
        Payload::inline(message.bytes.slice(..fork.sub_offset as usize), 1)
    };
    spec.partial = Some(PartialRecord {
        source_id: meta.id,
        payload,
    });
    Ok((spec, source_type))
}
