//! Bucket purge on a real 3-voter cluster, sent to a follower's admin listener and again to the
//! leader's: every stream of the bucket is gone from every voter, the bucket is fenced (creates
//! answer 404), a repeated purge succeeds, and other buckets are untouched.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use ursula_testkit::cluster::TestCluster;

const TEXT: (&str, &str) = ("content-type", "text/plain");

async fn send(
    cluster: &TestCluster,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &'static str,
) -> ursula_testkit::Reply {
    cluster
        .send(
            0,
            method,
            path,
            headers,
            Bytes::from_static(body.as_bytes()),
            Duration::from_secs(20),
        )
        .await
        .expect("an answer")
}

#[test]
fn a_purge_sent_to_any_voter_deletes_and_fences_the_bucket_everywhere() {
    let cluster = TestCluster::start(3, "");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        cluster.wait_ready().await;
        for bucket in ["purge-me", "keep-me"] {
            assert!(
                send(&cluster, Method::PUT, &format!("/{bucket}"), &[], "")
                    .await
                    .status
                    .is_success()
            );
            for s in 0..3 {
                let path = format!("/{bucket}/s{s}");
                assert_eq!(
                    send(&cluster, Method::PUT, &path, &[TEXT], "").await.status,
                    StatusCode::CREATED
                );
                assert_eq!(
                    send(&cluster, Method::POST, &path, &[TEXT], "data")
                        .await
                        .status,
                    StatusCode::NO_CONTENT
                );
            }
        }
        for s in 0..3 {
            cluster
                .wait_replicas_equal("purge-me", &format!("s{s}"), b"data")
                .await;
        }
        let leader = cluster
            .leader_of(cluster.group_of("purge-me"))
            .await
            .expect("a leader");
        let follower = (leader + 1) % 3;

        let purged = cluster.voters[follower]
            .admin()
            .post("/admin/buckets/purge-me/purge", &[], "")
            .await;
        assert_eq!(purged.status, StatusCode::OK, "{}", purged.text());
        let body: serde_json::Value = serde_json::from_slice(&purged.body).expect("JSON");
        assert_eq!(body["purged_streams"], 3);
        assert_eq!(body["fenced"], true);

        // Gone from every voter's own copy.
        for voter in &cluster.voters {
            for s in 0..3 {
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                loop {
                    let copy = voter
                        .admin()
                        .get(&format!("/admin/replica/purge-me/s{s}"))
                        .await;
                    if copy.status == StatusCode::NOT_FOUND {
                        break;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "voter {} still has purge-me/s{s}: {}",
                        voter.id,
                        copy.text()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        // Fenced for good: reads, stream creates and bucket creates answer 404.
        let read = send(&cluster, Method::GET, "/purge-me/s0?offset=-1", &[], "").await;
        assert_eq!(read.status, StatusCode::NOT_FOUND);
        let create = send(&cluster, Method::PUT, "/purge-me/again", &[TEXT], "").await;
        assert_eq!(create.status, StatusCode::NOT_FOUND, "{}", create.text());
        let bucket = send(&cluster, Method::PUT, "/purge-me", &[], "").await;
        assert_eq!(bucket.status, StatusCode::NOT_FOUND, "{}", bucket.text());

        // Again, at the leader this time: it succeeds and purges nothing more.
        let again = cluster.voters[leader]
            .admin()
            .post("/admin/buckets/purge-me/purge", &[], "")
            .await;
        assert_eq!(again.status, StatusCode::OK, "{}", again.text());
        let body: serde_json::Value = serde_json::from_slice(&again.body).expect("JSON");
        assert_eq!(body["purged_streams"], 0);

        // The other bucket is untouched.
        for s in 0..3 {
            let bytes = cluster.read_all(&format!("/keep-me/s{s}")).await;
            assert_eq!(bytes, b"data");
            cluster
                .wait_replicas_equal("keep-me", &format!("s{s}"), &bytes)
                .await;
        }
        // The client listener has no purge route.
        let client = cluster.voters[leader]
            .client()
            .post("/admin/buckets/keep-me/purge", &[], "")
            .await;
        assert_ne!(client.status, StatusCode::OK);
    });
}
