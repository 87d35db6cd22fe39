//! Mutual TLS on a real 3-voter cluster's cluster listeners. A process with no certificate,
//! with one from another CA, or with a valid voter's certificate that claims to be another
//! voter, cannot append an entry, win a vote, install a snapshot or forward a purge, and the
//! cluster serves writes meanwhile. Certificate files that rotate are picked up without a
//! restart: a voter rotated to a certificate the cluster does not trust is cut off at its
//! next exchange, and rejoins when rotated back, and no acknowledged write is lost.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{SnapshotMeta, StoredMembership, Vote};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncWriteExt, BufReader};
use ursula_node::cluster::frame;
use ursula_node::cluster::peer_link::{BatchAnswer, BatchCall, CallKind};
use ursula_node::cluster::transport::{ClusterTls, FROM_HEADER, LINK_ALPN, http2_client};
use ursula_node::cluster::types::TypeConfig;
use ursula_testkit::certs::ClusterFiles;
use ursula_testkit::cluster::TestCluster;

const TEXT: (&str, &str) = ("content-type", "text/plain");

fn certificates(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A link client's TLS: it trusts the cluster's CA (so that only the listener can refuse),
/// and presents `client` (a certificate and key) if given.
fn link_config(ca: &Path, client: Option<(&Path, &Path)>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca) {
        roots.add(cert).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                certificates(cert),
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![LINK_ALPN.to_vec()];
    Arc::new(config)
}

/// One exchange on a peer link to voter `target` at `addr`, over TLS with `config` or over
/// plain TCP: the answers, or why there were none.
async fn link_exchange(
    addr: std::net::SocketAddr,
    config: Option<Arc<rustls::ClientConfig>>,
    target: u64,
    calls: &[BatchCall],
) -> Result<Vec<BatchAnswer>, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let mut stream: Box<dyn ursula_node::cluster::transport::Wire> = match config {
        Some(config) => {
            let name = ServerName::try_from(ursula_wire::identity::node_name(target)).unwrap();
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            Box::new(tls)
        }
        None => Box::new(tcp),
    };
    let payload = postcard::to_extend(calls, frame::start()).unwrap();
    let message = frame::finish(payload, 1).unwrap();
    let exchange = async {
        stream.write_all(frame::MAGIC).await?;
        frame::write(&mut stream, &message).await?;
        frame::read(&mut BufReader::new(stream), 1 << 20).await
    };
    match tokio::time::timeout(Duration::from_secs(10), exchange).await {
        Err(_) => Err("no answer within 10 s".into()),
        Ok(Err(error)) => Err(error.to_string()),
        Ok(Ok(None)) => Err("the listener closed the connection".into()),
        Ok(Ok(Some((_, answer)))) => postcard::from_bytes(&answer).map_err(|e| e.to_string()),
    }
}

/// What a voter that wanted to take over group `group` as node `as_node` would send: a vote
/// request and an empty append of a term far ahead, each of which a follower would obey.
fn takeover(group: u32, as_node: u64) -> Vec<BatchCall> {
    let term = 1_000_000;
    let vote = VoteRequest::<u64>::new(Vote::new(term, as_node), None);
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term, as_node),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    vec![
        BatchCall {
            group,
            kind: CallKind::Vote,
            body: postcard::to_allocvec(&vote).unwrap().into(),
        },
        BatchCall {
            group,
            kind: CallKind::Append,
            body: postcard::to_allocvec(&append).unwrap().into(),
        },
    ]
}

fn snapshot_from(as_node: u64) -> Vec<u8> {
    let request = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(1_000_000, as_node),
        meta: SnapshotMeta {
            last_log_id: None,
            last_membership: StoredMembership::default(),
            snapshot_id: "impostor".into(),
        },
        offset: 0,
        data: Vec::new(),
        done: true,
    };
    postcard::to_allocvec(&request).unwrap()
}

/// Appends `body` to `path` through the cluster: whether it was acknowledged.
async fn append(cluster: &TestCluster, path: &str, body: String) -> bool {
    cluster
        .send(
            0,
            Method::POST,
            path,
            &[TEXT],
            Bytes::from(body),
            Duration::from_secs(5),
        )
        .await
        .is_some_and(|reply| reply.status == StatusCode::NO_CONTENT)
}

