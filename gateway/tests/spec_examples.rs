//! The API overview (`shared/spec/ursula-api-overview.txt`), run end to end as a user of the
//! product meets it: the gateway in front of a real 3-voter cluster. Its curl examples, its
//! route tables (implicit buckets, fencing by purge, stream, bootstrap and snapshot routes) and
//! the refusal rows that a cluster's settings can bring about: each status, header and token it
//! names is asserted, and every answer carries the gateway's vouch.
//!
//! `WalDiskPressure`, `RaftLogPressure` and `ColdBackpressure` need a full disk, a log past
//! its budget and object storage; the node's own tests cause those (`node/tests/admission.rs`,
//! `node/tests/cold_tier.rs`). `NotLeader` and `GroupNotHosted` redirects never reach a
//! gateway's client: the gateway follows them (`redirect_rule.rs`, `over_cluster.rs`).

mod support;

use http::StatusCode;
use support::{Subscriber, gateway};
use ursula_testkit::cluster::TestCluster;
use ursula_testkit::{Http, Reply};

/// Voters whose limits make the refusal rows reachable with small bodies: bodies up to 1 MiB
/// (413 past it), 900 KiB of bodies in flight per node, 600 KiB proposed and not applied per
/// group.
const SERVER: &str = "max_append_size = 1048576\nhttp_inflight_body_size = 921600";
const RAFT: &str = "max_uncommitted_size_per_group = 614400";

fn error_token(reply: &Reply) -> String {
    let body: serde_json::Value = serde_json::from_slice(&reply.body)
        .unwrap_or_else(|_| panic!("not a JSON error: {:?}", reply.body));
    assert!(body["message"].is_string(), "a message: {body}");
    body["error"].as_str().expect("an error token").to_owned()
}

