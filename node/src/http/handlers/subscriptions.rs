//! `{root}/__ds/...`: the protocol's reserved subscription APIs. Every change is proposed to
//! the bucket's group (`machine::subscription`); reads answer from what readers see.

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Response, StatusCode};
use serde::Deserialize;
use ursula_wire::ErrorToken;

use crate::cluster::peer_link::CallKind;
use crate::engine::{Leadership, now_ms};
use crate::http::App;
use crate::http::error::ApiError;
use crate::http::response::{Body, Reply};
use crate::http::route::{Ds, DsResource};
use crate::machine::subscription::{Delivery, LinkView, SubscriptionAction, Tails, WakeRef, glob};
use crate::machine::{Subscription, SubscriptionCommand, SubscriptionOutcome, SubscriptionSpec};
use crate::names::is_valid_stream_name;
use crate::subscriptions::change::{Change, ChangeError};
use crate::subscriptions::view;

const MIN_LEASE_MS: u64 = 1_000;
const MAX_LEASE_MS: u64 = 600_000;
const DEFAULT_LEASE_MS: u64 = 30_000;
const MAX_DESCRIPTION: usize = 1024;
const MAX_WORKER: usize = 256;

type Answered = Result<Response<Body>, ApiError>;

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorToken::InvalidSubscription, message)
}

fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            ErrorToken::InvalidJson,
            format!("the body is not the JSON this route takes: {e}"),
        )
    })
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    Reply::new(status)
        .header("content-type", "application/json")
        .body(value.to_string())
        .build()
}

fn no_content() -> Response<Body> {
    Reply::new(StatusCode::NO_CONTENT).build()
}

/// Makes a change of the subscription `ds` names: here when this node leads its group, else
/// through the leader's cluster listener (`subscriptions::change`).
async fn propose(
    app: &App,
    ds: &Ds,
    action: SubscriptionAction,
    token: Option<String>,
) -> Result<SubscriptionOutcome, ApiError> {
    let change = Change {
        command: SubscriptionCommand {
            bucket: ds.bucket.clone(),
            id: ds.resource.subscription_id().unwrap_or_default().to_owned(),
            now_ms: now_ms(),
            action,
        },
        token,
    };
    let engine = app.engine(&ds.bucket)?;
    let leader = match engine.leadership() {
        Leadership::Here => return Ok(app.subscriptions.change_here(engine, change).await?),
        Leadership::Elsewhere(id) => id,
        Leadership::Unknown => return Err(ApiError::not_leader(None)),
    };
    let (Some(cluster), Some(members)) = (&app.groups.cluster, &app.members) else {
        return Err(ApiError::not_leader(Some(leader)));
    };
    let Some(peer) = cluster.book.get(leader) else {
        return Err(ApiError::not_leader(None));
    };
    let group = ursula_wire::placement::group_of(&ds.bucket, app.groups.group_count());
    let body = postcard::to_allocvec(&change)
        .map_err(|e| ApiError::new(ErrorToken::Internal, e.to_string()))?;
    let answer = crate::cluster::network::forward::<Result<SubscriptionOutcome, ChangeError>>(
        &members.transport.http,
        members.transport.this_node,
        &peer.cluster_url,
        group,
        CallKind::Subscription,
        body,
    )
    .await
    .map_err(ChangeError::Unreachable)?;
    Ok(answer?)
}

fn answer(app: &App, sub: &Subscription, views: &[LinkView<'_>], status: StatusCode) -> Answered {
    Ok(json(
        status,
        &view::subscription(sub, views, &app.subscriptions.key),
    ))
}

/// Its links with the tails the command that answered left (`Tails`).
fn as_applied<'a>(sub: &'a Subscription, tails: &Tails) -> Vec<LinkView<'a>> {
    sub.views(|name| tails.get(name).copied())
}

/// `POST .../claim`: the subscription's wake, now held by the worker.
async fn claim(app: &App, body: Bytes, ds: &Ds) -> Answered {
    let ClaimBody { worker } = parse(&body)?;
    if worker.is_empty() || worker.len() > MAX_WORKER {
        return Err(invalid(format!("worker: 1 to {MAX_WORKER} bytes")));
    }
    let SubscriptionOutcome::Claimed {
        subscription: sub,
        tails,
    } = propose(app, ds, SubscriptionAction::Claim { worker }, None).await?
    else {
        return Err(ApiError::new(
            ErrorToken::Internal,
            "unexpected outcome of a claim",
        ));
    };
    let Some(wake) = &sub.wake else {
        return Err(ApiError::new(ErrorToken::Internal, "a claim left no wake"));
    };
    Ok(json(
        StatusCode::OK,
        &view::claimed(
            &sub,
            wake,
            &as_applied(&sub, &tails),
            &app.subscriptions.key,
        ),
    ))
}

