//! A client's request once the gateway has checked it, and the seam through which the parts
//! that share answers (`collapse`, `tails`) send one upstream: `proxy::Gateway` implements it.

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Method, Request, Response};

use crate::metrics::Metrics;
use crate::refusal::{Body, Refusal};

/// Sends prepared requests upstream under the redirect rule.
pub(crate) trait Upstream: Sync {
    /// The final answer to `prepared`, or the gateway's refusal.
    fn send(
        &self,
        prepared: &Prepared,
    ) -> impl Future<Output = Result<Response<Body>, Refusal>> + Send;

    fn metrics(&self) -> &Metrics;
}

/// A request checked and ready to be sent to any upstream, as often as the redirect rule says.
pub(crate) struct Prepared {
    pub parts: http::request::Parts,
    pub path: String,
    pub path_and_query: String,
    /// A write's body, buffered; empty for reads.
    pub body: Bytes,
    /// How the client addressed the gateway (`http://host`), for `Location`s.
    pub origin: Option<String>,
    pub write: bool,
}

impl Prepared {
    /// A GET of `path_and_query` with `headers`, as `prepare` would leave it.
    fn get(path_and_query: &str, headers: HeaderMap) -> Result<Self, http::Error> {
        let mut request = Request::builder().method(Method::GET).uri(path_and_query);
        if let Some(map) = request.headers_mut() {
            *map = headers;
        }
        let (parts, ()) = request.body(())?.into_parts();
        Ok(Self {
            path: parts.uri.path().to_owned(),
            path_and_query: path_and_query.to_owned(),
            parts,
            body: Bytes::new(),
            origin: None,
            write: false,
        })
    }

    /// A read of this request's stream at `?query` that the gateway makes for the client,
    /// with the client's headers.
    pub(crate) fn read_of_stream(&self, query: &str) -> Option<Self> {
        Self::get(
            &format!("{}?{query}", self.path),
            self.parts.headers.clone(),
        )
        .ok()
    }

    /// A long-poll or SSE read: it waits for data by design, up to the node's own limits.
    pub(crate) fn is_live_read(&self) -> bool {
        self.parts.method == Method::GET && ursula_wire::is_live_read(self.parts.uri.query())
    }

    /// Part of a sharing key: the node adds CORS headers to the answer to any request with an
    /// `Origin`, so requests with and without one cannot share an answer.
    pub(crate) fn cors_need(&self) -> &'static str {
        if self.parts.headers.contains_key(header::ORIGIN) {
            " cors"
        } else {
            ""
        }
    }

    /// A read as `prepare` would leave it, for tests of what is done with one.
    #[cfg(test)]
    pub(crate) fn read(method: Method, uri: &str, headers: &[(&str, &str)]) -> Self {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                header::HeaderName::from_bytes(name.as_bytes()).expect("a test header name"),
                header::HeaderValue::from_str(value).expect("a test header value"),
            );
        }
        let mut prepared = Self::get(uri, map).expect("a valid test request");
        prepared.parts.method = method;
        prepared
    }
}
