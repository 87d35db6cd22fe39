//! Forwarding: one request in, attempts to upstreams under the redirect rule, one answer out,
//! always with the vouch `x-ursula-not-applied-checked: 1`.

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ursula_wire::{ErrorToken, headers};

use crate::access::{Access, bucket_of};
use crate::config::Config;
use crate::follow::{Decision, Follow, Limits, Observed};
use crate::link::{self, Links};
use crate::metrics::Metrics;
use crate::prepared::{Prepared, Upstream};
use crate::refusal::{Body, Refusal, full};
use crate::upstream::Upstreams;

pub struct Gateway {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// `None` when `upstream_link` is off.
    links: Option<Links>,
    /// `None` when `shared_tails` is off.
    tails: Option<crate::tails::Tails>,
    /// `None` when `collapse_long_polls` is off.
    collapse: Option<crate::collapse::Collapse>,
    access: Option<Access>,
    pub upstreams: Upstreams,
    config: Config,
    pub metrics: Metrics,
}

/// Connection-scoped headers, never forwarded in either direction.
/// (Names, not strings: a string is parsed into a name on every look-up.)
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

fn strip_hop_by_hop(map: &mut HeaderMap) {
    let named: Vec<HeaderName> = map
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        map.remove(name);
    }
    for name in &HOP_BY_HOP {
        map.remove(name);
    }
}

/// `/{bucket}/{stream}/snapshot/{offset}` or `/v1/stream/{name}/snapshot/{offset}`.
fn is_snapshot_path(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    segments.len() >= 4 && segments[segments.len() - 2] == "snapshot"
}

impl Gateway {
    /// Shared SSE subscriptions open now, and the clients they are relayed to.
    pub fn shared_tails(&self) -> (usize, usize) {
        self.tails
            .as_ref()
            .map_or((0, 0), crate::tails::Tails::gauges)
    }

