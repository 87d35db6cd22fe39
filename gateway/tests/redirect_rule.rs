//! The gateway's rules against scripted upstreams: small programmable HTTP servers in this
//! test (named as such), each answering from a script and recording what it received.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::gateway;
use tokio::net::TcpListener;
use ursula_testkit::{Http, Reply};

mod support;

type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

#[derive(Clone)]
struct Seen {
    method: String,
    path: String,
    body: Bytes,
}

/// What a scripted upstream answers.
#[derive(Clone, Default)]
struct Scripted {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
    delay: Duration,
    /// Sent as separate body chunks, each after its pause.
    stream: Vec<(Duration, String)>,
}

fn answer(status: u16) -> Scripted {
    Scripted {
        status,
        ..Default::default()
    }
}

fn leader_redirect(to: &str, marked: bool) -> Scripted {
    let mut headers = vec![
        ("location".to_owned(), format!("{to}/demo/s")),
        ("x-ursula-leader-id".to_owned(), "2".to_owned()),
    ];
    if marked {
        headers.push(("x-ursula-not-applied".to_owned(), "NotLeader".to_owned()));
    }
    Scripted {
        status: 307,
        headers,
        ..Default::default()
    }
}

fn parts_are_link_upgrade(request: &Request<Incoming>) -> bool {
    request.uri().path() == ursula_wire::link::PATH && request.headers().contains_key("upgrade")
}

