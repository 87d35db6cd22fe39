//! Voter membership at run time, on real `ursula-node` processes: 3 -> 5 -> 3 voters while
//! producers append, with the leader of a busy group SIGKILLed in the middle of each change;
//! a single voter with data growing to three; a voter whose data directory is wiped coming
//! back as a learner, caught up by snapshot, and never voting with its old identity.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::json;
use ursula_testkit::cluster::TestCluster;
use ursula_testkit::load::{BUCKETS, create_streams, start_load, verify};
use ursula_testkit::runtime;

/// Makes a membership change through voter `via`'s admin API; it must succeed.
async fn change(
    cluster: &TestCluster,
    via: usize,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) {
    let (status, answer) = cluster.admin_call(via, method.clone(), path, body).await;
    assert_eq!(status, StatusCode::OK, "{method} {path}: {answer}");
}

async fn add_learner(cluster: &TestCluster, via: usize, i: usize) {
    let voter = &cluster.voters[i];
    let body = json!({
        "cluster_url": format!("https://{}", voter.cluster_addr),
        "client_url": format!("http://{}:{}", voter.ip, voter.client_port),
    });
    let path = format!("/admin/membership/learners/{}", voter.id);
    change(cluster, via, Method::PUT, &path, Some(body)).await;
}

/// Waits until every group's leader reports the voters and learners given, with every
/// learner caught up.
async fn wait_membership(cluster: &TestCluster, voters: &[u64], learners: &[u64]) {
    let settled = cluster
        .settle_membership(voters, learners, 64, Duration::from_secs(60))
        .await;
    if let Err(unsettled) = settled {
        panic!("{unsettled}");
    }
}

/// SIGKILLs the leader of the busiest group (the first bucket's) and starts it again.
async fn kill_busy_leader(cluster: &TestCluster) {
    let group = cluster.group_of(BUCKETS[0]);
    let leader = cluster.leader_of(group).await.expect("a leader");
    eprintln!("SIGKILL of voter {}, leader of group {group}", leader + 1);
    tokio::task::block_in_place(|| cluster.restart(leader));
}

/// The last index of every group's log on voter `i`.
async fn log_indexes(cluster: &TestCluster, i: usize) -> Vec<Option<u64>> {
    let mut indexes = Vec::new();
    for group in 0..cluster.group_count {
        indexes.push(cluster.last_log_index(i, group).await);
    }
    indexes
}

#[test]
fn three_to_five_to_three_voters_under_load_loses_no_acknowledged_append() {
    let rt = runtime();
    let cluster = Arc::new(TestCluster::start_growable(3, 2, ""));
    rt.block_on(async {
        cluster.wait_ready().await;
        create_streams(&cluster).await;
        let load = start_load(&cluster, 1);
        tokio::time::sleep(Duration::from_millis(500)).await;

        // Grow: each new voter joins as a learner, catches up, and is promoted.
        for i in [3, 4] {
            tokio::task::block_in_place(|| cluster.start_spare(i));
            add_learner(&cluster, 0, i).await;
            kill_busy_leader(&cluster).await;
            let id = cluster.voters[i].id;
            let voters: Vec<u64> = (1..=id - 1).collect();
            wait_membership(&cluster, &voters, &[id]).await;
            let path = format!("/admin/membership/voters/{id}");
            change(&cluster, 1, Method::PUT, &path, None).await;
        }
        wait_membership(&cluster, &[1, 2, 3, 4, 5], &[]).await;

        // Shrink: each voter hands its leadership off, is demoted, then removed.
        for i in [4, 3] {
            let id = cluster.voters[i].id;
            change(&cluster, i, Method::POST, "/admin/drain", None).await;
            let path = format!("/admin/membership/voters/{id}");
            change(&cluster, 0, Method::DELETE, &path, None).await;
            kill_busy_leader(&cluster).await;
            let path = format!("/admin/membership/learners/{id}");
            change(&cluster, 1, Method::DELETE, &path, None).await;
            let voters: Vec<u64> = (1..id).collect();
            wait_membership(&cluster, &voters, &[]).await;
            // Removed: it is sent no more entries while the others go on appending.
            let before = log_indexes(&cluster, i).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(
                log_indexes(&cluster, i).await,
                before,
                "voter {id} received entries after its removal"
            );
            tokio::task::block_in_place(|| cluster.kill(i));
        }

        tokio::time::sleep(Duration::from_millis(500)).await;
        let acked = load.finish().await;
        cluster.wait_ready().await;
        verify(&cluster, &acked).await;
    });
}

#[test]
fn a_single_voter_with_data_becomes_the_first_of_three() {
    let rt = runtime();
    let cluster = Arc::new(TestCluster::start_growable(1, 2, ""));
    rt.block_on(async {
        cluster.wait_ready().await;
        create_streams(&cluster).await;
        let load = start_load(&cluster, 2);
        tokio::time::sleep(Duration::from_millis(500)).await;
        for i in [1, 2] {
            tokio::task::block_in_place(|| cluster.start_spare(i));
            add_learner(&cluster, 0, i).await;
        }
        wait_membership(&cluster, &[1], &[2, 3]).await;
        for id in [2, 3] {
            let path = format!("/admin/membership/voters/{id}");
            change(&cluster, 0, Method::PUT, &path, None).await;
        }
        wait_membership(&cluster, &[1, 2, 3], &[]).await;
        // Voter 1 led every group; the new voters take their share (4 groups over 3: one each).
        for i in [1, 2] {
            change(&cluster, i, Method::POST, "/admin/leadership/claim", None).await;
        }
        let mut led = [0usize; 3];
        for group in cluster.membership().await {
            led[group.leader.expect("a leader") as usize - 1] += 1;
        }
        assert!(led.iter().all(|n| *n >= 1), "leaders per voter: {led:?}");
        let acked = load.finish().await;
        // The first voter is no longer needed: the other two hold everything.
        tokio::task::block_in_place(|| cluster.kill(0));
        cluster.wait_ready().await;
        verify(&cluster, &acked).await;
    });
}

