//! A cluster of real `ursula-node` voter processes on loopback, and a client that finds each
//! group's leader the way a user's client does: by following 307s, and by trying another node
//! when one does not answer.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};

use super::{Client, Reply};

pub struct Voter {
    pub id: u64,
    pub client_port: u16,
    pub admin_port: u16,
    config: PathBuf,
    pub log: PathBuf,
    child: parking_lot::Mutex<Option<Child>>,
}

impl Voter {
    pub fn client(&self) -> Client {
        Client::new(([127, 0, 0, 1], self.client_port).into())
    }

    pub fn admin(&self) -> Client {
        Client::new(([127, 0, 0, 1], self.admin_port).into())
    }

    pub fn is_running(&self) -> bool {
        self.child.lock().is_some()
    }

    fn pid(&self) -> Option<libc::pid_t> {
        self.child
            .lock()
            .as_ref()
            .map(|child| child.id() as libc::pid_t)
    }
}

pub struct TestCluster {
    pub dir: tempfile::TempDir,
    pub voters: Vec<Voter>,
    pub group_count: usize,
}

fn free_ports(count: usize) -> Vec<u16> {
    // Held together so that no two are the same; released just before the nodes bind them.
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

impl TestCluster {
    /// Starts `n` voters with fast elections; `raft_extra` is added to each `[raft]` table.
    pub fn start(n: usize, raft_extra: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports = free_ports(3 * n);
        let group_count = 4;
        let mut peers = String::new();
        for id in 0..n {
            peers.push_str(&format!(
                "[[raft.peers]]\nid = {}\ncluster_url = \"http://127.0.0.1:{}\"\nclient_url = \"http://127.0.0.1:{}\"\n",
                id + 1,
                ports[3 * id + 2],
                ports[3 * id],
            ));
        }
        let mut voters = Vec::new();
        for id in 0..n {
            let data = dir.path().join(format!("node-{}", id + 1));
            std::fs::create_dir_all(&data).expect("data dir");
            let config = dir.path().join(format!("node-{}.toml", id + 1));
            let text = format!(
                "node_id = {}\ndata_dir = {:?}\n[server]\nlisten = \"127.0.0.1:{}\"\nadmin_listen = \"127.0.0.1:{}\"\ncluster_listen = \"127.0.0.1:{}\"\nlong_poll_timeout = \"300ms\"\n[raft]\ngroup_count = {group_count}\nheartbeat_interval = \"50ms\"\nelection_timeout = \"300ms\"\n{raft_extra}\n[raft.wal]\nmin_available_size = 1048576\nresume_available_size = 2097152\n{peers}",
                id + 1,
                data,
                ports[3 * id],
                ports[3 * id + 1],
                ports[3 * id + 2],
            );
            std::fs::write(&config, text).expect("config");
            voters.push(Voter {
                id: id as u64 + 1,
                client_port: ports[3 * id],
                admin_port: ports[3 * id + 1],
                log: dir.path().join(format!("node-{}.log", id + 1)),
                config,
                child: parking_lot::Mutex::new(None),
            });
        }
        let cluster = Self {
            dir,
            voters,
            group_count,
        };
        for i in 0..n {
            cluster.spawn(i);
        }
        cluster
    }

    fn spawn(&self, i: usize) {
        let voter = &self.voters[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&voter.log)
            .expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_ursula-node"))
            .arg("--config")
            .arg(&voter.config)
            .env("RUST_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn ursula-node");
        *voter.child.lock() = Some(child);
        // Serving once the client port answers.
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", voter.client_port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "voter {} did not start",
                voter.id
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill(&self, i: usize) {
        let child = self.voters[i].child.lock().take();
        if let Some(mut child) = child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn restart(&self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }

    /// SIGSTOP: the process stops answering anyone, as if cut off the network, and keeps its
    /// state. `thaw` (SIGCONT) reconnects it.
    pub fn freeze(&self, i: usize) {
        if let Some(pid) = self.voters[i].pid() {
            // SAFETY: a signal to a child process this test started.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
        }
    }

    pub fn thaw(&self, i: usize) {
        if let Some(pid) = self.voters[i].pid() {
            // SAFETY: as in `freeze`.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    }

    pub fn group_of(&self, bucket: &str) -> usize {
        ursula_node::cluster::placement::group_of(bucket, self.group_count)
    }

    /// The voter index that leads `group`, as the running voters report it.
    pub async fn leader_of(&self, group: usize) -> Option<usize> {
        for voter in self.voters.iter().filter(|v| v.is_running()) {
            let Ok(reply) = voter
                .admin()
                .try_send(Method::GET, "/metrics", &[], Bytes::new())
                .await
            else {
                continue;
            };
            let needle = format!("ursula_group_is_leader{{group=\"{group}\"}} 1");
            if reply.text().lines().any(|line| line == needle) {
                return Some((voter.id - 1) as usize);
            }
        }
        None
    }

    /// Waits until every running voter is ready (knows every group's leader, applied its log).
    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for voter in self.voters.iter().filter(|v| v.is_running()) {
            loop {
                let ready = voter
                    .admin()
                    .try_send(Method::GET, "/readyz", &[], Bytes::new())
                    .await
                    .is_ok_and(|r| r.status == StatusCode::OK);
                if ready {
                    break;
                }
                assert!(Instant::now() < deadline, "voter {} is not ready", voter.id);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Sends a request the way a client of the cluster does: starting at voter `first`,
    /// following 307s to the leader, and moving to the next voter when one does not answer or
    /// knows no leader, for up to `patience`. Returns the last answer, if any.
    pub async fn send(
        &self,
        first: usize,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
        patience: Duration,
    ) -> Option<Reply> {
        let deadline = Instant::now() + patience;
        let mut at = first % self.voters.len();
        let mut last = None;
        while Instant::now() < deadline {
            let client = self.voters[at].client();
            let attempt = tokio::time::timeout(
                Duration::from_secs(2),
                client.try_send(method.clone(), path, headers, body.clone()),
            )
            .await;
            match attempt {
                Ok(Ok(reply)) if reply.status == StatusCode::TEMPORARY_REDIRECT => {
                    let leader: usize = reply
                        .header("x-ursula-leader-id")
                        .and_then(|id| id.parse().ok())
                        .expect("a redirect names the leader");
                    at = leader - 1;
                    last = Some(reply);
                }
                Ok(Ok(reply)) if reply.status == StatusCode::SERVICE_UNAVAILABLE => {
                    last = Some(reply);
                    at = (at + 1) % self.voters.len();
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                Ok(Ok(reply)) => return Some(reply),
                Ok(Err(_)) | Err(_) => {
                    at = (at + 1) % self.voters.len();
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
            }
        }
        last
    }

    /// Reads a whole stream from its leader.
    pub async fn read_all(&self, path: &str) -> Vec<u8> {
        let mut offset = "-1".to_owned();
        let mut out = Vec::new();
        loop {
            let reply = self
                .send(
                    0,
                    Method::GET,
                    &format!("{path}?offset={offset}"),
                    &[],
                    Bytes::new(),
                    Duration::from_secs(20),
                )
                .await
                .expect("a leader answers the read");
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
            out.extend_from_slice(&reply.body);
            offset = reply
                .header("stream-next-offset")
                .expect("next offset")
                .to_owned();
            if reply.header("stream-up-to-date") == Some("true") {
                return out;
            }
        }
    }

    /// Waits until every running voter's own copy of the stream is the given bytes (its
    /// `/admin/replica` digest), and returns how long that took.
    pub async fn wait_replicas_equal(&self, bucket: &str, stream: &str, bytes: &[u8]) {
        use sha2::Digest;
        let expected = format!("{:x}", sha2::Sha256::digest(bytes));
        let deadline = Instant::now() + Duration::from_secs(20);
        for voter in self.voters.iter().filter(|v| v.is_running()) {
            loop {
                let reply = voter
                    .admin()
                    .try_send(
                        Method::GET,
                        &format!("/admin/replica/{bucket}/{stream}"),
                        &[],
                        Bytes::new(),
                    )
                    .await;
                let digest = reply.ok().and_then(|r| {
                    serde_json::from_slice::<serde_json::Value>(&r.body)
                        .ok()
                        .and_then(|v| v["sha256"].as_str().map(str::to_owned))
                });
                if digest.as_deref() == Some(expected.as_str()) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "voter {}'s copy of {bucket}/{stream} differs: {digest:?}, expected {expected}",
                    voter.id
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    pub fn log_of(&self, i: usize) -> String {
        let file = std::fs::File::open(&self.voters[i].log).expect("log");
        BufReader::new(file)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for i in 0..self.voters.len() {
            self.thaw(i);
            self.kill(i);
        }
    }
}
