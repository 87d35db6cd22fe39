//! The tower layers every answer of the client listener passes through, outermost first:
//! browser headers (CORS, preflights, security headers), the request-latency histogram, and
//! leader redirects.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};

use super::App;
use super::error::RedirectTo;
use super::response::Reply;

const EXPOSED_HEADERS: &str = "stream-next-offset, stream-cursor, stream-up-to-date, \
    stream-closed, stream-ttl, stream-expires-at, stream-sse-data-encoding, \
    stream-retained-offset, stream-snapshot-offset, producer-epoch, producer-seq, \
    producer-expected-seq, producer-received-seq, etag, content-type, location, retry-after, \
    x-ursula-not-applied, x-ursula-leader-id";

const ALLOWED_HEADERS: &str = "content-type, authorization, if-none-match, stream-ttl, \
    stream-expires-at, stream-closed, stream-seq, stream-forked-from, stream-fork-offset, \
    stream-fork-sub-offset, producer-id, producer-epoch, producer-seq";

const ALLOWED_METHODS: &str = "GET, POST, PUT, DELETE, HEAD, OPTIONS";

/// Answers CORS preflights on every path; puts the security headers on every answer, errors
/// included, and the CORS headers on answers to browsers (which send `Origin`; leaving them
/// off other answers keeps those small).
pub async fn browser_headers(request: Request, next: Next) -> Response {
    if request.method() == Method::OPTIONS {
        let mut response = Reply::new(StatusCode::NO_CONTENT)
            .header("access-control-allow-origin", "*")
            .header("access-control-allow-methods", ALLOWED_METHODS)
            .header("access-control-allow-headers", ALLOWED_HEADERS)
            .header("access-control-max-age", "86400")
            .build();
        add_common_headers(response.headers_mut(), true);
        return response;
    }
    let cors = request.headers().contains_key(http::header::ORIGIN);
    let mut response = next.run(request).await;
    add_common_headers(response.headers_mut(), cors);
    response
}

/// The security headers (the admin listener's answers carry them too), and CORS's.
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

/// Times every request but live reads (whose length is the client's choice) into
/// `ursula_http_request_seconds`.
pub async fn request_seconds(
    State(app): State<Arc<App>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(metrics) = app.metrics.clone() else {
        return next.run(request).await;
    };
    let live = request.method() == Method::GET && ursula_wire::is_live_read(request.uri().query());
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    if !live {
        metrics.request_seconds.observe(started.elapsed());
    }
    response
}

/// A `NotLeader` refusal that names a leader, or a `GroupNotHosted` one that names a voter of
/// the group, becomes a redirect to that node: 307 to its client URL with the same path and
/// query, naming it in `x-ursula-leader-id` (which gateways follow). Its body, and marker, stay.
pub async fn redirects(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let uri = request.uri().clone();
    let mut response = next.run(request).await;
    let Some(RedirectTo(node)) = response.extensions_mut().remove::<RedirectTo>() else {
        return response;
    };
    let Some(base) = app.groups.cluster.as_ref().and_then(|c| c.client_url(node)) else {
        return response;
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let location = format!("{}{path}", base.trim_end_matches('/'));
    if let Ok(location) = HeaderValue::from_str(&location) {
        *response.status_mut() = StatusCode::TEMPORARY_REDIRECT;
        let headers = response.headers_mut();
        headers.insert(http::header::LOCATION, location);
        headers.insert(ursula_wire::headers::LEADER_ID, HeaderValue::from(node));
        // A redirect is not a refusal to retry later.
        headers.remove(http::header::RETRY_AFTER);
    }
    response
}
