//! `POST /{bucket}/{stream}`: append, close, or both at once.

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};
use ursula_wire::{ErrorToken, headers};

use super::content_type;
use crate::engine::now_ms;
use crate::http::App;
use crate::http::error::ApiError;
use crate::http::request;
use crate::http::response::{Body, Reply};
use crate::machine::stream::is_json_content_type;
use crate::machine::{AppendStream, Command, Outcome, Payload, StreamPath};
use crate::offset;

pub async fn handle(
    app: &App,
    parts: Parts,
    body: Bytes,
    path: StreamPath,
) -> Result<Response<Body>, ApiError> {
    let headers = &parts.headers;
    let close = request::flag(headers, headers::STREAM_CLOSED);
    let producer = request::producer(headers)?;
    let stream_seq = request::header(headers, headers::STREAM_SEQ)?.map(str::to_owned);
    let requested_type = content_type(headers)?;
    let body_len = body.len() as u64;

    let payload = if body.is_empty() {
        if !close {
            return Err(ApiError::new(
                ErrorToken::EmptyBody,
                "an append needs a body (or Stream-Closed: true to close the stream)",
            ));
        }
        None
    } else {
        let Some(content_type) = requested_type.as_deref() else {
            return Err(ApiError::new(
                ErrorToken::MissingContentType,
                "an append with a body needs a Content-Type",
            ));
        };
        if is_json_content_type(content_type) {
            Some(request::json_payload(&body)?.ok_or_else(|| {
                ApiError::new(
                    ErrorToken::InvalidJson,
                    "an empty JSON array appends nothing",
                )
            })?)
        } else {
            Some(Payload::inline(body, 1))
        }
    };
    let wrote_data = payload.is_some();
    let engine = app.engine(&path.bucket)?.clone();
    let payload = super::stage_if_large(&engine, payload, body_len).await?;
    let command = Command::Append(AppendStream {
        path,
        content_type: requested_type,
        payload,
        close,
        stream_seq,
        producer,
        now_ms: now_ms(),
    });
    let Outcome::Appended(outcome) = super::propose_staged(&engine, command).await? else {
        return Err(ApiError::new(
            ErrorToken::Internal,
            "unexpected outcome of an append",
        ));
    };
    // New producer data answers 200; a duplicate, a close-only and a plain append answer 204.
    let status = if outcome.producer.is_some() && wrote_data && !outcome.duplicate {
        StatusCode::OK
    } else {
        StatusCode::NO_CONTENT
    };
    let mut reply = Reply::new(status)
        .header(
            headers::STREAM_NEXT_OFFSET,
            offset::format(outcome.next_offset),
        )
        .header_if(outcome.closed, headers::STREAM_CLOSED, "true");
    if let Some(ack) = outcome.producer {
        reply = reply
            .header(headers::PRODUCER_EPOCH, ack.epoch.to_string())
            .header(headers::PRODUCER_SEQ, ack.seq.to_string());
    }
    Ok(reply.build())
}
