//! Every refusal path over real HTTP: the status, the JSON error token, the protocol headers,
//! and that nothing of the refused request is visible afterwards.

mod support;

use http::{Method, StatusCode};
use support::{InProcess, start_in_process};

const TEXT: (&str, &str) = ("content-type", "text/plain");
const OCTETS: (&str, &str) = ("content-type", "application/octet-stream");

async fn node() -> InProcess {
    start_in_process(|config| {
        config.server.max_append_size = 1024;
        config.storage.max_producers_per_stream = 2;
    })
    .await
}

/// Creates bucket `demo` and stream `demo/s` with "hello" in it.
async fn with_stream(node: &InProcess) {
    assert_eq!(
        node.client.put("/demo", &[], "").await.status,
        StatusCode::CREATED
    );
    let created = node.client.put("/demo/s", &[TEXT], "hello").await;
    assert_eq!(created.status, StatusCode::CREATED);
}

async fn contents(node: &InProcess, path: &str) -> String {
    let read = node.client.get(&format!("{path}?offset=-1")).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.text());
    read.text()
}

/// Request headers, the expected status, the expected token.
type RefusalCase<'a> = (&'a [(&'a str, &'a str)], StatusCode, &'a str);

fn assert_refused(reply: &ursula_testkit::Reply, status: StatusCode, token: &str) {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert_eq!(reply.error(), token);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
}