#[derive(Deserialize)]
struct PutBody {
    #[serde(rename = "type")]
    kind: String,
    pattern: Option<String>,
    streams: Option<Vec<String>>,
    webhook: Option<WebhookBody>,
    wake_stream: Option<String>,
    lease_ttl_ms: Option<u64>,
    description: Option<String>,
}

#[derive(Deserialize)]
struct WebhookBody {
    url: String,
}

/// `PUT .../subscriptions/{id}`: 201 new, 200 the same again, 409 another config.
pub async fn put(app: &App, parts: &Parts, body: Bytes, ds: Ds) -> Answered {
    let body: PutBody = parse(&body)?;
    let spec = spec(app, body).await?;
    let root = format!("{}{}", public_base(app, &parts.headers), ds.root);
    let SubscriptionOutcome::Put {
        created,
        subscription,
        tails,
    } = propose(app, &ds, SubscriptionAction::Put { spec, root }, None).await?
    else {
        return Err(ApiError::new(
            ErrorToken::Internal,
            "unexpected outcome of a subscription create",
        ));
    };
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    answer(
        app,
        &subscription,
        &as_applied(&subscription, &tails),
        status,
    )
}

/// The body, checked and normalised; a webhook's URL is checked against the policy here, with
/// its name resolved.
async fn spec(app: &App, body: PutBody) -> Result<SubscriptionSpec, ApiError> {
    let delivery = match (body.kind.as_str(), body.webhook, body.wake_stream) {
        ("webhook", Some(webhook), None) => {
            let policy = &app.subscriptions.policy;
            let rejected = |why: String| ApiError::new(ErrorToken::WebhookUrlRejected, why);
            let url = policy.check_url(&webhook.url).map_err(rejected)?;
            policy.check_resolved(&url).await.map_err(rejected)?;
            Delivery::Webhook { url: webhook.url }
        }
        ("pull-wake", None, Some(wake_stream)) if is_valid_stream_name(&wake_stream) => {
            Delivery::PullWake { wake_stream }
        }
        ("webhook", ..) => {
            return Err(invalid(
                "a webhook subscription needs webhook.url and no wake_stream",
            ));
        }
        ("pull-wake", ..) => {
            return Err(invalid(
                "a pull-wake subscription needs a valid wake_stream and no webhook",
            ));
        }
        (other, ..) => return Err(invalid(format!("type {other:?}: use webhook or pull-wake"))),
    };
    if let Some(pattern) = &body.pattern
        && !glob::is_valid(pattern)
    {
        return Err(invalid(format!(
            "pattern {pattern:?}: use '/'-separated segments, '*' within one, '**' for any number"
        )));
    }
    let mut streams = body.streams.unwrap_or_default();
    if let Some(bad) = streams.iter().find(|name| !is_valid_stream_name(name)) {
        return Err(invalid(format!("{bad:?} is not a stream name")));
    }
    streams.sort();
    streams.dedup();
    if body.pattern.is_none() && streams.is_empty() {
        return Err(invalid("a subscription needs a pattern or streams"));
    }
    let lease_ttl_ms = body.lease_ttl_ms.unwrap_or(DEFAULT_LEASE_MS);
    if !(MIN_LEASE_MS..=MAX_LEASE_MS).contains(&lease_ttl_ms) {
        return Err(invalid(format!(
            "lease_ttl_ms {lease_ttl_ms}: use {MIN_LEASE_MS} to {MAX_LEASE_MS}"
        )));
    }
    if body
        .description
        .as_ref()
        .is_some_and(|d| d.len() > MAX_DESCRIPTION)
    {
        return Err(invalid(format!(
            "a description holds at most {MAX_DESCRIPTION} bytes"
        )));
    }
    Ok(SubscriptionSpec {
        delivery,
        pattern: body.pattern,
        streams,
        lease_ttl_ms,
        description: body.description,
    })
}

