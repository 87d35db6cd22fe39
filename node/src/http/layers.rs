//! The tower layer every request of the client listener passes through, HTTP and gateway link
//! alike: CORS preflights are answered here; every answer gets the security headers (and the
//! CORS headers, for browsers), is timed into the request-latency histogram, and a refusal that
//! names another node becomes a redirect to it. One layer with its own future, around the
//! whole router: no allocation per request (a `from_fn` layer boxes a future and clones its
//! inner service on every call, which cost 9% of the appends/s).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};

use super::App;
use super::error::RedirectTo;
use super::response::{Body, Reply};

const EXPOSED_HEADERS: &str = "stream-next-offset, stream-cursor, stream-up-to-date, \
    stream-closed, stream-ttl, stream-expires-at, stream-sse-data-encoding, \
    stream-retained-offset, stream-snapshot-offset, producer-epoch, producer-seq, \
    producer-expected-seq, producer-received-seq, etag, content-type, location, retry-after, \
    x-ursula-not-applied, x-ursula-leader-id";

const ALLOWED_HEADERS: &str = "content-type, authorization, if-none-match, stream-ttl, \
    stream-expires-at, stream-closed, stream-seq, stream-forked-from, stream-fork-offset, \
    stream-fork-sub-offset, producer-id, producer-epoch, producer-seq";

const ALLOWED_METHODS: &str = "GET, POST, PUT, DELETE, HEAD, OPTIONS";

/// The client listener's service: the router inside `Answers`.
pub type ClientService = Answers<axum::Router>;

/// See the module's documentation.
#[derive(Clone)]
pub struct Answers<S> {
    inner: S,
    app: Arc<App>,
}

impl<S> Answers<S> {
    pub fn new(app: Arc<App>, inner: S) -> Self {
        Self { inner, app }
    }
}

impl<S, B> tower::Service<Request<B>> for Answers<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if request.method() == Method::OPTIONS {
            return Answer::Preflight;
        }
        // Live reads last as long as the client asks, and a gateway link for as long as it is
        // open: neither is timed.
        let untimed = request.method() == Method::GET
            && (ursula_wire::is_live_read(request.uri().query())
                || request.headers().contains_key(http::header::UPGRADE));
        Answer::Routed {
            head: request.method() == Method::HEAD,
            cors: request.headers().contains_key(http::header::ORIGIN),
            started: (!untimed).then(Instant::now),
            uri: request.uri().clone(),
            app: self.app.clone(),
            inner: self.inner.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    #[project = AnswerProjection]
    pub enum Answer<F> {
        Preflight,
        Routed {
            head: bool,
            cors: bool,
            // `None` for what is not timed.
            started: Option<Instant>,
            uri: Uri,
            app: Arc<App>,
            #[pin]
            inner: F,
        },
    }
}

impl<F: Future<Output = Result<Response<Body>, Infallible>>> Future for Answer<F> {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            AnswerProjection::Preflight => Poll::Ready(Ok(preflight())),
            AnswerProjection::Routed {
                head,
                cors,
                started,
                uri,
                app,
                inner,
            } => {
                let Poll::Ready(Ok(mut response)) = inner.poll(cx) else {
                    return Poll::Pending;
                };
                redirect(app, uri, &mut response);
                add_common_headers(response.headers_mut(), *cors);
                // axum sets the length of the empty body; a HEAD's length would be the GET's.
                if *head {
                    response.headers_mut().remove(http::header::CONTENT_LENGTH);
                }
                if let (Some(started), Some(metrics)) = (started, &app.metrics) {
                    metrics.request_seconds.observe(started.elapsed());
                }
                Poll::Ready(Ok(response))
            }
        }
    }
}

fn preflight() -> Response<Body> {
    let mut response = Reply::new(StatusCode::NO_CONTENT)
        .header("access-control-allow-origin", "*")
        .header("access-control-allow-methods", ALLOWED_METHODS)
        .header("access-control-allow-headers", ALLOWED_HEADERS)
        .header("access-control-max-age", "86400")
        .build();
    add_common_headers(response.headers_mut(), true);
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

/// A `NotLeader` refusal that names a leader, or a `GroupNotHosted` one that names a voter of
/// the group, becomes a redirect to that node: 307 to its client URL with the same path and
/// query, naming it in `x-ursula-leader-id` (which gateways follow). Its body, and marker, stay.
fn redirect(app: &App, uri: &Uri, response: &mut Response<Body>) {
    let Some(RedirectTo(node)) = response.extensions_mut().remove::<RedirectTo>() else {
        return;
    };
    let Some(base) = app.groups.cluster.as_ref().and_then(|c| c.client_url(node)) else {
        return;
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
}
