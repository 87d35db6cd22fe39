//! The cold tier against a real S3-API server (moto, see `ursula_testkit::s3`): older records move to
//! object storage and read back byte for byte, through a restart after SIGKILL and on every
//! voter of a cluster; a group past its hot cap refuses writes with a marked 503
//! `ColdBackpressure` until flushing catches up; the sweep deletes the objects of deleted
//! streams and of records behind retention.

mod support;

use ursula_testkit::runtime;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use support::start_in_process;
use ursula_testkit::Client;
use ursula_testkit::cluster::TestCluster;
use ursula_testkit::node::NodeProcess as Process;
use ursula_testkit::s3::S3Server;

const TEXT: (&str, &str) = ("content-type", "text/plain");
const JSON: (&str, &str) = ("content-type", "application/json");

/// Settings that make a few KiB of records flush within a test: 4 KiB objects, looked for
/// every 50 ms.
const FAST_FLUSH: &str = "segment_size = 4096\nflush_interval = \"50ms\"";

/// Creates a bucket or stream, which must not exist yet.
async fn create(client: &Client, path: &str, headers: &[(&str, &str)]) {
    let reply = client.put(path, headers, "").await;
    assert_eq!(
        reply.status,
        StatusCode::CREATED,
        "{path}: {}",
        reply.text()
    );
}

