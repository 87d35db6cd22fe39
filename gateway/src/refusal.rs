//! What the gateway answers itself: response bodies, and its refusals, each marked when it
//! proves that nothing of the request applied.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use ursula_wire::{ErrorBody, ErrorToken, headers};

pub use axum::body::Body;

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Body::from(bytes.into())
}

/// A refusal the gateway answers itself.
#[derive(Debug)]
pub(crate) struct Refusal {
    token: ErrorToken,
    message: String,
    /// Whether the answer proves that nothing of the request applied.
    pub(crate) marked: bool,
}

impl Refusal {
    pub(crate) fn new(token: ErrorToken, message: impl Into<String>, marked: bool) -> Self {
        Self {
            token,
            message: message.into(),
            marked,
        }
    }

    pub(crate) fn into_response(self) -> Response<Body> {
        let status =
            StatusCode::from_u16(self.token.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let mut response = Response::new(full(ErrorBody::new(self.token, self.message).to_json()));
        *response.status_mut() = status;
        let map = response.headers_mut();
        map.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        map.insert(
            "x-content-type-options",
            HeaderValue::from_static("nosniff"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
            map.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if status == StatusCode::UNAUTHORIZED {
            map.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.marked {
            map.insert(
                headers::NOT_APPLIED,
                HeaderValue::from_static(self.token.as_str()),
            );
        }
        response
    }
}

impl axum::response::IntoResponse for Refusal {
    fn into_response(self) -> axum::response::Response {
        Refusal::into_response(self)
    }
}