/// Appends numbered records to `path` until `stop`; the records acknowledged.
async fn write_until(cluster: &TestCluster, path: &str, stop: &AtomicBool) -> Vec<String> {
    let mut acked = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let record = format!("r{n:06};");
        if append(cluster, path, record.clone()).await {
            acked.push(record);
        }
        n += 1;
    }
    acked
}

async fn create(cluster: &TestCluster, path: &str) {
    for (method, target) in [
        (Method::PUT, path.rsplit_once('/').unwrap().0),
        (Method::PUT, path),
    ] {
        let reply = cluster
            .send(
                0,
                method,
                target,
                &[TEXT],
                Bytes::new(),
                Duration::from_secs(20),
            )
            .await
            .expect("an answer");
        assert!(reply.status.is_success(), "{target}: {}", reply.status);
    }
}

#[test]
fn only_a_voter_with_its_own_certificate_speaks_raft() {
    let cluster = TestCluster::start(3, "");
    let other_dir = tempfile::tempdir().unwrap();
    let (other, _) = ursula_testkit::certs::write_cluster(other_dir.path(), &[1]);
    let certs = &cluster.certs;
    ursula_testkit::runtime().block_on(async {
        cluster.wait_ready().await;
        create(&cluster, "/tls/writes").await;
        let stop = AtomicBool::new(false);
        let attacks = async {
            let target = &cluster.voters[1];
            let leaders_before: Vec<_> = futures_util::future::join_all(
                (0..cluster.group_count).map(|g| cluster.leader_of(g)),
            )
            .await;
            for group in 0..cluster.group_count as u32 {
                let calls = takeover(group, 1);
                // Plain TCP: the listener speaks TLS only.
                let plain = link_exchange(target.cluster_addr, None, 2, &calls).await;
                assert!(plain.is_err(), "plain TCP got answers: {plain:?}");
                // TLS without a certificate.
                let config = link_config(&certs.ca_file(), None);
                let anonymous = link_exchange(target.cluster_addr, Some(config), 2, &calls).await;
                assert!(
                    anonymous.is_err(),
                    "no certificate got answers: {anonymous:?}"
                );
                // A certificate for node 1, from another CA.
                let foreign = (other.cert_file(1), other.key_file(1));
                let config = link_config(&certs.ca_file(), Some((&foreign.0, &foreign.1)));
                let stranger = link_exchange(target.cluster_addr, Some(config), 2, &calls).await;
                assert!(
                    stranger.is_err(),
                    "another CA's certificate got answers: {stranger:?}"
                );
                // Node 3's own certificate, claiming to be node 1: the listener answers, and
                // refuses each call.
                let own = (certs.cert_file(3), certs.key_file(3));
                let config = link_config(&certs.ca_file(), Some((&own.0, &own.1)));
                let answers = link_exchange(target.cluster_addr, Some(config), 2, &calls)
                    .await
                    .expect("a voter's certificate is let in");
                assert_eq!(answers.len(), 2);
                for answer in answers {
                    let refusal = answer.expect_err("a call claiming node 1 is refused");
                    assert!(
                        refusal.contains("403") && refusal.contains("not node 1's"),
                        "{refusal}"
                    );
                }
            }
            // Snapshots and purges come over HTTP/2; node 3's certificate again.
            let node3 = ClusterTls::open(
                ursula_tls::TlsFiles {
                    ca_file: Some(certs.ca_file()),
                    cert_file: certs.cert_file(3),
                    key_file: certs.key_file(3),
                },
                3,
            )
            .unwrap();
            let authority = target.cluster_addr.to_string();
            let at = authority.clone();
            let client = http2_client(Some(&node3), move |a| (a == at).then_some(2)).unwrap();
            for (route, from, body) in [
                ("snapshot", "3", snapshot_from(1)),
                ("purge", "1", b"tls".to_vec()),
                ("purge", "", b"tls".to_vec()),
            ] {
                let mut request =
                    http::Request::post(format!("https://{authority}/raft/0/{route}"));
                if !from.is_empty() {
                    request = request.header(FROM_HEADER, from);
                }
                let reply = client
                    .request(request.body(Full::new(Bytes::from(body))).unwrap())
                    .await
                    .expect("the listener answers a voter");
                let status = reply.status();
                let text = reply.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(
                    status,
                    StatusCode::FORBIDDEN,
                    "{route} from {from:?}: {}",
                    String::from_utf8_lossy(&text)
                );
            }
            let leaders_after: Vec<_> = futures_util::future::join_all(
                (0..cluster.group_count).map(|g| cluster.leader_of(g)),
            )
            .await;
            assert_eq!(
                leaders_before, leaders_after,
                "an impostor moved a leadership"
            );
            stop.store(true, Ordering::Relaxed);
        };
        let (acked, ()) = tokio::join!(write_until(&cluster, "/tls/writes", &stop), attacks);
        assert!(
            acked.len() >= 10,
            "only {} writes acknowledged",
            acked.len()
        );
        let text = String::from_utf8(cluster.read_all("/tls/writes").await).unwrap();
        for record in &acked {
            assert!(
                text.contains(record.as_str()),
                "{record} was acknowledged and is gone"
            );
        }
        // The purge that was refused did not happen: the bucket still takes writes.
        assert!(append(&cluster, "/tls/writes", "after".into()).await);
    });
    let refused = cluster.log_of(1);
    assert!(
        refused.contains("refused a cluster connection"),
        "voter 2 did not log the refused handshakes"
    );
}

