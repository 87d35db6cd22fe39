//! Server-sent events over real HTTP: a session delivers what is appended while it is open and
//! ends at `server.sse_max_duration`, so that clients reconnect from their last offset.

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use support::start_in_process;

const TEXT: (&str, &str) = ("content-type", "text/plain");

#[tokio::test]
async fn a_session_delivers_appends_and_ends_at_its_maximum_duration() {
    let max = Duration::from_millis(800);
    let node = start_in_process(|config| config.server.sse_max_duration = max).await;
    assert_eq!(
        node.client.put("/demo", &[], "").await.status,
        StatusCode::CREATED
    );
    let created = node.client.put("/demo/s", &[TEXT], "hello").await;
    assert_eq!(created.status, StatusCode::CREATED);

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