#[test]
fn a_voter_whose_data_is_wiped_rejoins_as_a_learner_and_never_votes_before() {
    let rt = runtime();
    // Snapshots every 64 entries, so that the wiped voter can only catch up by snapshot.
    let cluster = Arc::new(TestCluster::start(
        3,
        "snapshot_entries = 64\nentries_kept_after_snapshot = 8\n",
    ));
    rt.block_on(async {
        cluster.wait_ready().await;
        create_streams(&cluster).await;
        let load = start_load(&cluster, 3);
        // Until some group has snapshotted and dropped the start of its log: under heavy
        // batching (a loaded machine) 2 s of load made fewer than 64 entries in every group.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let mut longest = 0;
            for group in 0..cluster.group_count {
                longest = longest.max(cluster.last_log_index(0, group).await.unwrap_or(0));
            }
            if longest > 150 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no group's log passed 150 entries in 60 s of load ({longest})"
            );
        }
        let acked = load.finish().await;

        tokio::task::block_in_place(|| {
            cluster.wipe(2);
            cluster.restart(2);
        });
        let (status, report) = cluster
            .admin_call(2, Method::GET, "/admin/membership", None)
            .await;
        assert_eq!(status, StatusCode::OK, "{report}");
        let rejoining = report["rejoining"].as_array().map_or(0, Vec::len);
        assert_eq!(
            rejoining, cluster.group_count,
            "every group is marked: {report}"
        );

        // With one voter down, the remaining healthy voter needs voter 3's vote to become
        // leader: voter 3 withholds it, so the groups voter 1 led stay without a leader.
        let group = cluster.group_of(BUCKETS[0]);
        let leader = cluster.leader_of(group).await.expect("a leader");
        let other = (0..2).find(|i| *i != leader).expect("another voter");
        tokio::task::block_in_place(|| cluster.kill(leader));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            !cluster.leads(other, group).await,
            "voter {} was elected with the vote of a voter that lost its state",
            other + 1
        );
        tokio::task::block_in_place(|| cluster.restart(leader));
        cluster.wait_ready().await;

        // Demoted to a learner, voter 3 catches up (by snapshot), and is promoted again.
        change(
            &cluster,
            0,
            Method::DELETE,
            "/admin/membership/voters/3",
            None,
        )
        .await;
        wait_membership(&cluster, &[1, 2], &[3]).await;
        let (_, report) = cluster
            .admin_call(2, Method::GET, "/admin/membership", None)
            .await;
        assert_eq!(report["rejoining"], json!([]), "readmitted: {report}");
        assert!(
            cluster.log_of(2).contains("installed a snapshot"),
            "voter 3 caught up without a snapshot"
        );
        change(&cluster, 0, Method::PUT, "/admin/membership/voters/3", None).await;
        wait_membership(&cluster, &[1, 2, 3], &[]).await;
        cluster.wait_ready().await;
        verify(&cluster, &acked).await;
    });
}

#[test]
fn membership_changes_that_cannot_be_made_are_refused_with_nothing_changed() {
    let rt = runtime();
    let cluster = TestCluster::start_growable(3, 1, "");
    rt.block_on(async {
        cluster.wait_ready().await;
        for (method, path, body, status, why) in [
            (
                Method::PUT,
                "/admin/membership/voters/4",
                None,
                409,
                "not a learner",
            ),
            (
                Method::DELETE,
                "/admin/membership/learners/2",
                None,
                409,
                "demote it",
            ),
            (
                Method::PUT,
                "/admin/membership/learners/4",
                Some(json!({"cluster_url": "ftp://x"})),
                400,
                "cluster_url",
            ),
            (
                Method::PUT,
                "/admin/membership/learners/4",
                Some(json!({"cluster_url": "ftp://x", "client_url": "http://x"})),
                400,
                "not an http:// or https:// URL",
            ),
        ] {
            let (got, answer) = cluster.admin_call(0, method.clone(), path, body).await;
            assert_eq!(got.as_u16(), status, "{method} {path}: {answer}");
            assert!(
                answer["message"].as_str().is_some_and(|m| m.contains(why)),
                "{method} {path}: {answer}"
            );
        }
        // A learner far behind is not promoted (voter 4 was never started).
        add_learner(&cluster, 0, 3).await;
        let (got, answer) = cluster
            .admin_call(0, Method::PUT, "/admin/membership/voters/4", None)
            .await;
        assert_eq!(got, StatusCode::CONFLICT, "{answer}");
        assert!(
            answer["message"]
                .as_str()
                .is_some_and(|m| m.contains("caught up")),
            "{answer}"
        );
        for group in cluster.membership().await {
            assert_eq!(group.voters, vec![1, 2, 3], "{group:?}");
            assert_eq!(group.learners, vec![4], "{group:?}");
        }
        change(
            &cluster,
            0,
            Method::DELETE,
            "/admin/membership/learners/4",
            None,
        )
        .await;
        wait_membership(&cluster, &[1, 2, 3], &[]).await;
    });
}