#[tokio::test]
async fn buckets_and_names() {
    let node = node().await;
    assert_eq!(
        node.client.put("/demo", &[], "").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        node.client.put("/demo", &[], "").await.status,
        StatusCode::OK
    );
    for bad in ["/ab", "/Demo", "/-demo", "/demo_x", "/v1"] {
        assert_refused(
            &node.client.put(bad, &[], "").await,
            StatusCode::BAD_REQUEST,
            "InvalidBucketId",
        );
    }
    // Buckets are implicit: a stream create in a bucket never PUT brings it into being.
    let missing_read = node.client.get("/other/s").await;
    assert_refused(&missing_read, StatusCode::NOT_FOUND, "StreamNotFound");
    let missing_append = node.client.post("/other/s", &[TEXT], "x").await;
    assert_refused(&missing_append, StatusCode::NOT_FOUND, "StreamNotFound");
    assert!(
        missing_append.text().contains("other/s"),
        "the error names the stream"
    );
    let implicit = node.client.put("/other/s", &[TEXT], "").await;
    assert_eq!(implicit.status, StatusCode::CREATED, "{}", implicit.text());
    assert_eq!(
        node.client.put("/other", &[], "").await.status,
        StatusCode::OK,
        "the bucket exists once it has a stream"
    );
    for bad in ["/demo/%zz", "/demo/..", "/demo/a%00b"] {
        assert_refused(
            &node.client.put(bad, &[TEXT], "").await,
            StatusCode::BAD_REQUEST,
            "InvalidStreamName",
        );
    }
    assert_refused(
        &node.client.get("/demo/s/nope").await,
        StatusCode::NOT_FOUND,
        "NotFound",
    );
    let wrong = node.client.post("/demo", &[TEXT], "x").await;
    assert_refused(&wrong, StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed");
    assert!(wrong.header("allow").is_some());
}

#[tokio::test]
async fn head_is_answered_only_where_the_api_has_it() {
    let node = node().await;
    with_stream(&node).await;
    // A stream's HEAD: its metadata, and no length of the empty body it sends (a HEAD's
    // length would be the GET's).
    let head = node.client.send(Method::HEAD, "/demo/s", &[], "").await;
    assert_eq!(head.status, StatusCode::OK);
    assert!(head.header("stream-next-offset").is_some());
    assert_eq!(head.header("content-length"), None);
    // Resources with a GET and no HEAD refuse it, and do not read anything for it.
    for path in ["/demo/s/bootstrap", "/demo/s/snapshot/-1"] {
        let refused = node.client.send(Method::HEAD, path, &[], "").await;
        assert_eq!(refused.status, StatusCode::METHOD_NOT_ALLOWED, "{path}");
    }
    // Only a GET upgrades to the gateway link.
    let link = [("connection", "upgrade"), ("upgrade", "ursula-link/1")];
    let head_link = node
        .client
        .send(Method::HEAD, "/_ursula/link", &link, "")
        .await;
    assert_eq!(head_link.status, StatusCode::BAD_REQUEST);
    for path in ["/healthz", "/readyz", "/metrics", "/admin/replica/demo/s"] {
        let refused = node.admin.send(Method::HEAD, path, &[], "").await;
        assert_eq!(refused.status, StatusCode::METHOD_NOT_ALLOWED, "{path}");
    }
}

#[tokio::test]
async fn admin_routes_are_not_on_the_client_listener() {
    let node = node().await;
    for path in ["/healthz", "/readyz", "/metrics"] {
        // The client listener reads these as bucket paths, which have no GET.
        let on_client = node.client.get(path).await;
        assert_refused(
            &on_client,
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
        );
        assert_eq!(node.admin.get(path).await.status, StatusCode::OK, "{path}");
    }
    let metrics = node.admin.get("/metrics").await.text();
    assert!(metrics.contains("ursula_fsync_seconds_bucket"));
}

#[tokio::test]
async fn create_refusals() {
    let node = node().await;
    with_stream(&node).await;
    let cases: &[RefusalCase] = &[
        (
            &[("stream-ttl", "03600")],
            StatusCode::BAD_REQUEST,
            "InvalidHeader",
        ),
        (
            &[("stream-ttl", "-1")],
            StatusCode::BAD_REQUEST,
            "InvalidHeader",
        ),
        (
            &[("stream-ttl", "1e3")],
            StatusCode::BAD_REQUEST,
            "InvalidHeader",
        ),
        (
            &[("stream-expires-at", "tomorrow")],
            StatusCode::BAD_REQUEST,
            "InvalidHeader",
        ),
        (
            &[
                ("stream-ttl", "60"),
                ("stream-expires-at", "2030-01-01T00:00:00Z"),
            ],
            StatusCode::BAD_REQUEST,
            "InvalidHeader",
        ),
        (
            &[("stream-fork-offset", "0000000000000000_0000000000000000")],
            StatusCode::BAD_REQUEST,
            "InvalidForkRequest",
        ),
        (
            &[("stream-forked-from", "/demo/missing")],
            StatusCode::NOT_FOUND,
            "ForkSourceNotFound",
        ),
        (
            &[
                ("stream-forked-from", "/demo/s"),
                ("stream-fork-offset", "bogus"),
            ],
            StatusCode::BAD_REQUEST,
            "InvalidForkRequest",
        ),
        (
            &[
                ("stream-forked-from", "/demo/s"),
                ("stream-fork-offset", "0000000000000000_0000000000000099"),
            ],
            StatusCode::BAD_REQUEST,
            "InvalidOffset",
        ),
        (
            &[
                ("stream-forked-from", "/demo/s"),
                ("stream-fork-sub-offset", "1"),
            ],
            StatusCode::BAD_REQUEST,
            "InvalidForkRequest",
        ),
    ];
    for (i, (headers, status, token)) in cases.iter().enumerate() {
        let path = format!("/demo/new-{i}");
        let mut all = vec![TEXT];
        all.extend_from_slice(headers);
        assert_refused(&node.client.put(&path, &all, "").await, *status, token);
        assert_refused(
            &node.client.get(&path).await,
            StatusCode::NOT_FOUND,
            "StreamNotFound",
        );
    }
    // An existing stream with another configuration.
    let conflict = node
        .client
        .put("/demo/s", &[("content-type", "application/json")], "")
        .await;
    assert_refused(&conflict, StatusCode::CONFLICT, "StreamConflict");
    let bad_json = node
        .client
        .put("/demo/j", &[("content-type", "application/json")], "{nope")
        .await;
    assert_refused(&bad_json, StatusCode::BAD_REQUEST, "InvalidJson");
    assert_eq!(contents(&node, "/demo/s").await, "hello");
}

#[tokio::test]
async fn only_the_refusals_the_spec_lists_are_marked() {
    let node = node().await;
    with_stream(&node).await;
    // Admission's refusals are marked: a body over the route's limit.
    let big = "x".repeat(2048);
    let too_large = node.client.post("/demo/s", &[TEXT], big).await;
    assert_refused(
        &too_large,
        StatusCode::PAYLOAD_TOO_LARGE,
        "RequestBodyTooLarge",
    );
    assert_eq!(
        too_large.header("x-ursula-not-applied"),
        Some("RequestBodyTooLarge")
    );
    // Refused before anything was proposed, but not in the spec's tables: unmarked.
    let empty = node.client.post("/demo/s", &[TEXT], "").await;
    assert_refused(&empty, StatusCode::BAD_REQUEST, "EmptyBody");
    assert_eq!(empty.header("x-ursula-not-applied"), None);
    let bad_bucket = node.client.put("/Bad", &[], "").await;
    assert_refused(&bad_bucket, StatusCode::BAD_REQUEST, "InvalidBucketId");
    assert_eq!(bad_bucket.header("x-ursula-not-applied"), None);
    // Refused by the state machine: an answer about a proposed write carries no marker.
    let mismatch = node.client.post("/demo/s", &[OCTETS], "x").await;
    assert_refused(&mismatch, StatusCode::CONFLICT, "ContentTypeMismatch");
    assert_eq!(mismatch.header("x-ursula-not-applied"), None);
    let missing = node.client.post("/demo/nope", &[TEXT], "x").await;
    assert_eq!(missing.header("x-ursula-not-applied"), None);
    // Reads are not writes: no marker.
    let bad_read = node.client.get("/demo/s?offset=zzz").await;
    assert_eq!(bad_read.header("x-ursula-not-applied"), None);
    // Nodes never vouch.
    assert_eq!(too_large.header("x-ursula-not-applied-checked"), None);
    assert_eq!(contents(&node, "/demo/s").await, "hello");
}

#[tokio::test]
async fn append_refusals_lose_nothing() {
    let node = node().await;
    with_stream(&node).await;
    assert_refused(
        &node.client.post("/demo/s", &[TEXT], "").await,
        StatusCode::BAD_REQUEST,
        "EmptyBody",
    );
    assert_refused(
        &node.client.post("/demo/s", &[], "x").await,
        StatusCode::BAD_REQUEST,
        "MissingContentType",
    );
    let mismatch = node.client.post("/demo/s", &[OCTETS], "x").await;
    assert_refused(&mismatch, StatusCode::CONFLICT, "ContentTypeMismatch");
    assert_refused(
        &node.client.post("/demo/missing", &[TEXT], "x").await,
        StatusCode::NOT_FOUND,
        "StreamNotFound",
    );
    // Stream-Seq regressions.
    let seq = |s: &'static str| [TEXT, ("stream-seq", s)];
    assert_eq!(
        node.client.post("/demo/s", &seq("b"), "1").await.status,
        StatusCode::NO_CONTENT
    );
    assert_refused(
        &node.client.post("/demo/s", &seq("a"), "2").await,
        StatusCode::CONFLICT,
        "StreamSeqConflict",
    );
    assert_refused(
        &node.client.post("/demo/s", &seq("b"), "2").await,
        StatusCode::CONFLICT,
        "StreamSeqConflict",
    );
    // Bodies over the limit, declared or streamed.
    let big = vec![b'x'; 2048];
    assert_refused(
        &node.client.post("/demo/s", &[TEXT], big).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "RequestBodyTooLarge",
    );
    assert_eq!(contents(&node, "/demo/s").await, "hello1");

    // JSON mode.
    let json = ("content-type", "application/json");
    assert_eq!(
        node.client.put("/demo/j", &[json], "").await.status,
        StatusCode::CREATED
    );
    assert_refused(
        &node.client.post("/demo/j", &[json], "[]").await,
        StatusCode::BAD_REQUEST,
        "InvalidJson",
    );
    assert_refused(
        &node.client.post("/demo/j", &[json], "[1,").await,
        StatusCode::BAD_REQUEST,
        "InvalidJson",
    );
    assert_refused(
        &node.client.post("/demo/j", &[json], vec![0xff, 0xfe]).await,
        StatusCode::BAD_REQUEST,
        "InvalidJson",
    );
    assert_eq!(contents(&node, "/demo/j").await, "[]");

    // Closed: 409 with the final offset, and the body is not appended.
    let close = node
        .client
        .post("/demo/s", &[("stream-closed", "true")], "")
        .await;
    assert_eq!(close.status, StatusCode::NO_CONTENT);
    let closed = node.client.post("/demo/s", &[TEXT], "late").await;
    assert_refused(&closed, StatusCode::CONFLICT, "StreamClosed");
    assert_eq!(closed.header("stream-closed"), Some("true"));
    assert_eq!(
        closed.header("stream-next-offset"),
        close.header("stream-next-offset")
    );
    assert_eq!(contents(&node, "/demo/s").await, "hello1");
}

#[tokio::test]
async fn producer_refusals() {
    let node = node().await;
    with_stream(&node).await;
    let produce = |id: &'static str, epoch: &'static str, seq: &'static str| {
        [
            TEXT,
            ("producer-id", id),
            ("producer-epoch", epoch),
            ("producer-seq", seq),
        ]
    };
    for headers in [
        vec![TEXT, ("producer-id", "p")],
        vec![
            TEXT,
            ("producer-id", ""),
            ("producer-epoch", "0"),
            ("producer-seq", "0"),
        ],
        vec![
            TEXT,
            ("producer-id", "p"),
            ("producer-epoch", "1e3"),
            ("producer-seq", "0"),
        ],
        vec![
            TEXT,
            ("producer-id", "p"),
            ("producer-epoch", "0"),
            ("producer-seq", "-1"),
        ],
        vec![
            TEXT,
            ("producer-id", "p"),
            ("producer-epoch", "0"),
            ("producer-seq", "9007199254740992"),
        ],
    ] {
        assert_refused(
            &node.client.post("/demo/s", &headers, "x").await,
            StatusCode::BAD_REQUEST,
            "InvalidProducer",
        );
    }
    assert_eq!(
        node.client
            .post("/demo/s", &produce("p", "1", "0"), "a")
            .await
            .status,
        StatusCode::OK
    );
    let duplicate = node
        .client
        .post("/demo/s", &produce("p", "1", "0"), "a")
        .await;
    assert_eq!(duplicate.status, StatusCode::NO_CONTENT);
    assert_eq!(duplicate.header("producer-seq"), Some("0"));
    let stale = node
        .client
        .post("/demo/s", &produce("p", "0", "1"), "b")
        .await;
    assert_refused(&stale, StatusCode::FORBIDDEN, "ProducerEpochFenced");
    assert_eq!(stale.header("producer-epoch"), Some("1"));
    let gap = node
        .client
        .post("/demo/s", &produce("p", "1", "5"), "b")
        .await;
    assert_refused(&gap, StatusCode::CONFLICT, "ProducerSeqGap");
    assert_eq!(gap.header("producer-expected-seq"), Some("1"));
    assert_eq!(gap.header("producer-received-seq"), Some("5"));
    let new_epoch = node
        .client
        .post("/demo/s", &produce("p", "2", "3"), "b")
        .await;
    assert_refused(&new_epoch, StatusCode::BAD_REQUEST, "InvalidProducer");
    // The cap is two producers per stream; a third gets 429 and applies nothing.
    assert_eq!(
        node.client
            .post("/demo/s", &produce("q", "0", "0"), "q")
            .await
            .status,
        StatusCode::OK
    );
    let full = node
        .client
        .post("/demo/s", &produce("r", "0", "0"), "r")
        .await;
    assert_refused(&full, StatusCode::TOO_MANY_REQUESTS, "TooManyProducers");
    assert_eq!(contents(&node, "/demo/s").await, "helloaq");
}

