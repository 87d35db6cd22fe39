//! The node's end of the gateway link, spoken by a raw TCP client: many requests written at
//! once are each answered as over HTTP, SSE is refused (it stays on HTTP), a stopping node
//! says which requests it answers, and a stream that breaks the framing is closed.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use bytes::BytesMut;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use support::start_in_process;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use ursula_wire::link::{self, Frame};

const TEXT: (&str, &str) = ("content-type", "text/plain");

/// Opens a link: the upgrade, then frames. Returns the stream and what followed the `101`.
async fn open(addr: std::net::SocketAddr) -> (TcpStream, BytesMut) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let upgrade = format!(
        "GET {} HTTP/1.1\r\nhost: node\r\nconnection: upgrade\r\nupgrade: {}\r\n\r\n",
        link::PATH,
        link::PROTOCOL
    );
    stream.write_all(upgrade.as_bytes()).await.expect("write");
    let mut buffer = BytesMut::new();
    let end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        assert!(
            stream.read_buf(&mut buffer).await.expect("read") > 0,
            "closed during the upgrade"
        );
    };
    let head = String::from_utf8_lossy(&buffer.split_to(end)).into_owned();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: ursula-link/1"),
        "{head}"
    );
    (stream, buffer)
}

/// The next frame, or `None` when the node closed the link.
async fn next_frame(stream: &mut TcpStream, buffer: &mut BytesMut) -> Option<Frame> {
    loop {
        if let Some(frame) = link::decode(buffer).expect("well-formed frames") {
            return Some(frame);
        }
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_buf(buffer))
            .await
            .expect("the node answers within 10 s")
            .expect("read");
        if read == 0 {
            return None;
        }
    }
}

fn text_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("text/plain"));
    headers
}