    pub fn new(
        config: Config,
        access: Option<Access>,
        upstream_tls: std::sync::Arc<rustls::ClientConfig>,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.connect_timeout));
        connector.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config((*upstream_tls).clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(256)
            .build(connector);
        let upstreams = Upstreams::new(&config.upstreams);
        let links = config.upstream_link.then(|| {
            Links::new(
                (0..upstreams.len()).map(|i| upstreams.origin(i)),
                config.connect_timeout,
                &upstream_tls,
            )
        });
        let tails = config.shared_tails.then(crate::tails::Tails::default);
        let collapse = config
            .collapse_long_polls
            .then(crate::collapse::Collapse::default);
        Self {
            client,
            links,
            tails,
            collapse,
            access,
            upstreams,
            config,
            metrics: Metrics::default(),
        }
    }

    /// Answers one client request: forwarded under the redirect rule, or refused.
    pub async fn handle(&self, request: axum::extract::Request) -> Response<Body> {
        self.forward(request).await.unwrap_or_else(|refusal| {
            self.metrics.refusals.fetch_add(1, Ordering::Relaxed);
            refusal.into_response()
        })
    }

    async fn forward(&self, request: axum::extract::Request) -> Result<Response<Body>, Refusal> {
        let prepared = self.prepare(request).await?;
        if let Some(tails) = &self.tails
            && let Some(follow) = crate::tails::TailRequest::of(&prepared)
        {
            return tails.serve(self, prepared, follow).await;
        }
        if let Some(collapse) = &self.collapse
            && let Some(key) = crate::collapse::key(&prepared)
        {
            return collapse.serve(self, &prepared, key).await;
        }
        if prepared.is_live_read() {
            return self.send(&prepared).await;
        }
        let limit = self.config.request_timeout;
        tokio::time::timeout(limit, self.send(&prepared))
            .await
            .unwrap_or_else(|_| {
                Err(Refusal::new(
                    ErrorToken::RequestTimeout,
                    format!(
                        "no node answered within the gateway's request_timeout ({limit:?}); a write may still apply: retry it (with the same producer headers, for exactly once)"
                    ),
                    false,
                ))
            })
    }

    /// Checks a request before anything is forwarded (route, credentials, body limit, access)
    /// and readies it to be sent to any upstream.
    async fn prepare(&self, request: axum::extract::Request) -> Result<Prepared, Refusal> {
        let (mut parts, incoming) = request.into_parts();
        let path = parts.uri.path().to_owned();
        let write = !matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS);
        let authorization = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if let Some(access) = &self.access
            && parts.method != Method::OPTIONS
            && !access.authenticated(authorization.as_deref())
        {
            return Err(Refusal::new(
                ErrorToken::Unauthenticated,
                "a valid bearer token is required",
                true,
            ));
        }
        // A write's body is kept so that each hop can resend it.
        let body = if write {
            let limit = if parts.method == Method::PUT && is_snapshot_path(&path) {
                self.config.max_buffered_snapshot_size
            } else {
                self.config.max_buffered_body_size
            };
            self.buffer(&parts.headers, incoming, limit).await?
        } else {
            Bytes::new()
        };
        if let Some(access) = &self.access
            && parts.method != Method::OPTIONS
        {
            let bucket = bucket_of(&path, &self.config.compat_bucket);
            access
                .check(
                    authorization.as_deref(),
                    bucket,
                    write,
                    body.len() as u64,
                    Instant::now(),
                )
                .map_err(|denied| Refusal::new(denied.token, denied.message, true))?;
        }
        strip_hop_by_hop(&mut parts.headers);
        // How the client addressed the gateway, for `Location`s that must stay on it.
        let origin = parts
            .headers
            .remove(header::HOST)
            .and_then(|host| host.to_str().ok().map(|h| format!("http://{h}")))
            .or_else(|| parts.uri.authority().map(|a| format!("http://{a}")));
        // Nodes do not authenticate; the credential stays at the gateway.
        if self.access.is_some() {
            parts.headers.remove(header::AUTHORIZATION);
        }
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        Ok(Prepared {
            parts,
            path,
            path_and_query,
            body,
            origin,
            write,
        })
    }

    /// Sends a prepared request under the redirect rule and relays the final answer.
    pub(crate) async fn send(&self, prepared: &Prepared) -> Result<Response<Body>, Refusal> {
        let Prepared {
            parts,
            path,
            path_and_query,
            body,
            origin,
            write,
        } = prepared;
        let limits = Limits {
            max_hops: self.config.max_redirect_hops,
            window: self.config.redirect_window,
        };
        let (mut follow, mut decision) =
            Follow::new(self.upstreams.len(), self.upstreams.pick(path), limits);
        loop {
            let index = match decision {
                Decision::Send(index) => index,
                Decision::Unavailable { token, marked } => {
                    return Err(Refusal::new(
                        token,
                        "no node answered without redirecting; retry",
                        marked,
                    ));
                }
                Decision::Return { .. } => {
                    return Err(Refusal::new(
                        ErrorToken::Internal,
                        "redirect rule ended early",
                        false,
                    ));
                }
            };
            let answer = match self.attempt(index, parts, path_and_query, body).await {
                Ok(answer) => answer,
                Err(Attempt::ConnectFailed) => {
                    decision = follow.observe(Observed::ConnectFailed, Instant::now());
                    continue;
                }
                Err(Attempt::Failed(mut refusal)) => {
                    // A refusal on a later hop proves nothing if an earlier node redirected
                    // without a marker: that node may have proposed the write.
                    refusal.marked &= follow.all_redirects_marked();
                    return Err(refusal);
                }
            };
            follow.delivered();
            let answer_headers = answer.headers();
            if answer.status() == StatusCode::TEMPORARY_REDIRECT
                && answer_headers.contains_key(headers::LEADER_ID)
            {
                let marked = answer_headers.contains_key(headers::NOT_APPLIED);
                let target = answer_headers
                    .get(header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| self.upstreams.find(l));
                self.metrics
                    .redirects_followed
                    .fetch_add(1, Ordering::Relaxed);
                decision =
                    follow.observe(Observed::LeaderRedirect { target, marked }, Instant::now());
                continue;
            }
            let Decision::Return { keep_marker } = follow.observe(Observed::Answer, Instant::now())
            else {
                continue;
            };
            if *write && !answer.status().is_server_error() {
                self.upstreams.remember_leader(path, follow.current());
            }
            return Ok(self.relay(answer, keep_marker, origin.as_deref()));
        }
    }

    /// Sends one attempt to upstream `index`: over the gateway link when the answer is bounded
    /// and the link can carry it, otherwise (or when the link did not send it) over HTTP.
    async fn attempt(
        &self,
        index: usize,
        parts: &http::request::Parts,
        path_and_query: &str,
        body: &Bytes,
    ) -> Result<Response<Body>, Attempt> {
        if let Some(links) = &self.links
            && goes_on_link(parts, body)
        {
            let sent = links
                .send(
                    index,
                    parts.method.clone(),
                    path_and_query.to_owned(),
                    parts.headers.clone(),
                    body.clone(),
                )
                .await;
            match sent {
                Ok(answer) => {
                    self.metrics.link_requests.fetch_add(1, Ordering::Relaxed);
                    let mut response = Response::new(full(answer.body));
                    *response.status_mut() = answer.status;
                    *response.headers_mut() = answer.headers;
                    return Ok(response);
                }
                Err(link::SendError::NotSent) => {}
                Err(error @ link::SendError::Lost(_)) => return Err(Attempt::answer_lost(error)),
            }
        }
        let uri = format!(
            "{}{}",
            self.upstreams.origin(index).as_str(),
            path_and_query
        );
        let mut attempt = Request::builder()
            .method(parts.method.clone())
            .uri(uri)
            .body(Full::new(body.clone()))
            .map_err(|e| {
                Attempt::Failed(Refusal::new(ErrorToken::InvalidHeader, e.to_string(), true))
            })?;
        *attempt.headers_mut() = parts.headers.clone();
        match self.client.request(attempt).await {
            Ok(answer) => Ok(answer.map(Body::new)),
            Err(error) if error.is_connect() => {
                tracing::debug!(%error, upstream = index, "cannot connect to upstream");
                Err(Attempt::ConnectFailed)
            }
            Err(error) => Err(Attempt::answer_lost(error)),
        }
    }

    /// Buffers a write body up to `limit` bytes.
    async fn buffer(
        &self,
        headers: &HeaderMap,
        mut incoming: Body,
        limit: u64,
    ) -> Result<Bytes, Refusal> {
        let too_large = || {
            Refusal::new(
                ErrorToken::RequestBodyTooLarge,
                format!("the gateway buffers write bodies up to {limit} bytes"),
                true,
            )
        };
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > limit) {
            return Err(too_large());
        }
        let mut out = Vec::with_capacity(declared.unwrap_or(0) as usize);
        while let Some(frame) = incoming.frame().await {
            let frame = frame.map_err(|e| {
                Refusal::new(
                    ErrorToken::InvalidHeader,
                    format!("cannot read the body: {e}"),
                    true,
                )
            })?;
            if let Ok(data) = frame.into_data() {
                if out.len() as u64 + data.len() as u64 > limit {
                    return Err(too_large());
                }
                out.extend_from_slice(&data);
            }
        }
        Ok(Bytes::from(out))
    }

    /// Passes an upstream's answer on, streaming its body (SSE and long-polls included).
    fn relay(
        &self,
        answer: Response<Body>,
        keep_marker: bool,
        origin: Option<&str>,
    ) -> Response<Body> {
        let (mut parts, body) = answer.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        if !keep_marker {
            parts.headers.remove(headers::NOT_APPLIED);
        }
        // Node addresses stay hidden: a `Location` naming a node (a redirect other than a
        // leader redirect, or a created stream's URL) names the same path on the gateway, as
        // the client addressed it.
        if let Some(location) = parts
            .headers
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            && self.upstreams.find(location).is_some()
            && let Ok(uri) = location.parse::<http::Uri>()
            && let Some(path) = uri.path_and_query()
            && let Ok(value) =
                HeaderValue::from_str(&format!("{}{}", origin.unwrap_or(""), path.as_str()))
        {
            parts.headers.insert(header::LOCATION, value);
        }
        Response::from_parts(parts, body)
    }
}