/// A scripted upstream: a programmable HTTP server standing in for a node. It speaks HTTP
/// only, like a node of a release before the gateway link: it refuses the link's upgrade with
/// a 404 (not recorded in `seen`), and the gateway must send it everything over HTTP.
struct ScriptedUpstream {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl ScriptedUpstream {
    async fn start(script: impl Fn(&Seen) -> Scripted + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let script = Arc::new(script);
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let script = script.clone();
                let log = log.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let script = script.clone();
                        let log = log.clone();
                        async move {
                            if parts_are_link_upgrade(&request) {
                                return Ok::<_, Infallible>(respond(Scripted {
                                    status: 404,
                                    ..Scripted::default()
                                }));
                            }
                            let (parts, body) = request.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let seen = Seen {
                                method: parts.method.to_string(),
                                path: parts.uri.path().to_owned(),
                                body,
                            };
                            log.lock().unwrap().push(seen.clone());
                            let scripted = script(&seen);
                            tokio::time::sleep(scripted.delay).await;
                            Ok::<_, Infallible>(respond(scripted))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { url, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn respond(scripted: Scripted) -> Response<Body> {
    let body: Body = if scripted.stream.is_empty() {
        Full::new(Bytes::from(scripted.body)).boxed_unsync()
    } else {
        let chunks =
            futures_util::stream::unfold(scripted.stream.into_iter(), |mut rest| async move {
                let (pause, chunk) = rest.next()?;
                tokio::time::sleep(pause).await;
                Some((Ok::<_, Infallible>(Frame::data(Bytes::from(chunk))), rest))
            });
        StreamBody::new(chunks).boxed_unsync()
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(scripted.status).expect("status");
    for (name, value) in scripted.headers {
        response.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
            http::HeaderValue::from_str(&value).expect("value"),
        );
    }
    response
}

/// An address nothing listens on.
async fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}")
}

async fn send(addr: SocketAddr, method: &str, path: &str, body: &str) -> Reply {
    send_as(addr, None, method, path, body).await
}

async fn send_as(
    addr: SocketAddr,
    bearer: Option<&str>,
    method: &str,
    path: &str,
    body: &str,
) -> Reply {
    let authorization = bearer.map(|token| format!("Bearer {token}"));
    let mut headers = vec![("content-type", "text/plain")];
    if let Some(value) = &authorization {
        headers.push(("authorization", value));
    }
    Http::new()
        .request(method, &format!("http://{addr}{path}"), &headers, body)
        .await
        .expect("gateway answers")
}

fn token(reply: &Reply) -> String {
    let value: serde_json::Value = serde_json::from_slice(&reply.body).expect("JSON error body");
    value["error"].as_str().expect("token").to_owned()
}

#[tokio::test]
async fn follows_a_leader_redirect_resending_the_body() {
    let leader = ScriptedUpstream::start(|_| {
        let mut ok = answer(204);
        ok.headers.push((
            "stream-next-offset".into(),
            "0000000000000000_0000000000000005".into(),
        ));
        ok
    })
    .await;
    let leader_url = leader.url.clone();
    let follower = ScriptedUpstream::start(move |_| leader_redirect(&leader_url, true)).await;
    let gw = gateway(vec![follower.url.clone(), leader.url.clone()], |_| {}).await;
    for _ in 0..2 {
        let reply = send(gw, "POST", "/demo/s", "hello").await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT);
        assert_eq!(reply.header("x-ursula-not-applied-checked"), Some("1"));
        assert_eq!(reply.header("x-ursula-not-applied"), None);
        assert_eq!(
            reply.header("stream-next-offset"),
            Some("0000000000000000_0000000000000005")
        );
    }
    let at_leader = leader.seen();
    assert_eq!(at_leader.len(), 2);
    assert!(
        at_leader
            .iter()
            .all(|s| s.body == "hello" && s.method == "POST" && s.path == "/demo/s")
    );
    // The second write went straight to the leader it learned.
    assert!(follower.seen().len() <= 2);
}

#[tokio::test]
async fn three_hops_at_most_then_leader_not_found() {
    let last = ScriptedUpstream::start(|_| answer(204)).await;
    let mut chain = vec![last.url.clone()];
    let mut upstreams = Vec::new();
    for _ in 0..4 {
        let next = chain.last().unwrap().clone();
        let hop = ScriptedUpstream::start(move |_| leader_redirect(&next, true)).await;
        chain.push(hop.url.clone());
        upstreams.push(hop);
    }
    // Order: the head of the chain first; the last upstream answers, but is 4 hops away.
    let mut urls: Vec<String> = upstreams.iter().rev().map(|u| u.url.clone()).collect();
    urls.push(last.url.clone());
    let gw = gateway(urls, |config| config.max_redirect_hops = 3).await;
    let reply = send(gw, "POST", "/demo/s", "x").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.header("x-ursula-not-applied"), Some("LeaderNotFound"));
    assert_eq!(reply.header("x-ursula-not-applied-checked"), Some("1"));
    assert_eq!(token(&reply), "LeaderNotFound");
    assert!(last.seen().is_empty(), "a fourth hop was made");
}

#[tokio::test]
async fn markers_pass_only_through_fully_marked_chains() {
    let refusing = ScriptedUpstream::start(|_| {
        let mut busy = answer(503);
        busy.headers
            .push(("x-ursula-not-applied".into(), "RaftLogPressure".into()));
        busy.headers.push(("retry-after".into(), "1".into()));
        busy
    })
    .await;
    for (marked, expect_marker) in [(true, Some("RaftLogPressure")), (false, None)] {
        let to = refusing.url.clone();
        let first = ScriptedUpstream::start(move |_| leader_redirect(&to, marked)).await;
        let gw = gateway(vec![first.url.clone(), refusing.url.clone()], |_| {}).await;
        let reply = send(gw, "POST", "/demo/s", "x").await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            reply.header("x-ursula-not-applied"),
            expect_marker,
            "redirect marked: {marked}"
        );
        assert_eq!(reply.header("x-ursula-not-applied-checked"), Some("1"));
    }
    // With no redirect at all, a node's marker passes straight through.
    let gw = gateway(vec![refusing.url.clone()], |_| {}).await;
    let reply = send(gw, "POST", "/demo/s", "x").await;
    assert_eq!(
        reply.header("x-ursula-not-applied"),
        Some("RaftLogPressure")
    );
}