/// A counter or gauge from the node's `/metrics`.
async fn metric(admin: &Client, line_start: &str) -> u64 {
    let text = admin.get("/metrics").await.text();
    text.lines()
        .find_map(|line| line.strip_prefix(line_start)?.trim().parse().ok())
        .unwrap_or(0)
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Appends `count` text records of different lengths (`pad` bytes and up); returns the
/// stream's bytes.
async fn append_records(client: &Client, path: &str, count: usize, pad: usize) -> Vec<u8> {
    let mut expected = Vec::new();
    for i in 0..count {
        let record = format!("record {i:04} {}\n", "x".repeat(pad + i % 97));
        let reply = client.post(path, &[TEXT], record.clone()).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
        expected.extend_from_slice(record.as_bytes());
    }
    expected
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_records_move_to_object_storage_and_read_back_unchanged() {
    let s3 = S3Server::start();
    s3.create_bucket("ursula-cold").await;
    let cold = support::cold_config(&s3, "ursula-cold", "single", FAST_FLUSH);
    let node = start_in_process(|config| config.storage.cold = Some(cold)).await;
    let client = &node.client;
    create(client, "/logs", &[]).await;
    create(client, "/logs/text", &[TEXT]).await;
    create(client, "/logs/json", &[JSON]).await;
    let expected = append_records(client, "/logs/text", 400, 900).await;
    for i in 0..300 {
        let reply = client
            .post(
                "/logs/json",
                &[JSON],
                format!("{{\"i\":{i},\"pad\":\"{}\"}}", "y".repeat(20)),
            )
            .await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    }

    // Local disk keeps only what does not fill an object yet: under 4 KiB per stream.
    let local_bytes =
        async || metric(&node.admin, "ursula_group_local_record_bytes{group=\"0\"} ").await;
    wait_for("records to leave local disk", async || {
        let local = local_bytes().await;
        local > 0 && local < 2 * 4096
    })
    .await;
    let objects = s3.keys("ursula-cold", "single/g0/").await;
    assert!(objects.len() >= 50, "{} objects", objects.len());

    let (text, _) = client.read_all("/logs/text").await;
    assert_eq!(text, expected, "the whole stream, through its cold objects");
    // From the middle of a cold object, and from a record boundary in another.
    for at in [1, 5000, 12_345] {
        let (suffix, _) = client
            .read_all_from("/logs/text", &ursula_node::offset::format(at as u64))
            .await;
        assert_eq!(suffix, expected[at..], "from offset {at}");
    }
    let (json, _) = client.read_all("/logs/json").await;
    let mut messages = Vec::new();
    for page in String::from_utf8(json).unwrap().split("][") {
        let page = format!("[{}]", page.trim_start_matches('[').trim_end_matches(']'));
        let values: Vec<serde_json::Value> = serde_json::from_str(&page).unwrap();
        messages.extend(values.into_iter().map(|v| v["i"].as_u64().unwrap()));
    }
    assert_eq!(messages, (0..300).collect::<Vec<u64>>());
    // The stream is larger than the tail cache: its start came from object storage.
    assert!(metric(&node.admin, "ursula_cold_object_fetches_total ").await > 0);
}

#[test]
fn cold_records_survive_a_sigkill_and_restart() {
    let s3 = S3Server::start();
    let rt = runtime();
    rt.block_on(s3.create_bucket("ursula-crash"));
    let dir = tempfile::tempdir().expect("tempdir");
    let server = format!("\n{}", s3.cold_toml("ursula-crash", "", FAST_FLUSH));
    let node = Process::start_with(dir.path(), &server, &[]);
    let expected = rt.block_on(async {
        let client = node.client();
        create(&client, "/bkt", &[]).await;
        create(&client, "/bkt/s", &[TEXT]).await;
        let expected = append_records(&client, "/bkt/s", 300, 0).await;
        let admin = Client::new(node.admin_addr);
        wait_for("cold flushes", async || {
            metric(&admin, "ursula_cold_flushes_total ").await >= 4
        })
        .await;
        expected
    });
    node.kill();
    let node = Process::start_with(dir.path(), &server, &[]);
    rt.block_on(async {
        let (bytes, last) = node.client().read_all("/bkt/s").await;
        assert_eq!(bytes, expected);
        let admin = Client::new(node.admin_addr);
        assert!(metric(&admin, "ursula_cold_object_fetches_total ").await > 0);
        assert_eq!(
            last.header("stream-next-offset"),
            Some(ursula_node::offset::format(expected.len() as u64).as_str())
        );
    });
    node.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_hot_cap_writes_are_refused_marked_until_flushing_catches_up() {
    let s3 = S3Server::start();
    // The bucket does not exist yet: every flush fails, as with object storage down.
    let cold = support::cold_config(
        &s3,
        "ursula-late",
        "",
        "segment_size = 1024\nflush_interval = \"50ms\"\nmax_hot_size_per_group = 8192",
    );
    let node = start_in_process(|config| {
        config.storage.cold = Some(cold);
        config.server.max_append_size = 4096;
    })
    .await;
    let client = &node.client;
    create(client, "/bkt/s", &[TEXT]).await;
    let body = "z".repeat(1000);
    let mut accepted = 0u64;
    let refused = loop {
        let reply = client.post("/bkt/s", &[TEXT], body.clone()).await;
        if reply.status != StatusCode::NO_CONTENT {
            break reply;
        }
        accepted += 1;
        assert!(accepted <= 9, "more than the cap was accepted");
    };
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.text()
    );
    assert_eq!(refused.error(), "ColdBackpressure");
    assert_eq!(
        refused.header("x-ursula-not-applied"),
        Some("ColdBackpressure")
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(accepted, 8, "8 KiB of 1000-byte bodies fit under the cap");
    // Nothing of the refused append applied.
    let head = client.send(Method::HEAD, "/bkt/s", &[], Bytes::new()).await;
    let tail = ursula_node::offset::format(accepted * 1000);
    assert_eq!(head.header("stream-next-offset"), Some(tail.as_str()));
    // A create with a body counts too, and is refused the same way.
    let create = client.put("/bkt/t", &[TEXT], body.clone()).await;
    assert_eq!(create.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        create.header("x-ursula-not-applied"),
        Some("ColdBackpressure")
    );
    assert_eq!(
        client.get("/bkt/t").await.status,
        StatusCode::NOT_FOUND,
        "the refused create applied nothing"
    );

    // Object storage is back: flushing catches up and writes pass again.
    s3.create_bucket("ursula-late").await;
    wait_for("an append to pass again", async || {
        client.post("/bkt/s", &[TEXT], body.clone()).await.status == StatusCode::NO_CONTENT
    })
    .await;
    let (bytes, _) = client.read_all("/bkt/s").await;
    assert_eq!(bytes.len() as u64, (accepted + 1) * 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_deletes_objects_of_deleted_streams_and_behind_retention() {
    let s3 = S3Server::start();
    s3.create_bucket("ursula-sweep").await;
    let cold = support::cold_config(
        &s3,
        "ursula-sweep",
        "swept",
        &format!("{FAST_FLUSH}\nsweep_interval = \"100ms\"\nsweep_grace = \"0s\""),
    );
    let node = start_in_process(|config| config.storage.cold = Some(cold)).await;
    let client = &node.client;
    for stream in ["/bkt/gone", "/bkt/kept"] {
        create(client, stream, &[TEXT]).await;
    }
    append_records(client, "/bkt/gone", 200, 0).await;
    let kept = append_records(client, "/bkt/kept", 300, 0).await;
    let count = async |stream: &str| -> usize {
        // Stream IDs: "gone" is 1, "kept" is 2 (the node numbers streams as it creates them).
        s3.keys("ursula-sweep", &format!("swept/g0/s{stream}/"))
            .await
            .len()
    };
    wait_for("both streams flushed", async || {
        count("1").await >= 2 && count("2").await >= 3
    })
    .await;

    assert_eq!(
        client
            .send(Method::DELETE, "/bkt/gone", &[], Bytes::new())
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    wait_for("the deleted stream's objects deleted", async || {
        count("1").await == 0
    })
    .await;

    // Retention past the first two objects of "kept": those go, the rest stay readable.
    let objects_before = count("2").await;
    let retain_at = 9000u64;
    let reply = client
        .put(
            &format!(
                "/bkt/kept/retention/{}",
                ursula_node::offset::format(retain_at)
            ),
            &[],
            "",
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    wait_for("objects behind retention deleted", async || {
        count("2").await < objects_before
    })
    .await;
    let (rest, _) = client
        .read_all_from("/bkt/kept", &ursula_node::offset::format(retain_at))
        .await;
    assert_eq!(rest, kept[retain_at as usize..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_are_staged_in_object_storage_and_read_back() {
    let s3 = S3Server::start();
    s3.create_bucket("ursula-staged").await;
    let cold = support::cold_config(&s3, "ursula-staged", "st", FAST_FLUSH);
    let node = start_in_process(|config| {
        config.storage.cold = Some(cold);
        config.runtime.external_payload_min_size = Some(1000);
    })
    .await;
    let client = &node.client;
    // A create with a large body, and appends: large ones staged, small ones inline (and
    // flushed in 4 KiB objects between the staged ones).
    let first = "c".repeat(1500);
    let reply = client.put("/bkt/s", &[TEXT], first.clone()).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    let mut expected = first.into_bytes();
    let mut large_at = Vec::new();
    for i in 0..120 {
        if i % 40 == 20 {
            large_at.push(expected.len());
        }
        let record = if i % 40 == 20 {
            format!("large {i} {}\n", "L".repeat(5000))
        } else {
            format!("small {i:03} {}\n", "s".repeat(90))
        };
        let reply = client.post("/bkt/s", &[TEXT], record.clone()).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
        expected.extend_from_slice(record.as_bytes());
    }
    create(client, "/bkt/j", &[JSON]).await;
    let messages: Vec<String> = (0..40)
        .map(|i| format!("{{\"i\":{i},\"p\":\"{}\"}}", "x".repeat(30)))
        .collect();
    let reply = client
        .post("/bkt/j", &[JSON], format!("[{}]", messages.join(",")))
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());

    // A fork cut 2,000 bytes into a staged record: that part is staged too.
    let at = large_at[1];
    let fork_offset = ursula_node::offset::format(at as u64);
    let reply = client
        .put(
            "/bkt/f",
            &[
                TEXT,
                ("stream-forked-from", "/bkt/s"),
                ("stream-fork-offset", &fork_offset),
                ("stream-fork-sub-offset", "2000"),
            ],
            "",
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    let (forked, _) = client.read_all("/bkt/f").await;
    assert_eq!(forked, expected[..at + 2000]);

    let staged = s3.keys("ursula-staged", "st/g0/staged/").await;
    assert_eq!(
        staged.len(),
        6,
        "a create, three appends, a JSON batch, a fork's part: {staged:?}"
    );
    assert_eq!(metric(&node.admin, "ursula_staged_bodies_total ").await, 6);
    wait_for("the small records to leave local disk", async || {
        metric(&node.admin, "ursula_group_local_record_bytes{group=\"0\"} ").await < 4096
    })
    .await;
    let (bytes, _) = client.read_all("/bkt/s").await;
    assert_eq!(bytes, expected);
    for at in [1499u64, 1500, 4000, 7000, 10_000] {
        let (suffix, _) = client
            .read_all_from("/bkt/s", &ursula_node::offset::format(at))
            .await;
        assert_eq!(suffix, expected[at as usize..], "from offset {at}");
    }
    let (json, _) = client.read_all("/bkt/j").await;
    assert_eq!(json, format!("[{}]", messages.join(",")).into_bytes());
}

#[test]
fn every_voter_reads_the_cold_records_and_a_new_leader_serves_them() {
    let s3 = S3Server::start();
    let rt = runtime();
    rt.block_on(s3.create_bucket("ursula-cluster"));
    // Bodies of 2,000 bytes and more are staged in object storage.
    let cold = s3.cold_toml("ursula-cluster", "c", FAST_FLUSH);
    let cluster = TestCluster::start(
        3,
        &format!("{cold}[runtime]\nexternal_payload_min_size = 2000\n"),
    );
    rt.block_on(async {
        cluster.wait_ready().await;
        let send = async |method: Method, path: &str, headers: &[(&str, &str)], body: String| {
            cluster
                .send(
                    0,
                    method,
                    path,
                    headers,
                    Bytes::from(body),
                    Duration::from_secs(20),
                )
                .await
                .expect("an answer")
        };
        assert_eq!(
            send(Method::PUT, "/cold", &[], String::new()).await.status,
            StatusCode::CREATED
        );
        assert_eq!(
            send(Method::PUT, "/cold/s", &[TEXT], String::new())
                .await
                .status,
            StatusCode::CREATED
        );
        let mut expected = Vec::new();
        for i in 0..300 {
            // Every 50th record is large: staged, between records that stay inline.
            let pad = if i % 50 == 25 { 3000 } else { i % 61 };
            let record = format!("voter record {i:04} {}\n", "v".repeat(pad));
            let reply = send(Method::POST, "/cold/s", &[TEXT], record.clone()).await;
            assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
            expected.extend_from_slice(record.as_bytes());
        }
        let group = cluster.group_of("cold");
        wait_for("cold objects of the group", async || {
            s3.keys("ursula-cluster", &format!("c/g{group}/"))
                .await
                .len()
                >= 3
        })
        .await;
        assert!(
            s3.keys("ursula-cluster", &format!("c/g{group}/staged/"))
                .await
                .len()
                >= 6,
            "staged bodies"
        );
        // Every voter's own copy, cold objects included, is the stream.
        cluster.wait_replicas_equal("cold", "s", &expected).await;
        // A follower hands a create with a staged body to Raft without checking leadership,
        // so its redirect cannot say nothing applied; a create with a small body is checked
        // first, and its redirect is marked.
        let leader = cluster.leader_of(group).await.expect("a leader");
        let follower = cluster.voters[(leader + 1) % 3].client();
        let staged = follower.put("/cold/big", &[TEXT], "b".repeat(2500)).await;
        assert_eq!(
            staged.status,
            StatusCode::TEMPORARY_REDIRECT,
            "{}",
            staged.text()
        );
        assert_eq!(staged.header("x-ursula-not-applied"), None);
        let small = follower.put("/cold/small", &[TEXT], "b").await;
        assert_eq!(small.status, StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(small.header("x-ursula-not-applied"), Some("NotLeader"));
        // The leader goes; the new one reads the same records from object storage.
        let leader = cluster.leader_of(group).await.expect("a leader");
        cluster.kill(leader);
        assert_eq!(cluster.read_all("/cold/s").await, expected);
    });
}

/// "After a marked refusal the node deletes the staged object": a fork create whose part of a
/// staged record is staged, and whose small inline body takes the group past its hot cap, is
/// refused with a marked 503 `ColdBackpressure`, and the object staged for it goes; the
/// staged object of the source stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_refusal_deletes_what_was_staged_for_it() {
    let s3 = S3Server::start();
    s3.create_bucket("ursula-refused").await;
    // Nothing flushes during the test, so local record bytes only grow.
    let cold = support::cold_config(
        &s3,
        "ursula-refused",
        "r",
        "flush_interval = \"1h\"\nmax_hot_size_per_group = 4096",
    );
    let node = start_in_process(|config| {
        config.storage.cold = Some(cold);
        config.runtime.external_payload_min_size = Some(1000);
    })
    .await;
    let client = &node.client;
    let staged = async || s3.keys("ursula-refused", "r/g0/staged/").await;
    // The source: one staged record of 1,500 bytes, then 3,996 bytes of inline records.
    let reply = client.put("/bkt/s", &[TEXT], "L".repeat(1500)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    for _ in 0..4 {
        let reply = client.post("/bkt/s", &[TEXT], "i".repeat(999)).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    }
    let before = staged().await;
    assert_eq!(before.len(), 1, "the source's staged record: {before:?}");

    let refused = client
        .put(
            "/bkt/f",
            &[
                TEXT,
                ("stream-forked-from", "/bkt/s"),
                ("stream-fork-offset", &ursula_node::offset::format(0)),
                ("stream-fork-sub-offset", "1200"),
            ],
            "i".repeat(200),
        )
        .await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.text()
    );
    assert_eq!(
        refused.header("x-ursula-not-applied"),
        Some("ColdBackpressure")
    );
    assert_eq!(metric(&node.admin, "ursula_staged_bodies_total ").await, 2);
    wait_for("the refused fork's staged part to be deleted", async || {
        staged().await == before
    })
    .await;
    assert_eq!(client.get("/bkt/f").await.status, StatusCode::NOT_FOUND);
}

/// The spec's exception for `storage.cold.max_hot_size_per_group = 0` (every body staged): a
/// node hands every create to Raft without checking leadership, even one with no body, so a
/// follower's redirect for it carries no marker; an append is still checked first, and its
/// redirect is marked.
#[test]
fn with_a_hot_cap_of_zero_a_followers_create_redirect_is_unmarked() {
    let s3 = S3Server::start();
    let rt = runtime();
    rt.block_on(s3.create_bucket("ursula-zero"));
    let cold = s3.cold_toml("ursula-zero", "z", "max_hot_size_per_group = 0");
    let cluster = TestCluster::start(3, &cold);
    rt.block_on(async {
        cluster.wait_ready().await;
        let created = cluster
            .send(
                0,
                Method::PUT,
                "/zero/s",
                &[TEXT],
                Bytes::new(),
                Duration::from_secs(20),
            )
            .await
            .expect("an answer");
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
        let group = cluster.group_of("zero");
        let leader = cluster.leader_of(group).await.expect("a leader");
        let follower = cluster.voters[(leader + 1) % 3].client();
        for (what, body) in [("an empty create", ""), ("a create with a body", "b")] {
            let reply = follower.put("/zero/new", &[TEXT], body).await;
            assert_eq!(
                reply.status,
                StatusCode::TEMPORARY_REDIRECT,
                "{what}: {}",
                reply.text()
            );
            assert_eq!(reply.header("x-ursula-not-applied"), None, "{what}");
        }
        let append = follower.post("/zero/s", &[TEXT], "a").await;
        assert_eq!(append.status, StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(append.header("x-ursula-not-applied"), Some("NotLeader"));
    });
}
