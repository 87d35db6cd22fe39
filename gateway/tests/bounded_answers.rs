//! A node that answers nothing at all, frozen with SIGSTOP as a stalled machine is: the gateway
//! still answers each request that is not a live read within its `request_timeout`, with 503
//! `RequestTimeout`, `Retry-After: 1` and no marker, because the node may have taken the
//! request. This one does: once the node thaws, the append it had received applies.

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use support::start_gateway;
use ursula_testkit::Http;
use ursula_testkit::node::NodeProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_costs_an_unmarked_request_timeout_within_the_limit() {
    // Shorter than the default 15 s only to keep the test short; the rule is the same.
    const LIMIT: Duration = Duration::from_secs(2);
    let node = NodeProcess::in_temp_dir();
    let gateway = start_gateway(vec![node.url()], |config| {
        config.request_timeout = LIMIT;
    })
    .await;
    let http = Http::new();
    let url = |path: &str| format!("http://{}{path}", gateway.addr);
    let text = [("content-type", "text/plain")];
    for path in ["/frozen", "/frozen/s"] {
        let reply = http
            .request("PUT", &url(path), &text, "")
            .await
            .expect("an answer");
        assert_eq!(reply.status, StatusCode::CREATED, "{path}");
    }

    node.freeze();
    for (method, path, body) in [
        ("POST", "/frozen/s", "sent-while-frozen"),
        ("GET", "/frozen/s?offset=-1", ""),
        ("HEAD", "/frozen/s", ""),
    ] {
        let started = Instant::now();
        let reply = tokio::time::timeout(LIMIT * 5, http.request(method, &url(path), &text, body))
            .await
            .unwrap_or_else(|_| panic!("{method} {path}: no answer from the gateway"))
            .expect("an answer");
        let took = started.elapsed();
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{method} {path}"
        );
        if method != "HEAD" {
            let body: serde_json::Value = serde_json::from_slice(&reply.body).expect("JSON");
            assert_eq!(body["error"], "RequestTimeout", "{method} {path}");
        }
        assert_eq!(reply.header("retry-after"), Some("1"), "{method} {path}");
        assert_eq!(
            reply.header("x-ursula-not-applied"),
            None,
            "{method} {path}"
        );
        assert_eq!(reply.header("x-ursula-not-applied-checked"), Some("1"));
        assert!(
            took >= LIMIT && took < LIMIT + Duration::from_secs(1),
            "{method} {path} answered after {took:?}, the limit is {LIMIT:?}"
        );
    }

    node.thaw();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = http
            .request("GET", &url("/frozen/s?offset=-1"), &[], "")
            .await
            .expect("an answer");
        if reply.status == StatusCode::OK && reply.body.as_ref() == b"sent-while-frozen" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the append the node received while frozen never applied: {} {:?}",
            reply.status,
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