#[tokio::test]
async fn unknown_or_visited_targets_go_to_untried_upstreams() {
    let answering = ScriptedUpstream::start(|_| answer(200)).await;
    let unknown = dead_url().await;
    let a = ScriptedUpstream::start(move |_| leader_redirect(&unknown, true)).await;
    let a_url = a.url.clone();
    let b = ScriptedUpstream::start(move |_| leader_redirect(&a_url, true)).await;
    // a points nowhere known, b points back at a: the gateway goes on to the untried one.
    let gw = gateway(
        vec![a.url.clone(), b.url.clone(), answering.url.clone()],
        |_| {},
    )
    .await;
    let reply = send(gw, "POST", "/demo/s", "x").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        (a.seen().len(), b.seen().len(), answering.seen().len()),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn no_hop_starts_after_the_window() {
    let late = ScriptedUpstream::start(|_| answer(204)).await;
    let to = late.url.clone();
    let slow = ScriptedUpstream::start(move |_| {
        let mut r = leader_redirect(&to, true);
        r.delay = Duration::from_millis(400);
        r
    })
    .await;
    let slow_url = slow.url.clone();
    let first = ScriptedUpstream::start(move |_| leader_redirect(&slow_url, true)).await;
    let gw = gateway(
        vec![first.url.clone(), slow.url.clone(), late.url.clone()],
        |config| {
            config.redirect_window = Duration::from_millis(200);
        },
    )
    .await;
    let reply = send(gw, "POST", "/demo/s", "x").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header("x-ursula-not-applied"), Some("LeaderNotFound"));
    assert!(late.seen().is_empty());
}

#[tokio::test]
async fn connection_failures() {
    let alive = ScriptedUpstream::start(|_| answer(204)).await;
    // The first upstream is down: nothing was sent, so the next one takes the request.
    let gw = gateway(vec![dead_url().await, alive.url.clone()], |_| {}).await;
    let reply = send(gw, "POST", "/demo/s", "x").await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    // Every upstream is down: 503, marked.
    let gw = gateway(vec![dead_url().await, dead_url().await], |_| {}).await;
    let reply = send(gw, "POST", "/demo/s", "x").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        reply.header("x-ursula-not-applied"),
        Some("UpstreamUnavailable")
    );
    // A redirect to an upstream that is down: marked only after marked redirects.
    for (marked, expect) in [(true, Some("UpstreamUnavailable")), (false, None)] {
        let dead = dead_url().await;
        let to = dead.clone();
        let first = ScriptedUpstream::start(move |_| leader_redirect(&to, marked)).await;
        let gw = gateway(vec![first.url.clone(), dead], |_| {}).await;
        let reply = send(gw, "POST", "/demo/s", "x").await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            reply.header("x-ursula-not-applied"),
            expect,
            "redirect marked: {marked}"
        );
        assert_eq!(reply.header("x-ursula-not-applied-checked"), Some("1"));
    }
}

