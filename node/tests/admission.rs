//! Write admission over real HTTP, with the conditions caused for real: the disk's real free
//! space, a real log past its budget, real bodies in flight. Every refusal is marked with
//! `x-ursula-not-applied`, and nothing of a refused write is visible afterwards.

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use support::{InProcess, start_in_process};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use ursula_node::admission::available_bytes;
use ursula_testkit::Reply;

const TEXT: (&str, &str) = ("content-type", "text/plain");
const MIB: u64 = 1 << 20;

/// These tests share one filesystem, and the disk-pressure test measures that filesystem's free
/// space: a neighbour preallocating WAL segments while it runs would move its marks. They take
/// turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn assert_marked(reply: &Reply, status: StatusCode, token: &str) {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert_eq!(reply.error(), token);
    assert_eq!(reply.header("x-ursula-not-applied"), Some(token));
    assert_eq!(
        reply.header("x-ursula-not-applied-checked"),
        None,
        "nodes never vouch"
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        assert_eq!(reply.header("retry-after"), Some("1"));
    }
}

async fn stream(node: &InProcess) {
    assert_eq!(
        node.client.put("/adm", &[], "").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        node.client.put("/adm/s", &[TEXT], "").await.status,
        StatusCode::CREATED
    );
}

async fn wait_for(node: &InProcess, status: StatusCode, body: &str) -> Reply {
    wait_for_at(node, "/adm/s", status, body).await
}

async fn contents(node: &InProcess) -> String {
    node.client.get("/adm/s?offset=-1").await.text()
}

/// Appends `body` to `path` until the answer is `status`, for up to five seconds.
async fn wait_for_at(node: &InProcess, path: &str, status: StatusCode, body: &str) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let reply = node.client.post(path, &[TEXT], body.to_owned()).await;
        if reply.status == status || Instant::now() > deadline {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn allocate(path: &std::path::Path, bytes: u64) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
        .expect("ballast");
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor and a non-negative range.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, bytes as libc::off_t) };
    assert_eq!(rc, 0, "posix_fallocate");
    file.sync_all().expect("sync");
}

