//! The JSON a consumer sees of a subscription, its streams and its wakes: the bodies of the
//! `__ds` routes and of webhook requests.

use serde_json::{Value, json};

use super::signing::SigningKey;
use crate::machine::Subscription;
use crate::machine::subscription::{Delivery, LinkKind, LinkView, Wake, WakeRef};
use crate::offset;

/// `{root}/__ds/...` of a subscription.
pub fn ds_url(sub: &Subscription, rest: &str) -> String {
    format!("{}/__ds/{rest}", sub.root)
}

pub fn callback_url(sub: &Subscription) -> String {
    ds_url(sub, &format!("subscriptions/{}/callback", sub.id))
}

pub fn streams(views: &[LinkView<'_>]) -> Value {
    views
        .iter()
        .map(|view| {
            json!({
                "path": view.path,
                "link_type": match view.kind {
                    LinkKind::Explicit => "explicit",
                    LinkKind::Pattern => "pattern",
                },
                "offset": offset::format(view.acked),
                "acked_offset": offset::format(view.acked),
                "tail_offset": offset::format(view.tail),
                "has_pending": view.has_pending(),
            })
        })
        .collect()
}

/// The subscription as `GET __ds/subscriptions/{id}` answers it (no secret: webhooks are
/// signed with the node's key, whose public half is at `jwks_url`).
pub fn subscription(sub: &Subscription, views: &[LinkView<'_>], key: &SigningKey) -> Value {
    let kind = match sub.spec.delivery {
        Delivery::Webhook { .. } => "webhook",
        Delivery::PullWake { .. } => "pull-wake",
    };
    let mut fields = serde_json::Map::new();
    fields.insert("id".into(), sub.id.clone().into());
    fields.insert("type".into(), kind.into());
    fields.insert("lease_ttl_ms".into(), sub.spec.lease_ttl_ms.into());
    fields.insert("generation".into(), sub.generation.into());
    fields.insert("streams".into(), streams(views));
    fields.insert("created_at".into(), rfc3339(sub.created_ms).into());
    if let Some(pattern) = &sub.spec.pattern {
        fields.insert("pattern".into(), pattern.clone().into());
    }
    if let Some(description) = &sub.spec.description {
        fields.insert("description".into(), description.clone().into());
    }
    match &sub.spec.delivery {
        Delivery::Webhook { url } => {
            fields.insert(
                "webhook".into(),
                json!({
                    "url": url,
                    "signing": {
                        "alg": "ed25519",
                        "kid": key.kid(),
                        "jwks_url": ds_url(sub, "jwks.json"),
                    },
                }),
            );
        }
        Delivery::PullWake { wake_stream } => {
            fields.insert("wake_stream".into(), wake_stream.clone().into());
        }
    }
    if let Some(wake) = &sub.wake {
        fields.insert(
            "wake".into(),
            json!({
                "wake_id": wake.id,
                "generation": wake.generation,
                "holder": wake.holder,
                "lease_expires_at": (wake.lease_until_ms > 0).then(|| rfc3339(wake.lease_until_ms)),
            }),
        );
    }
    Value::Object(fields)
}

/// What a webhook is sent for a wake: where and with which token to acknowledge it.
pub fn webhook(
    sub: &Subscription,
    wake: &WakeRef,
    views: &[LinkView<'_>],
    key: &SigningKey,
) -> Value {
    let mut body = wake_fields(sub, wake, views);
    body["callback_url"] = callback_url(sub).into();
    body["callback_token"] = key.wake_token(sub, wake).into();
    body
}

/// What a pull-wake worker's claim answers: the wake, the token its acks carry, the holder.
pub fn claimed(sub: &Subscription, wake: &Wake, views: &[LinkView<'_>], key: &SigningKey) -> Value {
    let reference = wake.reference();
    let mut body = wake_fields(sub, &reference, views);
    body["token"] = key.wake_token(sub, &reference).into();
    body["worker"] = wake.holder.clone().into();
    body
}

fn wake_fields(sub: &Subscription, wake: &WakeRef, views: &[LinkView<'_>]) -> Value {
    json!({
        "subscription_id": sub.id,
        "wake_id": wake.wake_id,
        "generation": wake.generation,
        "lease_ttl_ms": sub.spec.lease_ttl_ms,
        "streams": streams(views),
    })
}

fn rfc3339(unix_ms: u64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
