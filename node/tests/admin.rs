//! The admin listener: purges through it, never through the client listener; SIGTERM lets
//! requests in flight finish and exits.

mod support;

use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use support::start_in_process;
use ursula_testkit::node::NodeProcess as Process;
use ursula_wire::admin::PurgeResponse;

const TEXT: (&str, &str) = ("content-type", "text/plain");

#[tokio::test]
async fn purge_deletes_every_stream_and_fences_the_bucket() {
    let node = start_in_process(|_| {}).await;
    for bucket in ["gone", "kept"] {
        assert_eq!(
            node.client.put(&format!("/{bucket}"), &[], "").await.status,
            StatusCode::CREATED
        );
        for s in ["a", "b", "c"] {
            let created = node
                .client
                .put(&format!("/{bucket}/{s}"), &[TEXT], "data")
                .await;
            assert_eq!(created.status, StatusCode::CREATED);
        }
    }
    // Never reachable through the client listener.
    let on_client = node.client.post("/admin/buckets/gone/purge", &[], "").await;
    assert_eq!(on_client.status, StatusCode::NOT_FOUND);
    assert_eq!(node.client.get("/gone/a?offset=-1").await.text(), "data");

    let purged = node.admin.post("/admin/buckets/gone/purge", &[], "").await;
    assert_eq!(purged.status, StatusCode::OK, "{}", purged.text());
    let body: PurgeResponse = serde_json::from_slice(&purged.body).expect("purge response");
    assert_eq!(
        body,
        PurgeResponse {
            bucket: "gone".into(),
            purged_streams: 3,
            fenced: true
        }
    );

    for s in ["a", "b", "c"] {
        let path = format!("/gone/{s}");
        assert_eq!(node.client.get(&path).await.status, StatusCode::NOT_FOUND);
        assert_eq!(
            node.client.send(Method::HEAD, &path, &[], "").await.status,
            StatusCode::NOT_FOUND
        );
        let append = node.client.post(&path, &[TEXT], "x").await;
        assert_eq!(append.status, StatusCode::NOT_FOUND);
        assert_eq!(append.error(), "BucketNotFound");
    }
    // Fenced for good: neither streams nor the bucket itself come back.
    let create = node.client.put("/gone/a", &[TEXT], "").await;
    assert_eq!(create.status, StatusCode::NOT_FOUND);
    assert_eq!(
        node.client.put("/gone", &[], "").await.status,
        StatusCode::NOT_FOUND
    );
    // A retry succeeds and purges nothing more; other buckets are untouched.
    let again = node.admin.post("/admin/buckets/gone/purge", &[], "").await;
    let again: PurgeResponse = serde_json::from_slice(&again.body).expect("purge response");
    assert_eq!(again.purged_streams, 0);
    for s in ["a", "b", "c"] {
        assert_eq!(
            node.client
                .get(&format!("/kept/{s}?offset=-1"))
                .await
                .text(),
            "data"
        );
    }
    let invalid = node.admin.post("/admin/buckets/NO/purge", &[], "").await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    assert_eq!(invalid.error(), "InvalidBucketId");
    let wrong_method = node.admin.get("/admin/buckets/kept/purge").await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[test]
fn sigterm_ends_live_reads_and_exits_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut node = Process::start(dir.path(), &["--long-poll-timeout", "30s"]);
    let client = node.client();
    let tail = runtime.block_on(async {
        client.put("/term", &[], "").await;
        let created = client.put("/term/s", &[TEXT], "kept").await;
        assert_eq!(created.status, StatusCode::CREATED);
        created
            .header("stream-next-offset")
            .expect("offset")
            .to_owned()
    });
    let waiting = {
        let client = client.clone();
        let path = format!("/term/s?offset={tail}&live=long-poll");
        runtime.spawn(async move {
            let started = Instant::now();
            let reply = client.try_send(Method::GET, &path, &[], "").await;
            (reply, started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(node.child.id() as libc::pid_t, libc::SIGTERM) };
    let (reply, waited) = runtime.block_on(waiting).expect("long-poll task");
    let reply = reply.expect("the long-poll was answered, not cut");
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    assert!(
        waited < Duration::from_secs(10),
        "the long-poll ended early, after {waited:?}"
    );
    let status = node.child.wait().expect("exit");
    assert!(status.success(), "{status}");

    let node = Process::start(dir.path(), &[]);
    let client = node.client();
    runtime.block_on(async {
        assert_eq!(client.get("/term/s?offset=-1").await.text(), "kept");
    });
}

/// `/metrics` counts what was applied: every answered write is a command, every record
/// written an append, with its bytes; a refused append writes nothing.
#[tokio::test]
async fn metrics_count_commands_appends_and_their_bytes() {
    let node = start_in_process(|_| {}).await;
    let counter = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    let before = node.admin.get("/metrics").await.text();
    assert_eq!(
        node.client.put("/meter", &[], "").await.status,
        StatusCode::CREATED
    );
    let created = node.client.put("/meter/s", &[TEXT], "data").await;
    assert_eq!(created.status, StatusCode::CREATED);
    for body in ["hello", "world!"] {
        let appended = node.client.post("/meter/s", &[TEXT], body).await;
        assert_eq!(appended.status, StatusCode::NO_CONTENT);
    }
    let refused = node.client.post("/meter/missing", &[TEXT], "nope").await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    let after = node.admin.get("/metrics").await.text();

    let grew = |name: &str| counter(&after, name) - counter(&before, name);
    assert_eq!(
        grew("ursula_appends_total"),
        3,
        "create with data and two appends"
    );
    assert_eq!(grew("ursula_appended_bytes_total"), 4 + 5 + 6);
    // Housekeeping's expiry sweeps are commands too, so at least these five.
    let commands = grew("ursula_commands_total");
    assert!(
        commands >= 5,
        "bucket, create, two appends, refused: {commands}"
    );
}

/// With `server.admin_token_file`, a drain, an undrain, a purge or a replica read without the
/// token, or with another one, gets 401 and changes nothing; the probes stay open; a new token
/// written to the file replaces the old one without a restart.
#[tokio::test]
async fn admin_routes_that_change_state_need_the_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, "first-token\n").expect("token file");
    let server = format!("admin_token_file = {token_file:?}");
    let node = Process::start_with(&dir.path().join("data"), &server, &[]);
    let client = node.client();
    let admin = ursula_testkit::Client::new(node.admin_addr);
    assert_eq!(
        client.put("/keep/s", &[TEXT], "data").await.status,
        StatusCode::CREATED
    );

    let bearer = |token: &str| format!("Bearer {token}");
    let routes = [
        (Method::POST, "/admin/drain"),
        (Method::DELETE, "/admin/drain"),
        (Method::POST, "/admin/buckets/keep/purge"),
        (Method::GET, "/admin/replica/keep/s"),
    ];
    for (method, path) in &routes {
        let garbage = [
            None,
            Some(bearer("wrong")),
            Some("first-token".to_owned()),
            Some("Basic Zmlyc3QtdG9rZW4=".to_owned()),
            Some("Bearer".to_owned()),
            Some("Bearer ".to_owned()),
            Some(bearer("first-toke")),
            Some(bearer("first-token2")),
            Some(bearer("first-token first-token")),
            Some(bearer(&"x".repeat(4096))),
        ];
        for authorization in garbage {
            let headers: Vec<(&str, &str)> = authorization
                .iter()
                .map(|a| ("authorization", a.as_str()))
                .collect();
            let refused = admin.send(method.clone(), path, &headers, "").await;
            assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{method} {path}");
            assert_eq!(refused.error(), "Unauthenticated");
            assert_eq!(refused.header("www-authenticate"), Some("Bearer"));
        }
    }
    // Nothing happened: the bucket and its stream are there, and writes are taken.
    assert_eq!(client.get("/keep/s?offset=-1").await.text(), "data");
    assert_eq!(
        client.post("/keep/s", &[TEXT], "+").await.status,
        StatusCode::NO_CONTENT
    );
    // Probes and metrics stay open.
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(admin.get(path).await.status, StatusCode::OK, "{path}");
    }
    // The token lets in; a rotated one replaces it.
    let with_token = async |method: Method, path: &str, token: &str| {
        let authorization = bearer(token);
        admin
            .send(method, path, &[("authorization", &authorization)], "")
            .await
    };
    let replica = with_token(Method::GET, "/admin/replica/keep/s", "first-token").await;
    assert_eq!(replica.status, StatusCode::OK, "{}", replica.text());
    std::fs::write(&token_file, "second-token").expect("rotate");
    let stale = with_token(Method::GET, "/admin/replica/keep/s", "first-token").await;
    assert_eq!(stale.status, StatusCode::UNAUTHORIZED);
    let purged = with_token(Method::POST, "/admin/buckets/keep/purge", "second-token").await;
    assert_eq!(purged.status, StatusCode::OK, "{}", purged.text());
    assert_eq!(
        client.get("/keep/s?offset=-1").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn metrics_can_need_the_token_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, "t0ken").expect("token file");
    let node = start_in_process(|config| {
        config.server.admin_token_file = Some(token_file.clone());
        config.server.metrics_require_token = true;
    })
    .await;
    let refused = node.admin.get("/metrics").await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.error(), "Unauthenticated");
    let metrics = node
        .admin
        .send(
            Method::GET,
            "/metrics",
            &[("authorization", "Bearer t0ken")],
            "",
        )
        .await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert_eq!(node.admin.get("/readyz").await.status, StatusCode::OK);
}
