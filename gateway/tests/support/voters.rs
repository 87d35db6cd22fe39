//! A real 3-voter cluster of `ursula-node` processes on loopback (the binary built next to the
//! gateway's, by the workspace build), for the tests of the gateway in front of one.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;

use super::Http;

fn node_binary() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_ursula-gateway")).with_file_name("ursula-node");
    assert!(
        path.exists(),
        "{path:?} is missing: build the workspace first (cargo build --workspace)"
    );
    path
}

/// `count` distinct loopback ports, free now and below the kernel's ephemeral port range.
///
/// Ports from `bind(0)` are ephemeral ones: once released for a voter to bind, one can be taken
/// first as the source port of another voter's outgoing connection, and that voter then
/// cannot start. Ports below the range are never handed out that way.
fn free_ports(count: usize) -> Vec<u16> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FLOOR: u32 = 10_000;
    let ceiling = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|&low| low > FLOOR + 1_000)
        .unwrap_or(32_768);
    let span = ceiling - FLOOR;
    // Each test binary starts elsewhere, so that two run at once rarely try the same ports;
    // tests of one binary share the counter, so they never do.
    let _ = NEXT.compare_exchange(
        0,
        std::process::id() % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    let ports: Vec<u16> =
        std::iter::repeat_with(|| (FLOOR + NEXT.fetch_add(1, Ordering::Relaxed) % span) as u16)
            .take(span as usize)
            .filter(|&port| TcpListener::bind(("127.0.0.1", port)).is_ok())
            .take(count)
            .collect();
    assert_eq!(ports.len(), count, "free loopback ports below {ceiling}");
    ports
}

pub struct Voters {
    _dir: tempfile::TempDir,
    configs: Vec<PathBuf>,
    pub client_ports: Vec<u16>,
    pub admin_ports: Vec<u16>,
    children: Mutex<Vec<Option<Child>>>,
}

impl Voters {
    /// Three voters with fast elections (50 ms heartbeats, 300 ms election timeout), so that
    /// the failover these tests cause takes a fraction of a second.
    pub fn start() -> Self {
        Self::start_with("", "")
    }

    /// The same, with `server` and `raft` added to each voter's `[server]` and `[raft]` tables.
    pub fn start_with(server: &str, raft: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports = free_ports(9);
        let mut peers = String::new();
        for id in 0..3 {
            peers.push_str(&format!(
                "[[raft.peers]]\nid = {}\ncluster_url = \"http://127.0.0.1:{}\"\nclient_url = \"http://127.0.0.1:{}\"\n",
                id + 1,
                ports[3 * id + 2],
                ports[3 * id]
            ));
        }
        let mut configs = Vec::new();
        for id in 0..3 {
            let config = dir.path().join(format!("node-{}.toml", id + 1));
            std::fs::write(
                &config,
                format!(
                    "node_id = {}\ndata_dir = {:?}\n[server]\nlisten = \"127.0.0.1:{}\"\nadmin_listen = \"127.0.0.1:{}\"\ncluster_listen = \"127.0.0.1:{}\"\n{server}\n[raft]\ngroup_count = 4\nheartbeat_interval = \"50ms\"\nelection_timeout = \"300ms\"\n{raft}\n[raft.wal]\nmin_available_size = 1048576\nresume_available_size = 2097152\n{peers}",
                    id + 1,
                    dir.path().join(format!("node-{}", id + 1)),
                    ports[3 * id],
                    ports[3 * id + 1],
                    ports[3 * id + 2],
                ),
            )
            .expect("config");
            configs.push(config);
        }
        let voters = Self {
            _dir: dir,
            configs,
            client_ports: (0..3).map(|i| ports[3 * i]).collect(),
            admin_ports: (0..3).map(|i| ports[3 * i + 1]).collect(),
            children: Mutex::new(vec![None, None, None]),
        };
        for i in 0..3 {
            voters.spawn(i);
        }
        voters
    }

    pub fn spawn(&self, i: usize) {
        let child = Command::new(node_binary())
            .arg("--config")
            .arg(&self.configs[i])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ursula-node");
        self.children.lock().unwrap()[i] = Some(child);
    }

    /// SIGKILL.
    pub fn kill(&self, i: usize) {
        if let Some(mut child) = self.children.lock().unwrap()[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn upstreams(&self) -> Vec<String> {
        self.client_ports
            .iter()
            .map(|port| format!("http://127.0.0.1:{port}"))
            .collect()
    }

    pub async fn wait_ready(&self, client: &Http) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for (i, port) in self.admin_ports.iter().enumerate() {
            if self.children.lock().unwrap()[i].is_none() {
                continue;
            }
            loop {
                let ready = client
                    .request("GET", &format!("http://127.0.0.1:{port}/readyz"), &[], "")
                    .await
                    .is_ok_and(|r| r.status == StatusCode::OK);
                if ready {
                    break;
                }
                assert!(Instant::now() < deadline, "voter {} is not ready", i + 1);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// The voter index that leads the group of `bucket` (group_count 4).
    pub async fn leader_of(&self, client: &Http, group: usize) -> Option<usize> {
        for (i, port) in self.admin_ports.iter().enumerate() {
            let Ok(reply) = client
                .request("GET", &format!("http://127.0.0.1:{port}/metrics"), &[], "")
                .await
            else {
                continue;
            };
            let needle = format!("ursula_group_is_leader{{group=\"{group}\"}} 1");
            if String::from_utf8_lossy(&reply.body)
                .lines()
                .any(|l| l == needle)
            {
                return Some(i);
            }
        }
        None
    }
}

impl Drop for Voters {
    fn drop(&mut self) {
        for i in 0..3 {
            self.kill(i);
        }
    }
}

/// Placement as the nodes compute it: FNV-1a of the bucket, modulo the group count.
pub fn group_of(bucket: &str, groups: u64) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bucket.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % groups) as usize
}
