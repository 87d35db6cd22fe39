//! Response bodies and the headers every response carries.

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

pub fn empty() -> Body {
    Empty::new().boxed_unsync()
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

const EXPOSED_HEADERS: &str = "stream-next-offset, stream-cursor, stream-up-to-date, \
    stream-closed, stream-ttl, stream-expires-at, stream-sse-data-encoding, \
    stream-retained-offset, stream-snapshot-offset, producer-epoch, producer-seq, \
    producer-expected-seq, producer-received-seq, etag, content-type, location, retry-after, \
    x-ursula-not-applied, x-ursula-leader-id";

pub const ALLOWED_HEADERS: &str = "content-type, authorization, if-none-match, stream-ttl, \
    stream-expires-at, stream-closed, stream-seq, stream-forked-from, stream-fork-offset, \
    stream-fork-sub-offset, producer-id, producer-epoch, producer-seq";

pub const ALLOWED_METHODS: &str = "GET, POST, PUT, DELETE, HEAD, OPTIONS";

/// Browser security headers, on every response including errors; CORS headers when the
/// request came from a browser (it sent `Origin`), which keeps other answers small.
pub fn add_common_headers(headers: &mut HeaderMap, cors: bool) {
    let set = |headers: &mut HeaderMap, name: &'static str, value: &'static str| {
        headers
            .entry(HeaderName::from_static(name))
            .or_insert(HeaderValue::from_static(value));
    };
    set(headers, "x-content-type-options", "nosniff");
    set(headers, "cross-origin-resource-policy", "cross-origin");
    if cors {
        set(headers, "access-control-allow-origin", "*");
        set(headers, "access-control-expose-headers", EXPOSED_HEADERS);
    }
}
