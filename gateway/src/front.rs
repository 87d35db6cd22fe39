//! The gateway's listeners as route tables: the client listener, where every stream route of
//! the API overview is forwarded to the nodes, and the gateway's own admin listener.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use axum::Router;
use axum::extract::{Request, State};
use axum::response::IntoResponse;
use axum::routing::{any, get};
use http::header::HeaderValue;
use http::{Response, StatusCode, Uri};
use ursula_wire::{ErrorToken, headers};

use crate::proxy::Gateway;
use crate::refusal::{Body, Refusal, full};

/// The client listener's route table, every answer vouched for.
pub fn client(gateway: Arc<Gateway>) -> Vouched<Router> {
    let router = Router::new()
        // The nodes' admin routes are on the nodes' admin listeners, never forwarded (the
        // bucket ID `admin` is reserved, so no stream route starts with `/admin/`).
        .route("/admin", any(not_forwarded))
        .route("/admin/", any(not_forwarded))
        .route("/admin/{*route}", any(not_forwarded))
        .route("/healthz", any(not_forwarded))
        .route("/readyz", any(not_forwarded))
        .route("/metrics", any(not_forwarded))
        // Every stream route, `/{bucket}/...` and `/v1/stream/{name}`, goes to the nodes,
        // which name the refusal of a path they do not take.
        .fallback(forward)
        .with_state(gateway.clone());
    Vouched {
        inner: router,
        gateway,
    }
}

pub fn admin(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/healthz", get(ok))
        .route("/readyz", get(ok))
        .route("/metrics", get(metrics))
        .fallback(no_admin_route)
        .method_not_allowed_fallback(admin_method_not_allowed)
        .with_state(gateway)
}

async fn forward(State(gateway): State<Arc<Gateway>>, request: Request) -> Response<Body> {
    gateway.handle(request).await
}

async fn not_forwarded(State(gateway): State<Arc<Gateway>>, uri: Uri) -> Refusal {
    gateway.metrics.refusals.fetch_add(1, Ordering::Relaxed);
    Refusal::new(
        ErrorToken::NotFound,
        format!(
            "{} is not forwarded: node admin routes are on the nodes' admin listeners",
            uri.path()
        ),
        true,
    )
}

/// The layer that vouches for every answer the gateway returns (it applied the redirect rule,
/// so a marker on the answer can be trusted) and counts requests. A layer with its own future:
/// a `from_fn` layer would box a future and clone the router on every request.
#[derive(Clone)]
pub struct Vouched<S> {
    inner: S,
    gateway: Arc<Gateway>,
}

impl<S, B> tower::Service<http::Request<B>> for Vouched<S>
where
    S: tower::Service<http::Request<B>, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Vouch<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.gateway
            .metrics
            .requests
            .fetch_add(1, Ordering::Relaxed);
        Vouch {
            head: request.method() == http::Method::HEAD,
            inner: self.inner.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    pub struct Vouch<F> {
        head: bool,
        #[pin]
        inner: F,
    }
}

impl<F: Future<Output = Result<Response<Body>, Infallible>>> Future for Vouch<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Poll::Ready(Ok(mut response)) = this.inner.poll(cx) else {
            return Poll::Pending;
        };
        let map = response.headers_mut();
        map.insert(headers::NOT_APPLIED_CHECKED, HeaderValue::from_static("1"));
        // axum sets the length of the empty body it relays; a HEAD's length would be the GET's.
        if *this.head {
            map.remove(http::header::CONTENT_LENGTH);
        }
        Poll::Ready(Ok(response))
    }
}

async fn ok() -> Response<Body> {
    json(StatusCode::OK, r#"{"status":"ok"}"#.to_owned())
}

async fn metrics(State(gateway): State<Arc<Gateway>>) -> Response<Body> {
    let (tails_open, tail_clients) = gateway.shared_tails();
    let mut response = Response::new(full(gateway.metrics.render(tails_open, tail_clients)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

async fn no_admin_route(uri: Uri) -> Response<Body> {
    admin_error(
        ErrorToken::NotFound,
        format!("no admin route {:?}", uri.path()),
    )
}

async fn admin_method_not_allowed(method: http::Method, uri: Uri) -> Response<Body> {
    let message = format!("{method} is not allowed on {}", uri.path());
    admin_error(ErrorToken::MethodNotAllowed, message)
}

fn admin_error(token: ErrorToken, message: String) -> Response<Body> {
    let status = StatusCode::from_u16(token.status()).unwrap_or(StatusCode::NOT_FOUND);
    let body = ursula_wire::ErrorBody::new(token, message).to_json();
    json(status, String::from_utf8_lossy(&body).into_owned())
}

fn json(status: StatusCode, text: String) -> Response<Body> {
    let mut response = (status, text).into_response();
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn node_admin_routes_are_refused_marked_and_vouched() {
        let config = crate::config::Config {
            upstreams: vec!["http://127.0.0.1:9".into()],
            ..Default::default()
        };
        let trusted = Arc::new(ursula_tls::client_trusting_none().unwrap());
        let gateway = Arc::new(Gateway::new(config, None, trusted));
        let post = async |path: &str| {
            let request = Request::builder()
                .method("POST")
                .uri(path)
                .body(Body::empty());
            let answer = client(gateway.clone())
                .oneshot(request.expect("a request"))
                .await;
            let answer = answer.expect("an answer");
            assert_eq!(
                answer.headers()[headers::NOT_APPLIED_CHECKED],
                "1",
                "{path}"
            );
            answer
        };
        for path in [
            "/admin",
            "/admin/",
            "/admin/drain",
            "/admin/buckets/x/purge",
            "/healthz",
            "/readyz",
            "/metrics",
        ] {
            let answer = post(path).await;
            assert_eq!(answer.status(), StatusCode::NOT_FOUND, "{path}");
            assert_eq!(answer.headers()[headers::NOT_APPLIED], "NotFound", "{path}");
        }
        // Paths that only look like them are stream routes: forwarded (here to no node).
        for path in ["/administrators/x", "/demo/admin", "/v1/stream/admin"] {
            assert_eq!(
                post(path).await.status(),
                StatusCode::SERVICE_UNAVAILABLE,
                "{path}"
            );
        }
        // Each request counted once, each of them a refusal.
        let count = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!(count(&gateway.metrics.requests), 10);
        assert_eq!(count(&gateway.metrics.refusals), 10);
    }
}