impl Upstream for Gateway {
    /// The inherent `Gateway::send` (an inherent method is found before a trait's).
    async fn send(&self, prepared: &Prepared) -> Result<Response<Body>, Refusal> {
        Gateway::send(self, prepared).await
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

/// How one attempt failed.
enum Attempt {
    /// The request did not reach the upstream.
    ConnectFailed,
    Failed(Refusal),
}

impl Attempt {
    /// The request may have reached the node: nothing is proven, so no marker.
    fn answer_lost(error: impl std::fmt::Display) -> Self {
        Self::Failed(Refusal::new(
            ErrorToken::Unavailable,
            format!("the node's answer was lost: {error}"),
            false,
        ))
    }
}

/// Bodies up to this size go on the link; a larger one would hold up the answers behind it.
const LINK_MAX_BODY: usize = 1024 * 1024;

/// Whether a request goes on the gateway link: its answer must be bounded, so a live read
/// other than a long-poll (SSE, or a mode this gateway does not know) goes over HTTP.
fn goes_on_link(parts: &http::request::Parts, body: &Bytes) -> bool {
    if body.len() > LINK_MAX_BODY {
        return false;
    }
    // Every `live` parameter is looked at: the node goes by the last one.
    parts.uri.query().is_none_or(|query| {
        query
            .split('&')
            .filter(|pair| *pair == "live" || pair.starts_with("live="))
            .all(|pair| pair == "live=long-poll")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requests_with_a_bounded_answer_go_on_the_link() {
        let parts = |method: Method, uri: &str| {
            Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .unwrap()
                .into_parts()
                .0
        };
        let small = Bytes::from_static(b"x");
        for (method, uri, body, on_link) in [
            (Method::POST, "/d/s", small.clone(), true),
            (Method::GET, "/d/s?offset=-1", Bytes::new(), true),
            (
                Method::GET,
                "/d/s?offset=5&live=long-poll",
                Bytes::new(),
                true,
            ),
            (Method::GET, "/d/s?offset=5&live=sse", Bytes::new(), false),
            (
                Method::GET,
                "/d/s?live=long-poll&live=sse",
                Bytes::new(),
                false,
            ),
            (Method::GET, "/d/s?live", Bytes::new(), false),
            (Method::GET, "/d/s?live=other", Bytes::new(), false),
            (Method::GET, "/d/s?olive=sse", Bytes::new(), true),
            (
                Method::POST,
                "/d/s",
                Bytes::from(vec![0; LINK_MAX_BODY + 1]),
                false,
            ),
        ] {
            assert_eq!(
                goes_on_link(&parts(method.clone(), uri), &body),
                on_link,
                "{method} {uri} ({} bytes)",
                body.len()
            );
        }
    }

    #[test]
    fn hop_by_hop_headers_and_those_named_by_connection_are_stripped() {
        let mut map = HeaderMap::new();
        map.insert(
            "connection",
            HeaderValue::from_static("x-private, keep-alive"),
        );
        map.insert("x-private", HeaderValue::from_static("1"));
        map.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        map.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        map.insert("content-type", HeaderValue::from_static("text/plain"));
        strip_hop_by_hop(&mut map);
        let left: Vec<&str> = map.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["content-type"]);
    }

    #[test]
    fn snapshot_paths() {
        for (path, snapshot) in [
            ("/demo/s/snapshot/0000000000000000_0000000000000010", true),
            (
                "/v1/stream/s/snapshot/0000000000000000_0000000000000010",
                true,
            ),
            ("/demo/s", false),
            ("/demo/snapshot/5", false),
            ("/demo/s/bootstrap", false),
            ("/demo/s/retention/5", false),
        ] {
            assert_eq!(is_snapshot_path(path), snapshot, "{path}");
        }
    }
}
