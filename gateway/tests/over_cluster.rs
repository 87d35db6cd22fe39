//! The gateway in front of a real 3-voter cluster: `ursula-node` processes on loopback (the
//! binary built next to this crate's, by the workspace build), the gateway in this process.
//! Writes reach each stream's leader whichever voter the gateway tries first; a leader killed
//! under load costs clients nothing but retryable 503s, and SSE subscribers sharing one
//! subscription on it reconnect and read every byte once; every answer carries the vouch; the
//! gateway link answers every request as HTTP does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use support::{Seen, Subscriber, gateway, start_gateway};
use ursula_testkit::Http;
use ursula_testkit::cluster::TestCluster;
use ursula_testkit::group_of;

mod support;

const TEXT: (&str, &str) = ("content-type", "text/plain");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reach_each_leader_through_the_gateway_with_the_vouch() {
    let voters = TestCluster::start(3, "");
    let http = Http::new();
    voters.wait_ready().await;
    let addr = gateway(voters.upstreams(), |_| {}).await;
    let base = format!("http://{addr}");
    // Buckets in every group, so that some leaders are not the first upstream.
    for b in 0..8 {
        let bucket = format!("gw-{b}");
        for (method, path, headers, body, expected) in [
            ("PUT", format!("/{bucket}"), vec![], "", StatusCode::CREATED),
            (
                "PUT",
                format!("/{bucket}/s"),
                vec![TEXT],
                "",
                StatusCode::CREATED,
            ),
            (
                "POST",
                format!("/{bucket}/s"),
                vec![TEXT],
                "one;",
                StatusCode::NO_CONTENT,
            ),
            (
                "POST",
                format!("/{bucket}/s"),
                vec![TEXT],
                "two;",
                StatusCode::NO_CONTENT,
            ),
        ] {
            let reply = http
                .request(method, &format!("{base}{path}"), &headers, body)
                .await
                .expect("the gateway answers");
            assert_eq!(reply.status, expected, "{method} {path}");
            assert_eq!(reply.header("x-ursula-not-applied-checked"), Some("1"));
            assert_ne!(
                reply.status,
                StatusCode::TEMPORARY_REDIRECT,
                "clients never see one"
            );
            if let Some(location) = reply.header("location") {
                assert!(
                    location.starts_with(&base),
                    "a node's address leaked: {location} (gateway {base})"
                );
            }
        }
        let read = http
            .request("GET", &format!("{base}/{bucket}/s?offset=-1"), &[], "")
            .await
            .expect("read");
        assert_eq!(read.status, StatusCode::OK);
        assert_eq!(read.body, "one;two;");
        // The leader applied it, and so did every voter.
        let leader = voters
            .leader_of(group_of(&bucket, 4))
            .await
            .expect("a leader");
        let on_leader = http
            .request(
                "GET",
                &format!(
                    "http://127.0.0.1:{}/{bucket}/s?offset=-1",
                    voters.voters[leader].client_port
                ),
                &[],
                "",
            )
            .await
            .expect("leader read");
        assert_eq!(on_leader.body, "one;two;");
    }
}

/// An SSE client as the Durable Streams client is one: it follows the stream from `now`, and
/// whenever its response ends or fails it reconnects from the last `streamNextOffset` it was
/// given. It stops at `last`, once that is known. Answers where it started, what it read, and
/// how often it reconnected. Where it started is the first control event's offset, which
/// follows the first data event when records arrived before the subscription's first control
/// event (the protocol's `offset=now`): `before_start` counts what it read before it.
async fn follow(url: String, last: tokio::sync::watch::Receiver<Option<String>>) -> Follower {
    let mut seen = Seen::default();
    let mut start = None;
    let mut at: Option<String> = None;
    let mut reconnects = 0;
    let mut before_start = 0;
    loop {
        let query = match &at {
            Some(offset) => format!("offset={offset}&live=sse"),
            None => "offset=now&live=sse".to_owned(),
        };
        let Ok((mut subscriber, _)) = Subscriber::try_open(&format!("{url}?{query}"), &[]).await
        else {
            // An election, or the gateway's subscription on its way: retry, as a client does.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        loop {
            if last.borrow().is_some() && *last.borrow() == at {
                return Follower {
                    start,
                    data: seen.data,
                    before_start,
                    reconnects,
                };
            }
            match subscriber.try_event(Duration::from_millis(100)).await {
                Ok(Some(event)) => {
                    if let Some(offset) = seen.read(&event) {
                        if start.is_none() {
                            before_start = seen.data.len();
                            start = Some(offset.clone());
                        }
                        at = Some(offset);
                    }
                }
                Err(timeout) if timeout == "timeout" => {}
                Ok(None) | Err(_) => break,
            }
        }
        reconnects += 1;
    }
}

