//! `HEAD` and `DELETE` of a stream.

use http::{Response, StatusCode};
use ursula_wire::headers;

use super::live_stream;
use crate::engine::now_ms;
use crate::http::App;
use crate::http::error::ApiError;
use crate::http::response::{Body, Reply};
use crate::machine::{Command, StreamPath};
use crate::offset;

/// Metadata without a body. HEAD does not reset a sliding TTL.
pub fn head(app: &App, path: &StreamPath) -> Result<Response<Body>, ApiError> {
    let (_, meta) = live_stream(app, path, now_ms())?;
    Ok(Reply::new(StatusCode::OK)
        .header("content-type", &meta.content_type)
        .header(headers::STREAM_NEXT_OFFSET, offset::format(meta.tail))
        .header_if(
            meta.ttl_secs.is_some(),
            headers::STREAM_TTL,
            meta.ttl_secs.unwrap_or_default().to_string(),
        )
        .header_if(
            meta.expires_at.is_some(),
            headers::STREAM_EXPIRES_AT,
            meta.expires_at
                .as_ref()
                .map(|e| e.text.as_str())
                .unwrap_or_default(),
        )
        .header_if(meta.closed, headers::STREAM_CLOSED, "true")
        .header("cache-control", "no-store")
        .build())
}

pub async fn delete(app: &App, path: StreamPath) -> Result<Response<Body>, ApiError> {
    app.engine(&path.bucket)?
        .clone()
        .propose(Command::Delete {
            path,
            now_ms: now_ms(),
        })
        .await?;
    Ok(Reply::new(StatusCode::NO_CONTENT).build())
}
