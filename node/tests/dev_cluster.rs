//! `ursula-node dev-cluster` as a user runs it: three voter processes that run the way
//! production does, with a CA and certificates it issued for their mutual TLS and an admin
//! token, all in its data directory, readable by their owner only where they are secret.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};

#[test]
fn a_dev_cluster_runs_with_its_own_certificates_and_admin_token() {
    let dir = tempfile::tempdir().unwrap();
    // Voters at base, base+10, base+20 (client, admin, cluster: +0, +1, +2); no gateway
    // binary sits next to a test's node binary, so none starts.
    // Below the kernel's ephemeral range, where other tests' outgoing connections take ports.
    let base = 12_000 + (std::process::id() % 1_500) as u16 * 10;
    let log = std::fs::File::create(dir.path().join("dev-cluster.log")).unwrap();
    let mut child = Command::new(ursula_testkit::binaries::node())
        .args([
            "dev-cluster",
            "--voters",
            "3",
            "--base-port",
            &base.to_string(),
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("dev-cluster");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let printed: Vec<String> = stdout
        .lines()
        .map_while(Result::ok)
        .take_while(|line| !line.starts_with("cluster TLS"))
        .collect();
    assert!(
        printed.iter().any(|line| line.contains("admin token")),
        "{printed:?}"
    );

    let tls = dir.path().join("tls");
    for file in ["ca.pem", "node-1.pem", "node-2.pem", "node-3.pem"] {
        assert!(tls.join(file).exists(), "{file}");
    }
    for secret in [
        tls.join("ca.key"),
        tls.join("node-1.key"),
        dir.path().join("admin-token"),
    ] {
        let mode = std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", secret.display());
    }
    let config = std::fs::read_to_string(dir.path().join("node-1.toml")).unwrap();
    assert!(config.contains("cluster_tls"), "{config}");
    assert!(config.contains("cluster_url = \"https://"), "{config}");

    ursula_testkit::runtime().block_on(async {
        let voter = |i: u16| ursula_testkit::Client::new(([127, 0, 0, 1], base + 10 * i).into());
        let admin = ursula_testkit::Client::new(([127, 0, 0, 1], base + 1).into());
        // Writes replicate over the voters' TLS. Each goes to the voter that leads its
        // group: the one that does not redirect.
        let at_leader = async |method: Method, path: &str, body: &'static str| {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                for i in 0..3 {
                    let headers = [("content-type", "text/plain")];
                    let reply = voter(i)
                        .try_send(
                            method.clone(),
                            path,
                            &headers,
                            bytes::Bytes::from_static(body.as_bytes()),
                        )
                        .await;
                    if let Ok(reply) = reply
                        && reply.status != StatusCode::TEMPORARY_REDIRECT
                        && reply.status != StatusCode::SERVICE_UNAVAILABLE
                    {
                        return reply;
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "no voter led {path}; the voters' log:\n{}",
                    std::fs::read_to_string(dir.path().join("dev-cluster.log")).unwrap_or_default()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        assert!(at_leader(Method::PUT, "/dev", "").await.status.is_success());
        assert_eq!(
            at_leader(Method::PUT, "/dev/s", "").await.status,
            StatusCode::CREATED
        );
        let appended = at_leader(Method::POST, "/dev/s", "over TLS").await;
        assert_eq!(appended.status, StatusCode::NO_CONTENT);
        let read = at_leader(Method::GET, "/dev/s?offset=-1", "").await;
        assert_eq!(read.text(), "over TLS");
        // The admin routes ask for the token it wrote.
        let refused = admin.send(Method::POST, "/admin/drain", &[], "").await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
        let token = std::fs::read_to_string(dir.path().join("admin-token")).unwrap();
        let bearer = format!("Bearer {}", token.trim());
        let drained = admin
            .send(
                Method::DELETE,
                "/admin/drain",
                &[("authorization", &bearer)],
                "",
            )
            .await;
        assert!(drained.status.is_success(), "{}", drained.status);
    });
    // SAFETY: signalling the child this test started.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}
