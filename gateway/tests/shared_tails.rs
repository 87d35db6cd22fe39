//! Shared tails against a real `ursula-node` process: the gateway's SSE clients that follow
//! a stream from the same position share one subscription to the node, and each still sees
//! exactly what the node would have sent it.

use std::time::Duration;

use http::StatusCode;
use support::{Subscriber, metric, start_gateway};
use ursula_testkit::Http;
use ursula_testkit::node::NodeProcess;

mod support;

const TEXT: (&str, &str) = ("content-type", "text/plain");

/// The stream's tail, as a HEAD shows it.
async fn tail_of(http: &Http, stream: &str) -> String {
    let reply = http.request("HEAD", stream, &[], "").await.expect("head");
    assert_eq!(reply.status, StatusCode::OK);
    reply
        .header("stream-next-offset")
        .expect("offset")
        .to_owned()
}

/// Subscriptions opened, and clients that joined one.
async fn shared(gateway: &ursula_gateway::Running) -> (u64, u64) {
    (
        metric(
            gateway.admin_addr,
            "ursula_gateway_shared_tails_opened_total",
        )
        .await,
        metric(gateway.admin_addr, "ursula_gateway_shared_tail_joins_total").await,
    )
}

async fn append(http: &Http, url: &str, body: &str) -> String {
    let reply = http
        .request("POST", url, &[TEXT], body)
        .await
        .expect("append");
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    reply
        .header("stream-next-offset")
        .expect("offset")
        .to_owned()
}

