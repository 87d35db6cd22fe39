//! Server-sent events over real HTTP: a session delivers what is appended while it is open and
//! ends at `server.sse_max_duration`, so that clients reconnect from their last offset.

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use support::{InProcess, start_in_process};

const TEXT: (&str, &str) = ("content-type", "text/plain");

/// A node whose SSE sessions last `max`, with the text stream `path` of bucket `demo`.
async fn node_with_stream(max: Duration, path: &str, body: &'static str) -> InProcess {
    let node = start_in_process(|config| config.server.sse_max_duration = max).await;
    assert_eq!(
        node.client.put("/demo", &[], "").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        node.client.put(path, &[TEXT], body).await.status,
        StatusCode::CREATED
    );
    node
}

/// A cursor a client could echo that is ahead of the current interval.
fn cursor_ahead() -> u64 {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    ursula_wire::cursor::interval(now_ms) + 3
}

#[tokio::test]
async fn a_session_delivers_appends_and_ends_at_its_maximum_duration() {
    let max = Duration::from_millis(800);
    let node = node_with_stream(max, "/demo/s", "hello").await;

    let appender = node.client.clone();
    let append_later = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        appender.post("/demo/s", &[TEXT], "world").await
    });
    let started = Instant::now();
    let events = node.client.get("/demo/s?offset=-1&live=sse").await;
    let took = started.elapsed();

    assert_eq!(events.status, StatusCode::OK, "{}", events.text());
    assert_eq!(events.header("content-type"), Some("text/event-stream"));
    assert_eq!(
        append_later.await.expect("append task").status,
        StatusCode::NO_CONTENT
    );
    let text = events.text();
    let hello = text
        .find("data:hello")
        .expect("the first record is delivered");
    let world = text
        .find("data:world")
        .expect("the later append is delivered");
    assert!(hello < world, "in order: {text}");
    assert!(
        text.trim_end().ends_with("\"upToDate\":true}"),
        "the last event says where to resume: {text}"
    );
    assert!(took >= max, "the session ended early, after {took:?}");
    assert!(
        took < max + Duration::from_secs(2),
        "the session outlived its maximum duration: {took:?}"
    );
}

/// A client that echoes a cursor at or past the current interval gets greater ones, and
/// within one session they never go down (the jitter is drawn once, not per event).
#[tokio::test]
async fn an_echoed_cursor_is_passed_and_never_goes_down() {
    let node = node_with_stream(Duration::from_millis(800), "/demo/c", "").await;
    let echo = cursor_ahead();
    let appender = node.client.clone();
    let appends = tokio::spawn(async move {
        for i in 0..12 {
            tokio::time::sleep(Duration::from_millis(40)).await;
            appender.post("/demo/c", &[TEXT], format!("m{i}")).await;
        }
    });
    let events = node
        .client
        .get(&format!("/demo/c?offset=-1&live=sse&cursor={echo}"))
        .await;
    appends.await.expect("appends");
    let cursors: Vec<u64> = events
        .text()
        .lines()
        .filter_map(|line| line.strip_prefix("data:{"))
        .filter_map(|json| {
            let value: serde_json::Value = serde_json::from_str(&format!("{{{json}")).ok()?;
            value["streamCursor"].as_str()?.parse().ok()
        })
        .collect();
    assert!(cursors.len() > 5, "control events: {cursors:?}");
    assert!(cursors.iter().all(|c| *c > echo), "{cursors:?} > {echo}");
    assert!(
        cursors.windows(2).all(|w| w[0] <= w[1]),
        "never down: {cursors:?}"
    );
}