#[tokio::test]
async fn requests_written_at_once_are_each_answered_as_over_http() {
    let node = start_in_process(|_| {}).await;
    node.client.create_streams("demo", 1, "text/plain").await;
    let (mut stream, mut buffer) = open(node.client_addr).await;

    let mut out = BytesMut::new();
    let appends: u64 = 20;
    for id in 1..=appends {
        let body = format!("m{id};");
        link::encode_request(
            &mut out,
            id,
            &Method::POST,
            "/demo/s0",
            &text_headers(),
            body.as_bytes(),
        )
        .expect("encode");
    }
    let missing = appends + 1;
    let sse = appends + 2;
    let bad_offset = appends + 3;
    link::encode_request(
        &mut out,
        missing,
        &Method::POST,
        "/demo/nope",
        &text_headers(),
        b"x",
    )
    .expect("encode");
    link::encode_request(
        &mut out,
        sse,
        &Method::GET,
        "/demo/s0?offset=-1&live=sse",
        &HeaderMap::new(),
        b"",
    )
    .expect("encode");
    link::encode_request(
        &mut out,
        bad_offset,
        &Method::GET,
        "/demo/s0?offset=zzz",
        &HeaderMap::new(),
        b"",
    )
    .expect("encode");
    // One write: the node reads them together and answers each by its ID.
    stream.write_all(&out).await.expect("write");

    let mut answers = HashMap::new();
    while answers.len() < (appends + 3) as usize {
        match next_frame(&mut stream, &mut buffer).await {
            Some(Frame::Answer(answer)) => {
                assert!(
                    answers.insert(answer.id, answer).is_none(),
                    "one answer per request"
                );
            }
            other => panic!("expected an answer, got {other:?}"),
        }
    }
    let mut offsets = Vec::new();
    for id in 1..=appends {
        let answer = &answers[&id];
        assert_eq!(answer.status, StatusCode::NO_CONTENT, "append {id}");
        let offset = answer.headers["stream-next-offset"]
            .to_str()
            .expect("ascii");
        offsets.push(offset.to_owned());
    }
    // Each append got its own answer: 20 different tails, the last one the stream's.
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(offsets.len(), appends as usize, "{offsets:?}");
    let head = node.client.send(Method::HEAD, "/demo/s0", &[], "").await;
    assert_eq!(
        head.header("stream-next-offset"),
        offsets.last().map(String::as_str)
    );
    let refused = |id: u64| -> serde_json::Value {
        serde_json::from_slice(&answers[&id].body).expect("a JSON error body")
    };
    assert_eq!(answers[&missing].status, StatusCode::NOT_FOUND);
    assert_eq!(refused(missing)["error"], "StreamNotFound");
    assert_eq!(answers[&sse].status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(refused(sse)["error"], "MethodNotAllowed");
    assert_eq!(answers[&bad_offset].status, StatusCode::BAD_REQUEST);
    assert_eq!(refused(bad_offset)["error"], "InvalidOffset");

    // Everything acknowledged on the link is in the stream, read over HTTP.
    let (bytes, _) = node.client.read_all("/demo/s0").await;
    let text = String::from_utf8(bytes).expect("utf-8");
    let mut read: Vec<&str> = text.split_terminator(';').collect();
    read.sort_unstable();
    let mut sent: Vec<String> = (1..=appends).map(|id| format!("m{id}")).collect();
    sent.sort_unstable();
    assert_eq!(read, sent);
}

#[tokio::test]
async fn a_stopping_node_answers_what_it_read_and_says_so() {
    let node = start_in_process(|config| {
        config.server.long_poll_timeout = Duration::from_secs(30);
    })
    .await;
    assert_eq!(
        node.client.put("/demo", &[], "").await.status,
        StatusCode::CREATED
    );
    let created = node.client.put("/demo/s", &[TEXT], "a").await;
    let tail = created
        .header("stream-next-offset")
        .expect("offset")
        .to_owned();
    let (mut stream, mut buffer) = open(node.client_addr).await;

    // A long-poll at the tail waits; the stop must end it with an answer.
    let mut out = BytesMut::new();
    let target = format!("/demo/s?offset={tail}&live=long-poll");
    link::encode_request(&mut out, 1, &Method::GET, &target, &HeaderMap::new(), b"")
        .expect("encode");
    stream.write_all(&out).await.expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;

    let stopping = tokio::spawn(node.node.shutdown());
    let mut go_away = None;
    let mut answered = None;
    // `next_frame` fails the test on a reset: the node must close in order, so that nothing
    // it wrote is discarded.
    while let Some(frame) = next_frame(&mut stream, &mut buffer).await {
        match frame {
            Frame::GoAway { last } => {
                go_away = Some(last);
                // A request sent after the go-away, as a gateway may have: never answered.
                let mut late = BytesMut::new();
                link::encode_request(
                    &mut late,
                    2,
                    &Method::POST,
                    "/demo/s",
                    &text_headers(),
                    b"late",
                )
                .expect("encode");
                stream.write_all(&late).await.expect("write");
                stream.shutdown().await.expect("shutdown our side");
            }
            Frame::Answer(answer) => {
                assert!(answered.is_none(), "one answer only: {answer:?}");
                answered = Some(answer);
            }
            Frame::Request(_) => panic!("a node never sends requests"),
        }
    }
    stopping.await.expect("shutdown");
    assert_eq!(go_away, Some(1), "the node read request 1 and no later one");
    let answer = answered.expect("the long-poll is answered before the link closes");
    assert_eq!(answer.id, 1);
    assert!(
        answer.status == StatusCode::NO_CONTENT || answer.status.is_server_error(),
        "a long-poll ended by the stop: {}",
        answer.status
    );
}

#[tokio::test]
async fn a_stream_that_breaks_the_framing_is_closed() {
    let node = start_in_process(|_| {}).await;
    let (mut stream, mut buffer) = open(node.client_addr).await;
    // A length over the limit: not a link.
    stream
        .write_all(&[0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0, 0, 0, 0, 1])
        .await
        .expect("write");
    assert!(next_frame(&mut stream, &mut buffer).await.is_none());
    // The node still serves HTTP.
    assert_eq!(
        node.client.put("/demo", &[], "").await.status,
        StatusCode::CREATED
    );
}