/// A node, a gateway in front of it, and a text stream `/demo/s` holding "a".
async fn setup() -> (NodeProcess, ursula_gateway::Running, Http, String) {
    let node = NodeProcess::in_temp_dir();
    let gateway = start_gateway(vec![node.url()], |_| {}).await;
    let http = Http::new();
    let base = format!("http://{}", gateway.addr);
    for (path, body) in [("/demo", ""), ("/demo/s", "a")] {
        let reply = http
            .request("PUT", &format!("{base}{path}"), &[TEXT], body)
            .await
            .expect("create");
        assert_eq!(reply.status, StatusCode::CREATED, "{path}");
    }
    (node, gateway, http, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_at_the_tail_share_one_subscription_and_see_what_the_node_sends() {
    let (node, gateway, http, base) = setup().await;
    let stream = format!("{base}/demo/s");

    let mut first = Subscriber::open(&format!("{stream}?offset=now&live=sse")).await;
    let announced = first.control().await;
    let tail = announced["streamNextOffset"].as_str().unwrap().to_owned();
    assert_eq!(announced["upToDate"], true);

    let mut others = Vec::new();
    for i in 0..15 {
        let url = if i % 3 == 0 {
            format!("{stream}?live=sse&offset={tail}")
        } else {
            format!("{stream}?offset=now&live=sse")
        };
        others.push(Subscriber::open(&url).await);
    }
    for other in &mut others {
        let control = other.control().await;
        assert_eq!(control["streamNextOffset"], tail.as_str());
        assert_eq!(control["upToDate"], true);
        assert!(
            control["streamCursor"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .is_ok()
        );
    }
    let mut direct =
        Subscriber::open(&format!("{}/demo/s?offset={tail}&live=sse", node.url())).await;
    direct.control().await;

    let mut offsets = Vec::new();
    for text in ["m1", "m2", "m3"] {
        offsets.push(append(&http, &stream, text).await);
    }
    let last = offsets.last().unwrap().clone();
    let expected = direct.until(&last).await;
    assert_eq!(expected.data, "m1m2m3");
    for subscriber in std::iter::once(&mut first).chain(others.iter_mut()) {
        let seen = subscriber.until(&last).await;
        assert_eq!(seen.data, expected.data);
        assert_eq!(seen.offsets.last(), Some(&last));
        assert!(seen.offsets.iter().all(|o| offsets.contains(o)), "{seen:?}");
    }
    assert_eq!(shared(&gateway).await, (1, 15));
    assert_eq!(
        metric(gateway.admin_addr, "ursula_gateway_shared_tail_clients").await,
        16
    );
    drop(first);
    drop(others);
    // The gateway notices the clients left on its next write to them at the latest.
    append(&http, &stream, "m4").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while metric(gateway.admin_addr, "ursula_gateway_shared_tails_open").await != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the subscription is let go"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_now_starts_after_every_acknowledged_append() {
    let (_node, gateway, http, base) = setup().await;
    let stream = format!("{base}/demo/s");
    let created_at = tail_of(&http, &stream).await;
    let mut first = Subscriber::open(&format!("{stream}?offset=now&live=sse")).await;
    first.control().await;

    for i in 0..20 {
        let acknowledged = append(&http, &stream, &format!("x{i}")).await;
        let mut late = Subscriber::open(&format!("{stream}?offset=now&live=sse")).await;
        let control = late.control().await;
        assert_eq!(
            control["streamNextOffset"],
            acknowledged.as_str(),
            "round {i}"
        );
        let next = append(&http, &stream, &format!("y{i}")).await;
        let seen = late.until(&next).await;
        assert_eq!(seen.data, format!("y{i}"), "round {i}: {seen:?}");
    }
    assert!(
        shared(&gateway).await.1 >= 10,
        "most late clients joined the shared subscription"
    );
    // A large append keeps the shared subscription behind the tail for a while after it is
    // acknowledged: a client at `now` must still start after it.
    let large = "z".repeat(3 << 20);
    let acknowledged = append(&http, &stream, &large).await;
    let mut late = Subscriber::open(&format!("{stream}?offset=now&live=sse")).await;
    assert_eq!(
        late.control().await["streamNextOffset"],
        acknowledged.as_str()
    );
    let next = append(&http, &stream, "after").await;
    assert_eq!(late.until(&next).await.data, "after");

    // A client behind the shared position is served from its own offset.
    let mut behind = Subscriber::open(&format!("{stream}?offset={created_at}&live=sse")).await;
    let tail = tail_of(&http, &stream).await;
    let seen = behind.until(&tail).await;
    let mut all: String = (0..20).map(|i| format!("x{i}y{i}")).collect();
    all.push_str(&large);
    all.push_str("after");
    assert_eq!(seen.data, all);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_stream_ends_every_client_and_later_ones_are_told_it_closed() {
    let (_node, gateway, http, base) = setup().await;
    let stream = format!("{base}/demo/s");
    let mut subscribers = Vec::new();
    for _ in 0..5 {
        let mut subscriber = Subscriber::open(&format!("{stream}?offset=now&live=sse")).await;
        subscriber.control().await;
        subscribers.push(subscriber);
    }
    let closed = http
        .request("POST", &stream, &[TEXT, ("stream-closed", "true")], "last")
        .await
        .expect("close");
    assert_eq!(closed.status, StatusCode::NO_CONTENT);
    for subscriber in &mut subscribers {
        let seen = subscriber.until("").await;
        assert_eq!(seen.data, "last");
        assert!(seen.closed, "{seen:?}");
        assert_eq!(subscriber.event().await, None, "the response ends");
    }
    let mut later = Subscriber::open(&format!("{stream}?offset=now&live=sse")).await;
    assert_eq!(later.control().await["streamClosed"], true);
    assert_eq!(later.event().await, None);
    assert_eq!(shared(&gateway).await.1, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_nobody_follows_any_more_is_let_go() {
    let (_node, gateway, http, base) = setup().await;
    let stream = format!("{base}/demo/s");
    let url = format!("{stream}?offset=now&live=sse");
    let mut subscribers = Vec::new();
    for _ in 0..3 {
        let mut subscriber = Subscriber::open(&url).await;
        subscriber.control().await;
        subscribers.push(subscriber);
    }
    drop(subscribers);
    // The gateway notices on its next write to them at the latest.
    append(&http, &stream, "b").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut next = Subscriber::open(&url).await;
    let control = next.control().await;
    assert_eq!(control["upToDate"], true);
    assert_eq!(
        shared(&gateway).await.0,
        2,
        "a new subscription, not the abandoned one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_echoed_a_cursor_gets_greater_ones_of_its_own() {
    let (_node, gateway, http, base) = setup().await;
    let stream = format!("{base}/demo/s");
    let mut plain = Subscriber::open(&format!("{stream}?offset=now&live=sse")).await;
    let current: u64 = plain.control().await["streamCursor"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // As the Durable Streams client reconnects: with the cursor it was last given.
    let echo = current + 5;
    let mut echoing =
        Subscriber::open(&format!("{stream}?offset=now&live=sse&cursor={echo}")).await;
    let first: u64 = echoing.control().await["streamCursor"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(first > echo, "{first} > {echo}");
    let mut last = String::new();
    for text in ["c1", "c2", "c3"] {
        last = append(&http, &stream, text).await;
    }
    let seen = echoing.until(&last).await;
    assert_eq!(seen.data, "c1c2c3");
    assert!(!seen.cursors.is_empty());
    assert!(seen.cursors.iter().all(|c| *c > echo), "{seen:?}");
    assert!(
        seen.cursors.windows(2).all(|w| w[0] <= w[1]) && seen.cursors[0] >= first,
        "cursors never go down: {first} then {:?}",
        seen.cursors
    );
    let seen = plain.until(&last).await;
    assert_eq!(seen.data, "c1c2c3");
    assert!(seen.cursors.iter().all(|c| *c <= current + 1), "{seen:?}");
    assert_eq!(shared(&gateway).await.1, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_clients_keep_a_sliding_ttl_alive_as_their_own_reads_would() {
    let (_node, gateway, http, base) = setup().await;
    let stream = format!("{base}/demo/ttl");
    let created = http
        .request("PUT", &stream, &[TEXT, ("stream-ttl", "1")], "")
        .await
        .expect("create");
    assert_eq!(created.status, StatusCode::CREATED);
    let url = format!("{stream}?offset=now&live=sse");
    let mut subscribers = vec![Subscriber::open(&url).await];
    // Longer than the TTL, read only by clients joining the shared subscription.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut joining = Subscriber::open(&url).await;
        assert_eq!(joining.control().await["upToDate"], true);
        subscribers.push(joining);
    }
    let head = http.request("HEAD", &stream, &[], "").await.expect("head");
    assert_eq!(head.status, StatusCode::OK, "the stream is still alive");
    assert_eq!(shared(&gateway).await.0, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsers_get_cors_headers_whoever_opened_the_subscription() {
    let (_node, gateway, _http, base) = setup().await;
    let url = format!("{base}/demo/s?offset=now&live=sse");
    let (_server_side, headers) = Subscriber::open_with(&url, &[]).await;
    assert!(!headers.contains_key("access-control-allow-origin"));
    let origin = [("origin", "https://app.example")];
    let mut browsers = Vec::new();
    for _ in 0..3 {
        let (mut browser, headers) = Subscriber::open_with(&url, &origin).await;
        assert_eq!(headers["access-control-allow-origin"], "*");
        browser.control().await;
        browsers.push(browser);
    }
    assert_eq!(shared(&gateway).await, (2, 2));
}