struct Follower {
    start: Option<String>,
    data: String,
    /// Bytes of `data` read before the first control event.
    before_start: usize,
    reconnects: u32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_under_load_costs_only_retryable_503s() {
    let voters = Arc::new(TestCluster::start(3, ""));
    let http = Http::new();
    voters.wait_ready().await;
    let addr = gateway(voters.upstreams(), |_| {}).await;
    let base = format!("http://{addr}");
    let bucket = "gw-load";
    for (path, headers) in [
        (format!("/{bucket}"), vec![]),
        (format!("/{bucket}/s"), vec![TEXT]),
    ] {
        let reply = http
            .request("PUT", &format!("{base}{path}"), &headers, "")
            .await
            .expect("create");
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..6)
        .map(|w| {
            let http = http.clone();
            let stop = stop.clone();
            let url = format!("{base}/{bucket}/s");
            tokio::spawn(async move {
                let mut seq = 0u64;
                let mut unavailable = 0u64;
                // After a 503 the append's fate is unknown (an unmarked one may have committed):
                // a client retries it with the same sequence number until it is answered, even
                // when told to stop, so that what it counts as acknowledged is exact.
                let mut in_doubt = false;
                // Whether an earlier attempt of this seq got an answer that does not rule out
                // that it applied (an unmarked 503). If not, a retry answered "duplicate" (204)
                // would mean a marked refusal applied after all.
                let mut maybe_applied = false;
                while !stop.load(Ordering::Relaxed) || in_doubt {
                    let seq_text = seq.to_string();
                    let producer = format!("w{w}");
                    let headers = [
                        TEXT,
                        ("producer-id", producer.as_str()),
                        ("producer-epoch", "0"),
                        ("producer-seq", seq_text.as_str()),
                    ];
                    let reply = http
                        .request("POST", &url, &headers, &format!("w{w}:{seq}\n"))
                        .await
                        .expect("the gateway itself never fails a request");
                    assert_eq!(reply.header("x-ursula-not-applied-checked"), Some("1"));
                    match reply.status {
                        StatusCode::OK | StatusCode::NO_CONTENT => {
                            assert!(
                                reply.status == StatusCode::OK || maybe_applied,
                                "writer {w} seq {seq}: a duplicate after only marked refusals"
                            );
                            seq += 1;
                            in_doubt = false;
                            maybe_applied = false;
                        }
                        StatusCode::SERVICE_UNAVAILABLE => {
                            assert_eq!(reply.header("retry-after"), Some("1"));
                            unavailable += 1;
                            in_doubt = true;
                            maybe_applied |= reply.header("x-ursula-not-applied").is_none();
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        other => panic!(
                            "writer {w}: {other} {}",
                            String::from_utf8_lossy(&reply.body)
                        ),
                    }
                }
                (w, seq, unavailable)
            })
        })
        .collect();
    // Subscribers through the gateway, sharing one subscription to the stream's leader (the
    // upstream the gateway has seen answer its writes): the kill cuts it under them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (last_tx, last_rx) = tokio::sync::watch::channel(None);
    let followers: Vec<_> = (0..3)
        .map(|_| tokio::spawn(follow(format!("{base}/{bucket}/s"), last_rx.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let leader = voters
        .leader_of(group_of(bucket, 4))
        .await
        .expect("a leader");
    let killer = voters.clone();
    tokio::task::spawn_blocking(move || killer.kill(leader))
        .await
        .expect("kill");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    for writer in writers {
        acked.push(writer.await.expect("writer"));
    }
    // Every acknowledged append is there once, in order (reads too may meet an election).
    let deadline = Instant::now() + Duration::from_secs(10);
    let read = loop {
        let read = http
            .request("GET", &format!("{base}/{bucket}/s?offset=-1"), &[], "")
            .await
            .expect("read");
        if read.status != StatusCode::SERVICE_UNAVAILABLE || Instant::now() > deadline {
            break read;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(read.status, StatusCode::OK);
    let text = String::from_utf8_lossy(&read.body).into_owned();
    for (w, count, _) in &acked {
        let seqs: Vec<u64> = text
            .lines()
            .filter_map(|line| line.strip_prefix(&format!("w{w}:")))
            .map(|seq| seq.parse().expect("seq"))
            .collect();
        assert_eq!(seqs, (0..*count).collect::<Vec<_>>(), "writer {w}");
    }
    let total: u64 = acked.iter().map(|(_, count, _)| count).sum();
    assert!(total > 20, "too little load: {acked:?}");

    // Each subscriber read exactly what the stream holds from where it started: nothing lost
    // or read twice across the kill, however its subscription was served.
    let tail = read
        .header("stream-next-offset")
        .expect("the read's next offset")
        .to_owned();
    last_tx.send_replace(Some(tail));
    let mut reconnects = 0;
    for follower in followers {
        let follower = tokio::time::timeout(Duration::from_secs(20), follower)
            .await
            .expect("every subscriber reaches the tail")
            .expect("subscriber");
        let start = follower
            .start
            .expect("the subscriber was told where it started");
        let from_start = http
            .request("GET", &format!("{base}/{bucket}/s?offset={start}"), &[], "")
            .await
            .expect("read");
        assert_eq!(from_start.status, StatusCode::OK);
        let expected: String = String::from_utf8_lossy(&from_start.body).lines().collect();
        assert_eq!(follower.data[follower.before_start..], expected);
        // What came before the first control event is the stream's, right before `start`.
        let whole: String = text.lines().collect();
        assert!(
            whole.ends_with(&follower.data),
            "the subscriber's data is not the stream's last {} bytes",
            follower.data.len()
        );
        assert!(follower.data.starts_with('w'), "it starts at a record");
        assert!(follower.data.len() > 20, "the subscriber saw the load");
        reconnects += follower.reconnects;
    }
    assert!(reconnects > 0, "the kill cut the subscribers' subscription");
    voters.restart(leader);
}

/// Everything a client sees of an answer but its date, with the stream's name written `{s}`
/// and the gateway's address `{gateway}`.
fn seen_by_client(
    reply: &ursula_testkit::Reply,
    stream: &str,
    gateway: &str,
) -> (u16, Vec<(String, String)>, String) {
    let normalized = |text: &str| text.replace(stream, "{s}").replace(gateway, "{gateway}");
    let mut headers: Vec<(String, String)> = reply
        .headers
        .iter()
        .filter(|(name, _)| *name != "date")
        .map(|(name, value)| {
            let mut value = normalized(&String::from_utf8_lossy(value.as_bytes()));
            // An ETag starts with the stream's incarnation, which differs between two streams.
            if name == "etag"
                && let Some((_, rest)) = value.split_once(':')
            {
                value = rest.to_owned();
            }
            (name.as_str().to_owned(), value)
        })
        .collect();
    headers.sort();
    let body = normalized(&String::from_utf8_lossy(&reply.body));
    (reply.status.as_u16(), headers, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_link_answers_every_request_as_http_does() {
    let voters = TestCluster::start(3, "");
    let http = Http::new();
    voters.wait_ready().await;
    let on_link = start_gateway(voters.upstreams(), |_| {}).await;
    let on_http = start_gateway(voters.upstreams(), |config| config.upstream_link = false).await;
    let bucket = "gw-link";
    let created = http
        .request("PUT", &format!("http://{}/{bucket}", on_link.addr), &[], "")
        .await
        .expect("bucket");
    assert_eq!(created.status, StatusCode::CREATED);
    let producer = |seq: &'static str| {
        vec![
            TEXT,
            ("producer-id", "p1"),
            ("producer-epoch", "0"),
            ("producer-seq", seq),
        ]
    };
    let json = ("content-type", "application/json");
    // Method, what follows the stream's name, headers, body.
    type Sent<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, &'a str);
    let requests: Vec<Sent> = vec![
        ("PUT", "", vec![TEXT], "a;"),
        ("PUT", "", vec![TEXT], "a;"),
        ("PUT", "", vec![json], "[]"),
        ("POST", "", vec![TEXT], "b;"),
        (
            "POST",
            "",
            vec![TEXT, ("transfer-encoding", "chunked")],
            "b2;",
        ),
        ("POST", "", producer("0"), "c;"),
        ("POST", "", producer("0"), "c;"),
        ("POST", "", producer("2"), "d;"),
        ("POST", "", vec![json], "{}"),
        ("POST", "", vec![TEXT], ""),
        ("GET", "?offset=-1", vec![], ""),
        ("GET", "?offset=-1&live=long-poll", vec![], ""),
        ("GET", "?offset=nope", vec![], ""),
        ("HEAD", "", vec![], ""),
        ("OPTIONS", "", vec![("origin", "https://app.example")], ""),
        ("POST", "-missing", vec![TEXT], "x"),
        ("DELETE", "", vec![], ""),
        ("GET", "?offset=-1", vec![], ""),
    ];
    for (method, suffix, headers, body) in &requests {
        let mut seen = Vec::new();
        for (gateway, stream) in [(&on_link, "via-link"), (&on_http, "via-http")] {
            let path = if let Some(query) = suffix.strip_prefix('?') {
                format!("/{bucket}/{stream}?{query}")
            } else {
                format!("/{bucket}/{stream}{suffix}")
            };
            let url = format!("http://{}{path}", gateway.addr);
            let reply = http
                .request(method, &url, headers, body)
                .await
                .expect("the gateway answers");
            seen.push(seen_by_client(&reply, stream, &gateway.addr.to_string()));
        }
        assert_eq!(
            seen[0], seen[1],
            "{method} {suffix} {headers:?}: link, then HTTP"
        );
    }
    let metrics = &on_link.gateway.metrics;
    assert!(
        metrics.link_requests.load(Ordering::Relaxed) >= requests.len() as u64,
        "the link carried the requests"
    );
    assert_eq!(
        on_http
            .gateway
            .metrics
            .link_requests
            .load(Ordering::Relaxed),
        0
    );
}
