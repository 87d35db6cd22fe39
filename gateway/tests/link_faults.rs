//! The gateway's end of the link against a scripted node that speaks it: a **fake** node (a
//! raw TCP server in this process), because these faults must come at exact moments a real
//! node's SIGTERM cannot place, a go-away while a second request sits unread and a link dropped
//! after a request was read. A go-away sends the requests the node did not read over HTTP,
//! once each; a link that breaks before answering costs a 503 without the marker, never a
//! resend.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, StatusCode};
use support::start_gateway;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use ursula_testkit::Http;
use ursula_wire::link::{self, Frame};

/// What the scripted node does on a link.
#[derive(Clone, Copy)]
enum Script {
    /// Answers each request, except that it holds the first of `a` and `b` to arrive until
    /// the other has arrived too; then it answers the held one and sends a go-away naming it,
    /// leaving the other unread. (The gateway may put them on the link in either order.)
    GoAwayBetweenAAndB,
    /// Closes the link on the first request, unanswered.
    CloseUnanswered,
}

#[derive(Default)]
struct Seen {
    /// Bodies of requests answered over the link, and over HTTP.
    answered_on_link: Vec<Bytes>,
    on_http: Vec<Bytes>,
}

async fn scripted_node(script: Script) -> (String, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(connection(stream, script, log.clone()));
        }
    });
    (url, seen)
}

/// HTTP/1.1 requests, one after the other, until one asks for the link.
async fn connection(mut stream: TcpStream, script: Script, seen: Arc<Mutex<Seen>>) {
    let mut buffer = BytesMut::new();
    loop {
        let end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            if stream.read_buf(&mut buffer).await.unwrap_or(0) == 0 {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buffer.split_to(end)).to_ascii_lowercase();
        if head.contains("upgrade: ursula-link/1") {
            let switched = "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: ursula-link/1\r\n\r\n";
            stream.write_all(switched.as_bytes()).await.expect("write");
            return speak_link(stream, buffer, script, seen).await;
        }
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < length {
            if stream.read_buf(&mut buffer).await.unwrap_or(0) == 0 {
                return;
            }
        }
        seen.lock()
            .unwrap()
            .on_http
            .push(buffer.split_to(length).freeze());
        let answer = "HTTP/1.1 204 No Content\r\nx-via: http\r\ncontent-length: 0\r\n\r\n";
        stream.write_all(answer.as_bytes()).await.expect("write");
    }
}

async fn speak_link(
    mut stream: TcpStream,
    mut buffer: BytesMut,
    script: Script,
    seen: Arc<Mutex<Seen>>,
) {
    let mut held: Option<link::Request> = None;
    loop {
        while let Some(frame) = link::decode(&mut buffer).expect("frames") {
            let Frame::Request(request) = frame else {
                panic!("a gateway sends requests only");
            };
            if let Script::CloseUnanswered = script {
                return; // Dropped: the link breaks with the request unanswered.
            }
            let is_pair = |body: &Bytes| body == "a" || body == "b";
            if held.is_none() && is_pair(&request.body) {
                held = Some(request);
                continue;
            }
            let (answered, go_away) = match held.take() {
                Some(first) if is_pair(&request.body) => (first, true),
                other => {
                    held = other;
                    (request, false)
                }
            };
            seen.lock()
                .unwrap()
                .answered_on_link
                .push(answered.body.clone());
            let mut headers = HeaderMap::new();
            headers.insert("x-via", HeaderValue::from_static("link"));
            let mut out = BytesMut::new();
            link::encode_answer(&mut out, answered.id, StatusCode::NO_CONTENT, &headers, b"")
                .expect("encode");
            if go_away {
                link::encode_go_away(&mut out, answered.id);
            }
            stream.write_all(&out).await.expect("write");
            if go_away {
                // Read and drop the rest until the gateway ends its side, then close in order.
                while stream.read_buf(&mut buffer).await.unwrap_or(0) > 0 {
                    buffer.clear();
                }
                return;
            }
        }
        if stream.read_buf(&mut buffer).await.unwrap_or(0) == 0 {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_after_a_go_away_go_over_http_once_each() {
    let (url, seen) = scripted_node(Script::GoAwayBetweenAAndB).await;
    let gateway = start_gateway(vec![url], |_| {}).await;
    let http = Http::new();
    let send = |body: &'static str| {
        let http = http.clone();
        let url = format!("http://{}/demo/s", gateway.addr);
        async move {
            http.request("POST", &url, &[("content-type", "text/plain")], body)
                .await
                .expect("the gateway answers")
        }
    };
    // The link is open once a first request has been answered on it.
    assert_eq!(send("w").await.header("x-via"), Some("link"));
    // The first of `a` and `b` on the link is held until the other is there too; then the
    // node answers it and goes away, leaving the other unread.
    let (a, b) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(send("a"), send("b"))
    })
    .await
    .expect("both answered");
    let mut vias = [a.header("x-via"), b.header("x-via")];
    vias.sort();
    assert_eq!(vias, [Some("http"), Some("link")], "one resent over HTTP");
    for reply in [&a, &b] {
        assert_eq!(reply.status, StatusCode::NO_CONTENT);
        assert_eq!(reply.header("x-ursula-not-applied-checked"), Some("1"));
    }
    let (on_link, on_http) = if a.header("x-via") == Some("link") {
        ("a", "b")
    } else {
        ("b", "a")
    };
    // The next request opens a new link.
    let later = tokio::time::timeout(Duration::from_secs(10), send("c"))
        .await
        .expect("answered");
    assert_eq!(later.header("x-via"), Some("link"));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.answered_on_link, ["w", on_link, "c"]);
    assert_eq!(seen.on_http, [on_http], "each request handled once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_breaks_before_answering_costs_an_unmarked_503_and_no_resend() {
    let (url, seen) = scripted_node(Script::CloseUnanswered).await;
    let gateway = start_gateway(vec![url], |_| {}).await;
    let reply = Http::new()
        .request(
            "POST",
            &format!("http://{}/demo/s", gateway.addr),
            &[("content-type", "text/plain")],
            "maybe-applied",
        )
        .await
        .expect("the gateway answers");
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = serde_json::from_slice(&reply.body).expect("JSON error body");
    assert_eq!(body["error"], "Unavailable");
    assert_eq!(
        reply.header("x-ursula-not-applied"),
        None,
        "the node read it and may have applied it"
    );
    assert_eq!(reply.header("x-ursula-not-applied-checked"), Some("1"));
    assert!(
        seen.lock().unwrap().on_http.is_empty(),
        "not resent over HTTP"
    );
}