/// Subscribers woken by the same append share the event rendered for their position, and only
/// that: one that started elsewhere, or whose cursor is its own, gets its own event.
#[tokio::test]
async fn subscribers_at_other_positions_or_cursors_get_their_own_events() {
    let node = node_with_stream(Duration::from_millis(900), "/demo/f", "first;").await;
    let echo = cursor_ahead();
    let subscribe = |query: String| {
        let client = node.client.clone();
        tokio::spawn(async move { client.get(&format!("/demo/f?live=sse&{query}")).await })
    };
    let plain = [
        subscribe("offset=-1".into()),
        subscribe("offset=-1".into()),
        subscribe("offset=-1".into()),
    ];
    let echoing = subscribe(format!("offset=-1&cursor={echo}"));
    let from_now = subscribe("offset=now".into());
    tokio::time::sleep(Duration::from_millis(150)).await;
    for i in 0..6 {
        node.client.post("/demo/f", &[TEXT], format!("m{i};")).await;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let appended = "m0;m1;m2;m3;m4;m5;";

    /// The data and the cursors of a session's events.
    fn read(text: &str) -> (String, Vec<u64>) {
        let mut data = String::new();
        let mut cursors = Vec::new();
        for line in text.lines() {
            if let Some(json) = line.strip_prefix("data:{") {
                let value: serde_json::Value =
                    serde_json::from_str(&format!("{{{json}")).expect("control JSON");
                if let Some(cursor) = value["streamCursor"].as_str() {
                    cursors.push(cursor.parse().expect("cursor digits"));
                }
            } else if let Some(payload) = line.strip_prefix("data:") {
                data.push_str(payload);
            }
        }
        (data, cursors)
    }
    for subscriber in plain {
        let (data, cursors) = read(&subscriber.await.expect("subscriber").text());
        assert_eq!(data, format!("first;{appended}"));
        assert!(cursors.iter().all(|c| *c < echo), "{cursors:?} < {echo}");
    }
    let (data, cursors) = read(&echoing.await.expect("subscriber").text());
    assert_eq!(data, format!("first;{appended}"));
    assert!(
        !cursors.is_empty() && cursors.iter().all(|c| *c > echo),
        "{cursors:?} > {echo}"
    );
    let (data, _) = read(&from_now.await.expect("subscriber").text());
    assert_eq!(data, appended, "from now: only what came after");
    // And the subscribers at the same position did share: the node says how often.
    let metrics = node.admin.get("/metrics").await.text();
    let shared: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("ursula_sse_events_shared_total "))
        .and_then(|n| n.parse().ok())
        .expect("ursula_sse_events_shared_total");
    assert!(shared > 0, "no event was shared:\n{metrics}");
}

/// An echoed cursor of any size gets a greater one back, on long-polls and in SSE sessions.
#[tokio::test]
async fn an_echoed_cursor_beyond_64_bits_gets_a_greater_one() {
    let node = node_with_stream(Duration::from_millis(300), "/demo/h", "x").await;
    let echo = "98765432109876543210987654321";
    let greater =
        |reply: &str| reply.len() > echo.len() || (reply.len() == echo.len() && reply > echo);
    let polled = node
        .client
        .get(&format!("/demo/h?offset=-1&live=long-poll&cursor={echo}"))
        .await;
    assert_eq!(polled.status, StatusCode::OK, "{}", polled.text());
    let cursor = polled
        .header("stream-cursor")
        .expect("Stream-Cursor")
        .to_owned();
    assert!(greater(&cursor), "long-poll: {cursor} > {echo}");
    let events = node
        .client
        .get(&format!("/demo/h?offset=-1&live=sse&cursor={echo}"))
        .await
        .text();
    let cursors: Vec<String> = events
        .lines()
        .filter_map(|line| line.strip_prefix("data:{"))
        .filter_map(|json| {
            let value: serde_json::Value = serde_json::from_str(&format!("{{{json}")).ok()?;
            Some(value["streamCursor"].as_str()?.to_owned())
        })
        .collect();
    assert!(!cursors.is_empty(), "{events}");
    assert!(
        cursors.iter().all(|c| greater(c)),
        "SSE: {cursors:?} > {echo}"
    );
}