#[tokio::test]
async fn read_refusals() {
    let node = node().await;
    with_stream(&node).await;
    for query in [
        "offset=",
        "offset=abc",
        "offset=-2",
        "offset=-1&offset=-1",
        "offset=0000000000000000_0000000000000099",
        "live=long-poll",
        "live=sse",
        "offset=-1&live=forever",
    ] {
        let reply = node.client.get(&format!("/demo/s?{query}")).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{query}: {}",
            reply.text()
        );
        reply.error();
    }
    // Retention: reads below the first retained offset answer 410 naming it.
    let retained = node
        .client
        .put(
            "/demo/s/retention/0000000000000000_0000000000000002",
            &[],
            "",
        )
        .await;
    assert_eq!(retained.status, StatusCode::OK, "{}", retained.text());
    let below = node
        .client
        .get("/demo/s?offset=0000000000000000_0000000000000001")
        .await;
    assert_refused(&below, StatusCode::GONE, "OffsetNotRetained");
    assert_eq!(
        below.header("stream-retained-offset"),
        Some("0000000000000000_0000000000000002")
    );
    assert_eq!(contents(&node, "/demo/s").await, "llo");
    let beyond = node
        .client
        .put(
            "/demo/s/retention/0000000000000000_0000000000000099",
            &[],
            "",
        )
        .await;
    assert_refused(&beyond, StatusCode::BAD_REQUEST, "InvalidOffset");
}

