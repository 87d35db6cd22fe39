//! Collapsed long-polls against a real `ursula-node` process: identical long-polls in flight
//! at once are one wait on the node, and every client gets its answer.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use support::{metric, start_gateway};
use ursula_testkit::Http;
use ursula_testkit::node::NodeProcess;

mod support;

const TEXT: (&str, &str) = ("content-type", "text/plain");

async fn collapsed(admin: SocketAddr) -> u64 {
    metric(admin, "ursula_gateway_collapsed_long_polls_total").await
}

/// A node, a gateway in front of it, and an empty text stream; answers the stream's URL on
/// the gateway and its tail.
async fn setup() -> (NodeProcess, ursula_gateway::Running, Http, String, String) {
    let node = NodeProcess::in_temp_dir();
    let gateway = start_gateway(vec![node.url()], |_| {}).await;
    let http = Http::new();
    let base = format!("http://{}", gateway.addr);
    for (path, headers) in [("/demo", vec![]), ("/demo/s", vec![TEXT])] {
        let reply = http
            .request("PUT", &format!("{base}{path}"), &headers, "")
            .await
            .expect("create");
        assert_eq!(reply.status, StatusCode::CREATED, "{path}");
    }
    let stream = format!("{base}/demo/s");
    let head = http.request("HEAD", &stream, &[], "").await.expect("head");
    let tail = head.header("stream-next-offset").expect("tail").to_owned();
    (node, gateway, http, stream, tail)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_long_polls_wait_once_and_all_get_the_answer() {
    let (_node, gateway, http, stream, tail) = setup().await;
    let url = format!("{stream}?offset={tail}&live=long-poll");
    let polls: Vec<_> = (0..20)
        .map(|_| {
            let http = http.clone();
            let url = url.clone();
            tokio::spawn(async move { http.request("GET", &url, &[], "").await })
        })
        .collect();
    // All twenty are waiting at the tail before anything is appended.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let appended = http
        .request("POST", &stream, &[TEXT], "hello")
        .await
        .expect("append");
    assert_eq!(appended.status, StatusCode::NO_CONTENT);
    let next = appended.header("stream-next-offset").expect("offset");
    for poll in polls {
        let reply = poll.await.expect("task").expect("answer");
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(&reply.body[..], b"hello");
        assert_eq!(reply.header("stream-next-offset"), Some(next));
        assert!(reply.header("stream-cursor").is_some());
        assert_eq!(reply.header("x-ursula-not-applied-checked"), Some("1"));
    }
    assert_eq!(collapsed(gateway.admin_addr).await, 19);

    // Once answered, the next identical long-poll waits on the node again.
    let late = {
        let http = http.clone();
        tokio::spawn(async move { http.request("GET", &url, &[], "").await })
    };
    let reply = late.await.expect("task").expect("answer");
    assert_eq!(
        &reply.body[..],
        b"hello",
        "the data from that offset, at once"
    );
    assert_eq!(collapsed(gateway.admin_addr).await, 19);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_that_differ_are_not_collapsed() {
    let (_node, gateway, http, stream, tail) = setup().await;
    let polls: Vec<_> = [
        format!("{stream}?offset={tail}&live=long-poll&cursor=1"),
        format!("{stream}?offset={tail}&live=long-poll&cursor=2"),
        format!("{stream}?live=long-poll&offset={tail}"),
    ]
    .into_iter()
    .map(|url| {
        let http = http.clone();
        tokio::spawn(async move { http.request("GET", &url, &[], "").await })
    })
    .collect();
    let with_etag = {
        let http = http.clone();
        let url = format!("{stream}?offset={tail}&live=long-poll&cursor=1");
        tokio::spawn(async move {
            http.request("GET", &url, &[("if-none-match", "\"other\"")], "")
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let appended = http
        .request("POST", &stream, &[TEXT], "x")
        .await
        .expect("append");
    assert_eq!(appended.status, StatusCode::NO_CONTENT);
    for poll in polls.into_iter().chain([with_etag]) {
        let reply = poll.await.expect("task").expect("answer");
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(&reply.body[..], b"x");
    }
    assert_eq!(collapsed(gateway.admin_addr).await, 0);
}