#[tokio::test]
async fn refusals_before_forwarding_are_marked() {
    let upstream = ScriptedUpstream::start(|_| answer(204)).await;
    let gw = gateway(vec![upstream.url.clone()], |config| {
        config.max_buffered_body_size = 100
    })
    .await;
    let big = send(gw, "POST", "/demo/s", &"x".repeat(200)).await;
    assert_eq!(big.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        big.header("x-ursula-not-applied"),
        Some("RequestBodyTooLarge")
    );
    assert_eq!(token(&big), "RequestBodyTooLarge");
    for path in ["/admin/drain", "/admin/buckets/demo/purge", "/metrics"] {
        let admin = send(gw, "POST", path, "").await;
        assert_eq!(admin.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(admin.header("x-ursula-not-applied"), Some("NotFound"));
        assert_eq!(admin.header("x-ursula-not-applied-checked"), Some("1"));
    }
    assert!(upstream.seen().is_empty(), "nothing was forwarded");
}

#[tokio::test]
async fn other_redirects_pass_through_staying_on_the_gateway() {
    let upstream_url = Arc::new(Mutex::new(String::new()));
    let for_script = upstream_url.clone();
    let upstream = ScriptedUpstream::start(move |_| {
        let mut moved = answer(307);
        let base = for_script.lock().unwrap().clone();
        moved.headers.push((
            "location".into(),
            format!("{base}/demo/elsewhere?offset=-1"),
        ));
        moved
    })
    .await;
    *upstream_url.lock().unwrap() = upstream.url.clone();
    let gw = gateway(vec![upstream.url.clone()], |_| {}).await;
    let reply = send(gw, "GET", "/demo/s", "").await;
    assert_eq!(reply.status, StatusCode::TEMPORARY_REDIRECT);
    // The same path, on the gateway as the client addressed it.
    let on_gateway = format!("http://{gw}/demo/elsewhere?offset=-1");
    assert_eq!(reply.header("location"), Some(on_gateway.as_str()));
    assert_eq!(upstream.seen().len(), 1, "not followed");
}

#[tokio::test]
async fn event_streams_pass_through_unbuffered() {
    let upstream = ScriptedUpstream::start(|_| Scripted {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        stream: vec![
            (Duration::ZERO, "event: control\ndata:{}\n\n".into()),
            (Duration::from_secs(2), "event: data\ndata:late\n\n".into()),
        ],
        ..Default::default()
    })
    .await;
    let gw = gateway(vec![upstream.url.clone()], |_| {}).await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let started = std::time::Instant::now();
    let response = client
        .request(
            Request::get(format!("http://{gw}/demo/s?offset=-1&live=sse"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .expect("answer");
    assert_eq!(
        response
            .headers()
            .get("x-ursula-not-applied-checked")
            .unwrap(),
        "1"
    );
    let mut body = response.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    let first = first.into_data().expect("data frame");
    assert!(first.starts_with(b"event: control"));
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the first event waited for the second"
    );
}

#[tokio::test]
async fn access_control_and_tenant_limits_refuse_before_forwarding() {
    let upstream = ScriptedUpstream::start(|_| answer(204)).await;
    let dir = std::env::temp_dir().join(format!("ursula-gw-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys.toml");
    std::fs::write(
        &keys,
        "[[keys]]\ntoken = \"t1\"\nprincipal = \"alice\"\ntenant = \"acme\"\nread = [\"*\"]\nwrite = [\"demo\"]\n\
         [[tenants]]\nname = \"acme\"\nrequests_per_second = 1.0\nrequest_burst = 3\nwrite_byte_quota = 10\n",
    )
    .unwrap();
    let gw = gateway(vec![upstream.url.clone()], |config| {
        config.access_keys_file = Some(keys.clone());
    })
    .await;
    let anonymous = send(gw, "POST", "/demo/s", "x").await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));
    assert_eq!(token(&anonymous), "Unauthenticated");
    let forbidden = send_as(gw, Some("t1"), "POST", "/other/s", "x").await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
    assert_eq!(forbidden.header("x-ursula-not-applied"), Some("Forbidden"));
    assert!(upstream.seen().is_empty());

    let ok = send_as(gw, Some("t1"), "POST", "/demo/s", "12345678").await;
    assert_eq!(ok.status, StatusCode::NO_CONTENT);
    let over_quota = send_as(gw, Some("t1"), "POST", "/demo/s", "123").await;
    assert_eq!(over_quota.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(token(&over_quota), "QuotaExhausted");
    // Refused requests do not count against the rate: the burst of 3 is the write and two reads.
    for _ in 0..2 {
        let read = send_as(gw, Some("t1"), "GET", "/demo/s", "").await;
        assert_eq!(read.status, StatusCode::NO_CONTENT);
    }
    let limited = send_as(gw, Some("t1"), "GET", "/demo/s", "").await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.header("retry-after"), Some("1"));
    assert_eq!(token(&limited), "RateLimited");
    assert_eq!(
        upstream.seen().len(),
        3,
        "only allowed requests were forwarded"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
