//! One module per group of routes. Handlers parse, propose or read, and shape the answer;
//! errors go back as `ApiError` to the single mapping in `http::error`.

pub mod append;
pub mod bucket;
pub mod chunk;
pub mod create;
pub mod meta;
pub mod read;
pub mod snapshot;
pub mod subscriptions;

use std::sync::Arc;

use http::HeaderMap;
use ursula_wire::ErrorToken;

use super::App;
use super::error::ApiError;
use crate::engine::{Engine, EngineError, Lookup, StreamHandle};
use crate::machine::{BucketState, Command, Outcome, Payload, Refusal, StreamMeta, StreamPath};

/// The live stream at `path` for a read, or the refusal a reader gets.
pub fn live_stream(
    app: &App,
    path: &StreamPath,
    now_ms: u64,
) -> Result<(Arc<StreamHandle>, Arc<StreamMeta>), ApiError> {
    if let Some(BucketState::Fenced) = app.engine(&path.bucket)?.bucket(&path.bucket) {
        return Err(Refusal::BucketFenced(path.bucket.clone()).into());
    }
    match app.engine(&path.bucket)?.lookup(path, now_ms) {
        Lookup::Live(handle, meta) => Ok((handle, meta)),
        Lookup::Deleted => Err(Refusal::StreamDeleted(path.to_string()).into()),
        Lookup::Missing => Err(Refusal::StreamNotFound(path.to_string()).into()),
    }
}

/// Waits until this node's state holds every acknowledged write of `bucket`'s group, for a
/// write that looks at a stream before it proposes (a retention point's message boundary, a
/// fork's source): a leader just elected or restarted may not have applied its whole log yet,
/// and would answer from an older state. The fault campaign found a retention PUT answered 404
/// `StreamNotFound` for a stream whose create had been acknowledged (seed 10047).
pub async fn settle(app: &App, bucket: &str) -> Result<(), ApiError> {
    if app.engine(bucket)?.ready_to_read().await {
        Ok(())
    } else {
        Err(ApiError::leader_not_caught_up())
    }
}

/// Stages a body of `body_len` bytes in object storage when the node's cold tier says so
/// (`runtime.external_payload_min_size`); the payload then names its object.
pub async fn stage_if_large(
    engine: &Engine,
    payload: Option<Payload>,
    body_len: u64,
) -> Result<Option<Payload>, ApiError> {
    match payload {
        Some(payload) if engine.stages(body_len) => Ok(Some(engine.stage(payload).await?)),
        other => Ok(other),
    }
}

/// Proposes a write; after a refusal that proves nothing was proposed (the marked ones), every
/// body it staged (an initial body, a fork's part) is deleted, as the spec says.
pub async fn propose_staged(engine: &Engine, command: Command) -> Result<Outcome, EngineError> {
    let staged = command.staged_keys();
    let result = engine.propose(command).await;
    if let Err(error) = &result
        && error.is_before_proposal()
    {
        for key in staged {
            engine.discard_staged(key);
        }
    }
    result
}

/// The request's content type, if it sent a non-empty one.
pub fn content_type(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    Ok(super::request::header(headers, "content-type")?
        .filter(|v| !v.is_empty())
        .map(str::to_owned))
}

pub fn invalid_offset(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorToken::InvalidOffset, message)
}