#[tokio::test]
async fn disk_pressure_refuses_writes_with_hysteresis() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ballast_dir = tempfile::tempdir().expect("tempdir");
    let ballast = ballast_dir.path().join("ballast");
    let free = available_bytes(ballast_dir.path()).expect("statvfs");
    assert!(
        free > 128 * MIB,
        "this test needs 128 MiB of free disk, found {free}"
    );
    // Refuse below free-48 MiB; resume at free-24 MiB.
    let node = start_in_process(|config| {
        config.raft.wal.min_available_size = free - 48 * MIB;
        config.raft.wal.resume_available_size = free - 24 * MIB;
        config.raft.wal.free_space_check_interval = Duration::from_millis(20);
        config.raft.wal.segment_size = MIB;
    })
    .await;
    stream(&node).await;
    assert_eq!(
        wait_for(&node, StatusCode::NO_CONTENT, "a").await.status,
        StatusCode::NO_CONTENT
    );

    // Fill the disk past the low mark: every write is refused, bodiless ones too. (Appends to
    // a probe stream find the moment the next free-space sample sees it.)
    assert_eq!(
        node.client.put("/adm/probe", &[TEXT], "").await.status,
        StatusCode::CREATED
    );
    allocate(&ballast, 64 * MIB);
    let refused = wait_for_at(&node, "/adm/probe", StatusCode::SERVICE_UNAVAILABLE, "p").await;
    assert_marked(&refused, StatusCode::SERVICE_UNAVAILABLE, "WalDiskPressure");
    let close = node
        .client
        .post("/adm/s", &[("stream-closed", "true")], "")
        .await;
    assert_marked(&close, StatusCode::SERVICE_UNAVAILABLE, "WalDiskPressure");
    let create = node.client.put("/adm/t", &[TEXT], "").await;
    assert_marked(&create, StatusCode::SERVICE_UNAVAILABLE, "WalDiskPressure");

    // Free some, but not up to the resume mark: still refused.
    allocate(&ballast, 36 * MIB);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let still = node.client.post("/adm/s", &[TEXT], "b").await;
    assert_marked(&still, StatusCode::SERVICE_UNAVAILABLE, "WalDiskPressure");

    // Past the resume mark: writes pass again. Reads never stopped.
    std::fs::remove_file(&ballast).expect("remove ballast");
    assert_eq!(
        wait_for(&node, StatusCode::NO_CONTENT, "d").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(contents(&node).await, "ad");
    assert_eq!(
        node.client.get("/adm/t").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn log_pressure_refuses_bodies_until_a_checkpoint() {
    let _turn = ONE_AT_A_TIME.lock().await;
    // Checkpoints paused: the log only grows.
    let node = start_in_process(|config| {
        config.raft.snapshot_log_budget = 4096;
        config.raft.wal.checkpoint_interval = Duration::from_secs(3600);
    })
    .await;
    stream(&node).await;
    let body = "x".repeat(1000);
    let mut accepted = 0;
    let refused = loop {
        let reply = node.client.post("/adm/s", &[TEXT], body.clone()).await;
        if reply.status != StatusCode::NO_CONTENT {
            break reply;
        }
        accepted += 1;
        assert!(accepted < 100, "never refused");
    };
    assert_marked(&refused, StatusCode::SERVICE_UNAVAILABLE, "RaftLogPressure");
    assert!(
        (8..=10).contains(&accepted),
        "refused after {accepted} appends of 1000 bytes"
    );
    // Writes without a body still pass.
    let close = node
        .client
        .post("/adm/s", &[("stream-closed", "true")], "")
        .await;
    assert_eq!(close.status, StatusCode::NO_CONTENT);
    assert_eq!(contents(&node).await.len(), accepted * 1000);

    // With checkpoints running, the log shrinks below 1.5 times the budget and writes resume.
    let node = start_in_process(|config| {
        config.raft.snapshot_log_budget = 4096;
        config.raft.wal.checkpoint_interval = Duration::from_millis(300);
    })
    .await;
    stream(&node).await;
    let mut refused = None;
    for _ in 0..100 {
        let reply = node.client.post("/adm/s", &[TEXT], body.clone()).await;
        if reply.status != StatusCode::NO_CONTENT {
            refused = Some(reply);
            break;
        }
    }
    let refused = refused.expect("the log passed twice its budget");
    assert_marked(&refused, StatusCode::SERVICE_UNAVAILABLE, "RaftLogPressure");
    let resumed = wait_for(&node, StatusCode::NO_CONTENT, "y").await;
    assert_eq!(resumed.status, StatusCode::NO_CONTENT, "{}", resumed.text());
}

#[tokio::test]
async fn bodies_in_flight_share_a_budget() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = start_in_process(|config| {
        config.server.http_inflight_body_size = 64 * 1024;
    })
    .await;
    stream(&node).await;
    // A client that declared 60000 bytes and sent only some of them holds its share.
    let mut slow = TcpStream::connect(node.client_addr).await.expect("connect");
    slow.write_all(
        b"POST /adm/s HTTP/1.1\r\nhost: x\r\ncontent-type: text/plain\r\ncontent-length: 60000\r\n\r\n",
    )
    .await
    .expect("headers");
    slow.write_all(&[b's'; 1000]).await.expect("some body");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let refused = node
        .client
        .post("/adm/s", &[TEXT], "z".repeat(10_000))
        .await;
    assert_marked(
        &refused,
        StatusCode::SERVICE_UNAVAILABLE,
        "IngressBodyBytesLimitReached",
    );
    let small = node.client.post("/adm/s", &[TEXT], "z".repeat(1000)).await;
    assert_eq!(
        small.status,
        StatusCode::NO_CONTENT,
        "a body that fits passes"
    );

    slow.write_all(&[b's'; 59_000])
        .await
        .expect("rest of the body");
    let mut answer = [0u8; 12];
    slow.read_exact(&mut answer).await.expect("answer");
    assert_eq!(&answer, b"HTTP/1.1 204");
    let after = node
        .client
        .post("/adm/s", &[TEXT], "z".repeat(10_000))
        .await;
    assert_eq!(
        after.status,
        StatusCode::NO_CONTENT,
        "the budget was returned"
    );
    assert_eq!(contents(&node).await.len(), 1000 + 60_000 + 10_000);
}

#[tokio::test]
async fn oversized_bodies_are_refused_unapplied() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let node = start_in_process(|config| config.server.max_append_size = 1000).await;
    stream(&node).await;
    let declared = node.client.post("/adm/s", &[TEXT], "x".repeat(1001)).await;
    assert_marked(
        &declared,
        StatusCode::PAYLOAD_TOO_LARGE,
        "RequestBodyTooLarge",
    );
    // Without a Content-Length (chunked), the limit applies as the body arrives.
    let mut chunked = TcpStream::connect(node.client_addr).await.expect("connect");
    let chunk = "y".repeat(600);
    let request = format!(
        "POST /adm/s HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n\
         258\r\n{chunk}\r\n258\r\n{chunk}\r\n0\r\n\r\n"
    );
    chunked
        .write_all(request.as_bytes())
        .await
        .expect("request");
    let mut answer = String::new();
    let _ = chunked.read_to_string(&mut answer).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("x-ursula-not-applied: RequestBodyTooLarge"),
        "{answer}"
    );
    assert_eq!(contents(&node).await, "");
}
