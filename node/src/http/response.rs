//! Response bodies, and a builder for answers.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

pub use axum::body::Body;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Body::from(bytes.into())
}

pub fn empty() -> Body {
    Body::empty()
}

/// A response under construction. Header values that are not valid HTTP are dropped rather
/// than failing the response; every value set here comes from validated input or our own
/// formatting.
pub struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Body,
}

impl Reply {
    pub fn new(status: StatusCode) -> Self {
        Self {
            status,
            headers: HeaderMap::new(),
            body: empty(),
        }
    }

    pub fn header(mut self, name: &'static str, value: impl AsRef<str>) -> Self {
        if let Ok(value) = HeaderValue::from_str(value.as_ref()) {
            self.headers.insert(HeaderName::from_static(name), value);
        }
        self
    }

    pub fn header_if(self, condition: bool, name: &'static str, value: impl AsRef<str>) -> Self {
        if condition {
            self.header(name, value)
        } else {
            self
        }
    }

    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = full(body);
        self
    }

    pub fn stream_body(mut self, body: Body) -> Self {
        self.body = body;
        self
    }

    pub fn build(self) -> Response<Body> {
        let mut response = Response::new(self.body);
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response
    }
}