/// A refusal as the spec's tables describe it: status, token, the marker (`None`: no marker)
/// and, through the gateway, the vouch; `Retry-After: 1` on every 503.
fn assert_refusal(reply: &Reply, status: StatusCode, token: &str, marker: Option<&str>) {
    assert_eq!(reply.status, status, "{token}: {:?}", reply.body);
    assert_eq!(error_token(reply), token);
    assert_eq!(reply.header("x-ursula-not-applied"), marker, "{token}");
    assert_eq!(reply.header("x-ursula-not-applied-checked"), Some("1"));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        assert_eq!(reply.header("retry-after"), Some("1"), "{token}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_overview_end_to_end_through_the_gateway_in_front_of_three_voters() {
    let voters = TestCluster::start_with(3, SERVER, RAFT);
    let http = Http::new();
    voters.wait_ready().await;
    let addr = gateway(voters.upstreams(), |_| {}).await;
    let url = |path: &str| format!("http://{addr}{path}");
    let send = async |method: &str, path: &str, headers: &[(&str, &str)], body: &str| {
        let reply = http
            .request(method, &url(path), headers, body)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert_eq!(
            reply.header("x-ursula-not-applied-checked"),
            Some("1"),
            "{method} {path}: every answer carries the vouch"
        );
        reply
    };
    let octets = [("content-type", "application/octet-stream")];

    // "Create a bucket and stream", "Append data", "Read from the beginning", "Subscribe
    // with SSE": the curl examples, as written.
    assert_eq!(
        send("PUT", "/demo", &[], "").await.status,
        StatusCode::CREATED
    );
    let created = send("PUT", "/demo/hello", &[], "").await;
    assert_eq!(created.status, StatusCode::CREATED);
    let appended = send("POST", "/demo/hello", &octets, "hello world").await;
    assert_eq!(appended.status, StatusCode::NO_CONTENT);
    let tail = appended
        .header("stream-next-offset")
        .expect("Stream-Next-Offset")
        .to_owned();
    let read = send("GET", "/demo/hello?offset=-1", &[], "").await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.body.as_ref(), b"hello world");
    assert_eq!(read.header("stream-next-offset"), Some(tail.as_str()));
    assert_eq!(read.header("stream-up-to-date"), Some("true"));
    let (mut sse, sse_headers) =
        Subscriber::open_with(&url("/demo/hello?offset=-1&live=sse"), &[]).await;
    // The stream was created without a content type: application/octet-stream, whose SSE
    // data events are base64.
    assert_eq!(
        sse_headers
            .get("stream-sse-data-encoding")
            .and_then(|v| v.to_str().ok()),
        Some("base64")
    );
    let seen = sse.until(&tail).await;
    assert_eq!(
        seen.data, "aGVsbG8gd29ybGQ=",
        "SSE delivers hello world from the start"
    );

    // Bucket operations: `PUT /{bucket}` validates the ID; buckets are implicit.
    assert_eq!(send("PUT", "/demo", &[], "").await.status, StatusCode::OK);
    let bad = send("PUT", "/Not_A_Bucket", &[], "").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_token(&bad), "InvalidBucketId");
    let implicit = send("PUT", "/implicit/s", &octets, "").await;
    assert_eq!(implicit.status, StatusCode::CREATED, "no bucket PUT first");

    // Stream operations: HEAD, DELETE.
    let head = send("HEAD", "/demo/hello", &[], "").await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.header("stream-next-offset"), Some(tail.as_str()));

    // Bootstrap and snapshots: publish at the tail, read it, bootstrap from it.
    let snapshot = format!("/demo/hello/snapshot/{tail}");
    let published = send("PUT", &snapshot, &octets, "state at the tail").await;
    assert_eq!(published.status, StatusCode::CREATED);
    assert_eq!(
        send("PUT", &snapshot, &octets, "state at the tail")
            .await
            .status,
        StatusCode::OK,
        "repeating a snapshot publish with the same body is harmless"
    );
    let stored = send("GET", &snapshot, &[], "").await;
    assert_eq!(stored.status, StatusCode::OK);
    assert_eq!(stored.body.as_ref(), b"state at the tail");
    let bootstrap = send("GET", "/demo/hello/bootstrap", &[], "").await;
    assert_eq!(bootstrap.status, StatusCode::OK);
    assert!(
        bootstrap
            .header("content-type")
            .is_some_and(|kind| kind.starts_with("multipart/mixed")),
        "snapshot + tail replay in one multipart answer"
    );
    assert_eq!(
        bootstrap.header("stream-snapshot-offset"),
        Some(tail.as_str())
    );
    assert!(String::from_utf8_lossy(&bootstrap.body).contains("state at the tail"));

    // Refusals of write admission, marked with their token.
    let too_large = send("POST", "/demo/hello", &octets, &"x".repeat(1_048_577)).await;
    assert_refusal(
        &too_large,
        StatusCode::PAYLOAD_TOO_LARGE,
        "RequestBodyTooLarge",
        Some("RequestBodyTooLarge"),
    );
    let no_room = send("POST", "/demo/hello", &octets, &"x".repeat(950 * 1024)).await;
    assert_refusal(
        &no_room,
        StatusCode::SERVICE_UNAVAILABLE,
        "IngressBodyBytesLimitReached",
        Some("IngressBodyBytesLimitReached"),
    );
    // After admission, before the proposal: more than the group may have proposed.
    let backpressure = send("POST", "/demo/hello", &octets, &"x".repeat(700 * 1024)).await;
    assert_refusal(
        &backpressure,
        StatusCode::SERVICE_UNAVAILABLE,
        "RaftUncommittedBackpressure",
        Some("RaftUncommittedBackpressure"),
    );
    // None of them applied anything.
    let head = send("HEAD", "/demo/hello", &[], "").await;
    assert_eq!(head.header("stream-next-offset"), Some(tail.as_str()));

    // "The server never answers 401 or 402, and answers 429 only to a new producer on a
    // stream that has no room for one": that path is the node's (`http_refusals.rs`).

    // Deleting a stream.
    assert_eq!(
        send("DELETE", "/implicit/s", &[], "").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        send("GET", "/implicit/s?offset=-1", &[], "").await.status,
        StatusCode::NOT_FOUND
    );

    // Removing a bucket is an operator action (bucket purge) that fences the bucket ID for
    // good: later stream creates in it answer 404, and so does the bucket itself.
    let purge = http
        .request(
            "POST",
            &format!(
                "http://127.0.0.1:{}/admin/buckets/demo/purge",
                voters.voters[0].admin_port
            ),
            &[],
            "",
        )
        .await
        .expect("the purge is answered");
    assert!(purge.status.is_success(), "purge: {}", purge.status);
    for (method, path) in [
        ("PUT", "/demo/again"),
        ("PUT", "/demo"),
        ("GET", "/demo/hello"),
    ] {
        let fenced = send(method, path, &octets, "").await;
        assert_eq!(fenced.status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(error_token(&fenced), "BucketNotFound", "{method} {path}");
    }
}
