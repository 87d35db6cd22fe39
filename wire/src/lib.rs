//! The wire contract shared by every Ursula process: header names, the stable error tokens that
//! name each refusal, the JSON error body, and the frames of the gateway link. Node and gateway
//! both depend on this crate and on nothing of each other, so a token can never be spelled two
//! ways.

pub mod admin;
pub mod cursor;
pub mod headers;
pub mod identity;
#[cfg(feature = "issue")]
pub mod issue;
pub mod link;
pub mod placement;
pub mod size;
mod token;

pub use token::ErrorToken;

use serde::{Deserialize, Serialize};

/// The body of every error response: `{"error": "<Token>", "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(token: ErrorToken, message: impl Into<String>) -> Self {
        Self {
            error: token.as_str().to_owned(),
            message: message.into(),
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        // Serialising two strings into a Vec cannot fail.
        serde_json::to_vec(self).unwrap_or_else(|_| b"{\"error\":\"Internal\"}".to_vec())
    }
}

/// The body of an error on the protocol's reserved `__ds` APIs, in the shape their clients
/// read: `{"error": {"code": "FENCED", "message": "...", ...details}}`.
pub fn protocol_error_json(
    token: ErrorToken,
    message: &str,
    details: &[(&'static str, String)],
) -> Vec<u8> {
    let mut error = serde_json::Map::new();
    error.insert("code".into(), token.protocol_code().into());
    error.insert("message".into(), message.into());
    for (name, value) in details {
        error.insert((*name).into(), value.clone().into());
    }
    serde_json::json!({ "error": error })
        .to_string()
        .into_bytes()
}

/// Whether a GET with this query string is a live read (`live=long-poll` or `live=sse`), which
/// waits for data by design: request deadlines and latency figures leave those out.
pub fn is_live_read(query: Option<&str>) -> bool {
    query.is_some_and(|query| query.split('&').any(|pair| pair.starts_with("live=")))
}

/// Ports of the configuration contract.
pub mod ports {
    pub const CLIENT: u16 = 4437;
    pub const ADMIN: u16 = 4438;
    pub const CLUSTER: u16 = 4439;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_is_the_documented_json_shape() {
        let body = ErrorBody::new(ErrorToken::StreamNotFound, "stream demo/x does not exist");
        let value: serde_json::Value = serde_json::from_slice(&body.to_json()).unwrap();
        assert_eq!(value["error"], "StreamNotFound");
        assert_eq!(value["message"], "stream demo/x does not exist");
    }

    #[test]
    fn protocol_errors_nest_a_code() {
        let body = protocol_error_json(
            ErrorToken::AlreadyClaimed,
            "claimed",
            &[("current_holder", "worker-1".into())],
        );
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["error"]["code"], "ALREADY_CLAIMED");
        assert_eq!(value["error"]["current_holder"], "worker-1");
        assert_eq!(
            ErrorToken::WebhookUrlRejected.protocol_code(),
            "WEBHOOK_URL_REJECTED"
        );
        assert_eq!(ErrorToken::Fenced.protocol_code(), "FENCED");
    }

    #[test]
    fn live_reads_are_long_polls_and_sse() {
        for (query, live) in [
            (Some("offset=-1&live=sse"), true),
            (Some("live=long-poll&offset=5"), true),
            (Some("offset=-1"), false),
            (Some("alive=1"), false),
            (None, false),
        ] {
            assert_eq!(is_live_read(query), live, "{query:?}");
        }
    }
}