/// Where callback and key URLs point: `server.public_url`, or the scheme and host this request
/// came to.
fn public_base(app: &App, headers: &HeaderMap) -> String {
    if let Some(url) = &app.subscriptions.public_url {
        return url.clone();
    }
    let scheme = if app.config.server.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map_or_else(|| app.config.server.listen.to_string(), str::to_owned);
    format!("{scheme}://{host}")
}

pub fn get(app: &App, ds: &Ds) -> Answered {
    let sub = subscription(app, ds)?;
    let views = app.engine(&ds.bucket)?.link_views(&sub);
    answer(app, &sub, &views, StatusCode::OK)
}

fn subscription(app: &App, ds: &Ds) -> Result<std::sync::Arc<Subscription>, ApiError> {
    let id = ds.resource.subscription_id().unwrap_or_default();
    app.engine(&ds.bucket)?
        .subscription(&ds.bucket, id)
        .ok_or_else(|| crate::machine::Refusal::SubscriptionNotFound(id.to_owned()).into())
}

pub async fn delete(app: &App, ds: Ds) -> Answered {
    propose(app, &ds, SubscriptionAction::Delete, None).await?;
    Ok(no_content())
}

#[derive(Deserialize)]
struct LinkBody {
    streams: Vec<String>,
}

/// `POST .../streams`: follow these streams by name.
pub async fn link(app: &App, body: Bytes, ds: Ds) -> Answered {
    let body: LinkBody = parse(&body)?;
    if let Some(bad) = body.streams.iter().find(|name| !is_valid_stream_name(name)) {
        return Err(invalid(format!("{bad:?} is not a stream name")));
    }
    propose(
        app,
        &ds,
        SubscriptionAction::Link {
            streams: body.streams,
        },
        None,
    )
    .await?;
    Ok(no_content())
}

/// `DELETE .../streams/{path}`.
pub async fn unlink(app: &App, ds: Ds) -> Answered {
    let DsResource::Link(_, stream) = &ds.resource else {
        return Err(invalid("no stream named"));
    };
    let stream = stream.clone();
    propose(app, &ds, SubscriptionAction::Unlink { stream }, None).await?;
    Ok(no_content())
}

#[derive(Deserialize)]
struct AckBody {
    wake_id: String,
    generation: u64,
    #[serde(default)]
    acks: Vec<StreamAck>,
    #[serde(default)]
    done: bool,
}

#[derive(Deserialize)]
struct StreamAck {
    stream: String,
    offset: String,
}

#[derive(Deserialize)]
struct ClaimBody {
    worker: String,
}

/// `POST .../callback`, `.../ack` (both also heartbeats), `.../release` and `.../claim`.
pub async fn wake_action(app: &App, parts: &Parts, body: Bytes, ds: Ds) -> Answered {
    if let DsResource::Claim(_) = ds.resource {
        return claim(app, body, &ds).await;
    }
    let releases = matches!(ds.resource, DsResource::Release(_));
    let body: AckBody = parse(&body)?;
    let wake = WakeRef {
        wake_id: body.wake_id,
        generation: body.generation,
    };
    let token = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|token| token.trim().to_owned());
    if releases {
        propose(app, &ds, SubscriptionAction::Release { wake }, token).await?;
        return Ok(no_content());
    }
    let mut acks = Vec::with_capacity(body.acks.len());
    for ack in body.acks {
        let offset = crate::offset::parse(&ack.offset).ok_or_else(|| {
            ApiError::new(
                ErrorToken::InvalidOffset,
                format!("{:?} is not an offset", ack.offset),
            )
        })?;
        acks.push((ack.stream, offset));
    }
    let action = SubscriptionAction::Ack {
        wake,
        acks,
        done: body.done,
    };
    let SubscriptionOutcome::Acked { next_wake } = propose(app, &ds, action, token).await? else {
        return Err(ApiError::new(
            ErrorToken::Internal,
            "unexpected outcome of an ack",
        ));
    };
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "ok": true, "next_wake": next_wake }),
    ))
}

/// `GET .../__ds/jwks.json`: the key webhooks are signed with.
pub fn jwks(app: &App) -> Response<Body> {
    Reply::new(StatusCode::OK)
        .header("content-type", "application/jwk-set+json")
        .body(app.subscriptions.key.jwks().to_string())
        .build()
}