/// Waits until voter `i` has logged `count` rotations.
fn wait_rotations(cluster: &TestCluster, i: usize, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster.log_of(i).matches("TLS files rotated").count() < count {
        assert!(
            Instant::now() < deadline,
            "voter {} did not pick up its new TLS files",
            i + 1
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Node 3's files now hold `source`'s certificate and key for node 3.
fn copy_node_files(from: &ClusterFiles, to: &ClusterFiles, id: u64) {
    // The key first, as a careless rotation might: node 3 keeps its loaded pair until the
    // certificate that matches the new key is there too.
    std::fs::copy(from.key_file(id), to.key_file(id)).unwrap();
    std::fs::copy(from.cert_file(id), to.cert_file(id)).unwrap();
}

#[test]
fn rotated_certificates_take_effect_without_a_restart_and_lose_no_write() {
    let cluster = TestCluster::start(3, "");
    let spare = tempfile::tempdir().unwrap();
    // Node 3's current pair, kept to rotate back to; and a pair from a CA nobody trusts.
    let trusted = ClusterFiles {
        dir: spare.path().join("trusted"),
    };
    std::fs::create_dir_all(&trusted.dir).unwrap();
    copy_node_files(&cluster.certs, &trusted, 3);
    let (untrusted, _) =
        ursula_testkit::certs::write_cluster(&spare.path().join("untrusted"), &[3]);
    ursula_testkit::runtime().block_on(async {
        cluster.wait_ready().await;
        create(&cluster, "/rotate/writes").await;
        let stop = AtomicBool::new(false);
        let rotations = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            // Every voter gets a new certificate from the same CA.
            for id in 1..=3 {
                cluster
                    .certs
                    .write_node(
                        &cluster.authority,
                        id,
                        &[],
                        ursula_testkit::certs::VALID_FOR,
                    )
                    .unwrap();
            }
            for i in 0..3 {
                tokio::task::block_in_place(|| wait_rotations(&cluster, i, 1));
            }
            assert!(append(&cluster, "/rotate/writes", "rotated;".into()).await);
            // Node 3 rotates to a certificate from a CA the others do not trust: its next
            // connections are refused, and the others keep their quorum.
            copy_node_files(&untrusted, &cluster.certs, 3);
            tokio::task::block_in_place(|| wait_rotations(&cluster, 2, 2));
            let deadline = Instant::now() + Duration::from_secs(20);
            while !(cluster.log_of(0) + &cluster.log_of(1)).contains("refused a cluster connection")
            {
                assert!(
                    Instant::now() < deadline,
                    "node 3's untrusted certificate was not refused:\n{}\n{}\n{}",
                    cluster.log_of(0),
                    cluster.log_of(1),
                    cluster.log_of(2)
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(append(&cluster, "/rotate/writes", "without-3;".into()).await);
            // Back to a certificate the cluster trusts: node 3 rejoins and catches up.
            copy_node_files(&trusted, &cluster.certs, 3);
            tokio::task::block_in_place(|| wait_rotations(&cluster, 2, 3));
            tokio::time::sleep(Duration::from_millis(500)).await;
            stop.store(true, Ordering::Relaxed);
        };
        let (acked, ()) = tokio::join!(write_until(&cluster, "/rotate/writes", &stop), rotations);
        assert!(
            acked.len() >= 10,
            "only {} writes acknowledged",
            acked.len()
        );
        let bytes = cluster.read_all("/rotate/writes").await;
        let text = String::from_utf8(bytes.clone()).unwrap();
        for record in acked
            .iter()
            .map(String::as_str)
            .chain(["rotated;", "without-3;"])
        {
            assert!(
                text.contains(record),
                "{record} was acknowledged and is gone"
            );
        }
        // Node 3 holds every write again, the ones made while it was cut off too.
        cluster
            .wait_replicas_equal("rotate", "writes", &bytes)
            .await;
    });
}

/// The first flight of a real TLS client to voter `target`: its ClientHello record.
fn client_hello(ca: &Path, target: u64) -> Vec<u8> {
    let name = ServerName::try_from(ursula_wire::identity::node_name(target)).unwrap();
    let mut connection =
        rustls::ClientConnection::new(link_config(ca, None), name.to_owned()).unwrap();
    let mut hello = Vec::new();
    connection.write_tls(&mut hello).unwrap();
    hello
}

/// Sends `bytes`, closes the sending half, and answers whether the listener then ended the
/// connection within 5 s (with or without an alert first).
async fn ends_after(addr: std::net::SocketAddr, bytes: &[u8]) -> bool {
    use tokio::io::AsyncReadExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(bytes).await;
    let _ = stream.shutdown().await;
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut sink))
        .await
        .is_ok()
}

#[test]
fn bad_handshakes_end_cleanly_and_the_cluster_serves_on() {
    let cluster = TestCluster::start(3, "");
    let ca = cluster.certs.ca_file();
    ursula_testkit::runtime().block_on(async {
        cluster.wait_ready().await;
        create(&cluster, "/fuzz/writes").await;
        let hello = client_hello(&ca, 2);
        let addr = cluster.voters[1].cluster_addr;
        // A connection that sends half a ClientHello and then nothing: it must not hold up
        // the listener meanwhile.
        let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
        stalled.write_all(&hello[..hello.len() / 2]).await.unwrap();
        let mut garbage = vec![0u8; 4096];
        for (i, byte) in garbage.iter_mut().enumerate() {
            *byte = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3];
        }
        let inputs: Vec<(&str, Vec<u8>)> = vec![
            ("nothing", Vec::new()),
            ("garbage", garbage),
            ("a truncated ClientHello", hello[..hello.len() / 2].to_vec()),
            (
                "a ClientHello cut after its record header",
                hello[..5].to_vec(),
            ),
            (
                "a record header that promises 16 KiB",
                vec![0x16, 0x03, 0x01, 0x40, 0x00],
            ),
            ("a plain peer link", frame::MAGIC.to_vec()),
            (
                "HTTP/1.1",
                b"GET /raft/0/vote HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            ),
            (
                "the HTTP/2 preface",
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
            ),
            ("a whole ClientHello, then silence", hello.clone()),
        ];
        for (what, bytes) in &inputs {
            assert!(ends_after(addr, bytes).await, "{what}: the connection hung");
        }
        for (what, bytes) in &inputs {
            assert!(
                append(&cluster, "/fuzz/writes", format!("after {what};")).await,
                "no write after {what}"
            );
            let _ = bytes;
        }
        drop(stalled);
    });
    for (i, voter) in cluster.voters.iter().enumerate() {
        assert!(voter.is_running(), "voter {} exited", i + 1);
        assert!(
            !cluster.log_of(i).contains("panicked"),
            "voter {} panicked",
            i + 1
        );
    }
}
