//! Snapshot publishes through the gateway: nodes take bodies up to their
//! `server.max_snapshot_size` (256 MiB), and so does the gateway, which buffers them for its
//! redirect hops up to `max_buffered_snapshot_size`; other writes keep the 64 MiB limit.

mod support;

use http::StatusCode;
use support::start_gateway;
use ursula_testkit::Http;
use ursula_testkit::node::NodeProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_over_the_append_limit_passes_the_gateway() {
    let node = NodeProcess::in_temp_dir();
    let gateway = start_gateway(vec![node.url()], |_| {}).await;
    let http = Http::new();
    let url = |path: &str| format!("http://{}{path}", gateway.addr);
    let text = [("content-type", "text/plain")];
    let created = http
        .request("PUT", &url("/snap/s"), &text, "state so far")
        .await
        .expect("an answer");
    assert_eq!(created.status, StatusCode::CREATED);
    let tail = created
        .header("stream-next-offset")
        .expect("the tail")
        .to_owned();

    // 72 MiB: over the 64 MiB that other writes may have, which got a 413 here before.
    let body = "S".repeat(72 * 1024 * 1024);
    let path = format!("/snap/s/snapshot/{tail}");
    let published = http
        .request(
            "PUT",
            &url(&path),
            &[("content-type", "application/octet-stream")],
            &body,
        )
        .await
        .expect("an answer");
    assert!(
        published.status.is_success(),
        "{}: {}",
        published.status,
        String::from_utf8_lossy(&published.body)
    );
    let read = http
        .request("GET", &url(&path), &[], "")
        .await
        .expect("an answer");
    assert_eq!(
        read.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&read.body[..read.body.len().min(500)])
    );
    assert_eq!(read.body.len(), body.len(), "the whole snapshot reads back");
    assert!(read.body.iter().all(|&b| b == b'S'));
}