#[tokio::test]
async fn snapshots_and_bootstrap() {
    let node = node().await;
    with_stream(&node).await;
    let at = "/demo/s/snapshot/0000000000000000_0000000000000002";
    let json = ("content-type", "application/json");
    assert_eq!(
        node.client.put(at, &[json], r#"{"n":2}"#).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        node.client.put(at, &[json], r#"{"n":2}"#).await.status,
        StatusCode::OK
    );
    assert_refused(
        &node.client.put(at, &[json], r#"{"n":3}"#).await,
        StatusCode::CONFLICT,
        "SnapshotConflict",
    );
    let read = node.client.get(at).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.text(), r#"{"n":2}"#);
    assert_refused(
        &node
            .client
            .get("/demo/s/snapshot/0000000000000000_0000000000000001")
            .await,
        StatusCode::NOT_FOUND,
        "SnapshotNotFound",
    );
    let bootstrap = node.client.get("/demo/s/bootstrap").await;
    assert_eq!(bootstrap.status, StatusCode::OK);
    assert!(
        bootstrap
            .header("content-type")
            .unwrap()
            .starts_with("multipart/mixed; boundary=")
    );
    assert_eq!(
        bootstrap.header("stream-next-offset"),
        Some("0000000000000000_0000000000000005")
    );
    let body = bootstrap.text();
    assert!(
        body.contains(r#"{"n":2}"#) && body.contains("\r\n\r\nllo\r\n"),
        "{body}"
    );
}

#[tokio::test]
async fn deleted_streams_with_forks_answer_gone() {
    let node = node().await;
    with_stream(&node).await;
    let fork = node
        .client
        .put("/demo/f", &[TEXT, ("stream-forked-from", "/demo/s")], "")
        .await;
    assert_eq!(fork.status, StatusCode::CREATED);
    assert_eq!(
        node.client
            .send(Method::DELETE, "/demo/s", &[], "")
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    assert_refused(
        &node.client.get("/demo/s").await,
        StatusCode::GONE,
        "StreamDeleted",
    );
    assert_refused(
        &node.client.send(Method::DELETE, "/demo/s", &[], "").await,
        StatusCode::GONE,
        "StreamDeleted",
    );
    assert_refused(
        &node.client.put("/demo/s", &[TEXT], "").await,
        StatusCode::CONFLICT,
        "StreamConflict",
    );
    assert_refused(
        &node
            .client
            .put("/demo/g", &[TEXT, ("stream-forked-from", "/demo/s")], "")
            .await,
        StatusCode::CONFLICT,
        "ForkSourceDeleted",
    );
    assert_eq!(contents(&node, "/demo/f").await, "hello");
}

#[tokio::test]
async fn compat_family_and_bucket_family_name_the_same_stream() {
    let node = node().await;
    assert_eq!(
        node.client.put("/v1/stream/a/b", &[TEXT], "x").await.status,
        StatusCode::CREATED
    );
    assert_eq!(contents(&node, "/default/a%2Fb").await, "x");
    // `__ds` is the subscription APIs' root, no stream; their refusals have the protocol's shape.
    let reserved = node.client.put("/v1/stream/__ds", &[TEXT], "").await;
    assert_refused(&reserved, StatusCode::NOT_FOUND, "NotFound");
    let empty = node
        .client
        .put("/v1/stream/__ds/subscriptions/x", &[TEXT], "")
        .await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST, "{}", empty.text());
    let body: serde_json::Value = serde_json::from_slice(&empty.body).expect("JSON");
    assert_eq!(body["error"]["code"], "INVALID_JSON");
}

#[tokio::test]
async fn browsers_get_cors_and_every_answer_gets_the_security_headers() {
    let node = node().await;
    with_stream(&node).await;
    // A preflight is answered on any path, a bad one too, before routing.
    for path in ["/demo/s", "/Bad/path", "/v1/stream/x"] {
        let preflight = node
            .client
            .send(
                Method::OPTIONS,
                path,
                &[("origin", "https://app.example")],
                "",
            )
            .await;
        assert_eq!(preflight.status, StatusCode::NO_CONTENT, "{path}");
        assert_eq!(preflight.header("access-control-allow-origin"), Some("*"));
        let methods = preflight
            .header("access-control-allow-methods")
            .unwrap_or("");
        assert!(
            methods.contains("POST") && methods.contains("DELETE"),
            "{methods}"
        );
        let allowed = preflight
            .header("access-control-allow-headers")
            .unwrap_or("");
        assert!(allowed.contains("producer-id"), "{allowed}");
    }
    // From a browser: CORS headers that expose the protocol's headers.
    let read = node
        .client
        .send(
            Method::GET,
            "/demo/s?offset=-1",
            &[("origin", "https://app.example")],
            "",
        )
        .await;
    assert_eq!(read.header("access-control-allow-origin"), Some("*"));
    let exposed = read.header("access-control-expose-headers").unwrap_or("");
    assert!(exposed.contains("stream-next-offset") && exposed.contains("x-ursula-not-applied"));
    // Not from a browser: none; the security headers on every answer, refusals too.
    let plain = node.client.get("/demo/s?offset=-1").await;
    assert_eq!(plain.header("access-control-allow-origin"), None);
    for reply in [plain, node.client.get("/demo/nope").await] {
        assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(
            reply.header("cross-origin-resource-policy"),
            Some("cross-origin")
        );
    }
}
