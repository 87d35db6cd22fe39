//! A cluster of real `ursula-node` voter processes on loopback, and a client that finds each
//! group's leader the way a user's client does: by following 307s, and by trying another node
//! when one does not answer.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::certs::{Authority, ClusterFiles};
use crate::netns::{Link, Network};
use crate::ports::free_ports;
use crate::{Client, Reply};

pub struct Voter {
    pub id: u64,
    /// The address of its client and admin listeners.
    pub ip: Ipv4Addr,
    /// The network namespace it runs in, on a test `Network`.
    netns: Option<String>,
    pub client_port: u16,
    pub admin_port: u16,
    /// Where its cluster listener is.
    pub cluster_addr: std::net::SocketAddr,
    config: PathBuf,
    pub log: PathBuf,
    env: Vec<(String, String)>,
    child: parking_lot::Mutex<Option<Child>>,
}

impl Voter {
    pub fn client(&self) -> Client {
        Client::new((self.ip, self.client_port).into())
    }

    pub fn admin(&self) -> Client {
        Client::new((self.ip, self.admin_port).into())
    }

    pub fn is_running(&self) -> bool {
        self.child.lock().is_some()
    }

    /// Its resident memory (`VmRSS`), while it runs.
    pub fn rss_kib(&self) -> Option<u64> {
        rss_kib(self.pid()? as u32)
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
    /// The voters' mutual TLS on the cluster listener, as production runs it: a CA, and a
    /// certificate for each voter that names its node ID.
    pub certs: ClusterFiles,
    /// The CA that signed them, to issue more (a rotation, an impostor).
    pub authority: Authority,
    pub voters: Vec<Voter>,
    pub group_count: usize,
    /// Dropped after the voters are killed (fields drop after `Drop::drop`).
    pub network: Option<Network>,
}

/// The resident memory (`VmRSS`) of process `pid`.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The cluster URL every voter is given for voter `i`, whose cluster listener is at the
/// address passed.
pub type Advertise = Box<dyn Fn(usize, SocketAddr) -> SocketAddr>;
/// Called with voter `i`'s empty data directory before it first starts.
pub type PrepareData = Box<dyn Fn(usize, &Path)>;
/// Environment variables voter `i` runs with, at every start.
pub type Environment = Box<dyn Fn(usize) -> Vec<(String, String)>>;

/// What a fault campaign changes in a cluster's layout; the default is the tests' layout.
#[derive(Default)]
pub struct Layout {
    /// A fault-injecting relay in front of each voter's cluster listener, say.
    pub advertise: Option<Advertise>,
    /// To mount a small disk there, say.
    pub prepare_data: Option<PrepareData>,
    /// A fake clock, say.
    pub environment: Option<Environment>,
}

/// Whether the voters run as on a slow machine: each in a CPU cgroup of its own, with a slow
/// disk (`e2e/slow/exec.sh`, with its settings from the environment). `.ci/run` runs the
/// cluster fault tests this way too.
pub fn slow_machine() -> bool {
    std::env::var_os("URSULA_TEST_SLOW").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The `[server]` key of a voter's TLS files; they are read again every 250 ms, so that the
/// tests of rotations do not wait long.
fn tls_key(certs: &ClusterFiles, id: u64) -> String {
    format!(
        "cluster_tls = {{ ca_file = {:?}, cert_file = {:?}, key_file = {:?}, reload_interval = \"250ms\" }}\n",
        certs.ca_file(),
        certs.cert_file(id),
        certs.key_file(id)
    )
}

/// The last lines of a voter's log, for a failure message.
fn log_tail(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

impl TestCluster {
    /// Starts `n` voters with fast elections; `raft_extra` is added to each `[raft]` table.
    pub fn start(n: usize, raft_extra: &str) -> Self {
        Self::start_on(None, n, 0, "", raft_extra, Layout::default())
    }

    /// Starts `n` voters laid out as `layout` says, each in its own namespace of `network` if
    /// there is one.
    pub fn start_laid_out(network: Option<Network>, n: usize, layout: Layout) -> Self {
        Self::start_on(network, n, 0, "", "", layout)
    }

    /// Starts `n` voters, with room for `spare` more (IDs `n + 1` and up): their configs join
    /// the cluster (`raft.join`) and list every voter, but they start only with
    /// `start_spare`, to be added through the admin API's membership routes.
    pub fn start_growable(n: usize, spare: usize, raft_extra: &str) -> Self {
        Self::start_on(None, n, spare, "", raft_extra, Layout::default())
    }

    /// The same, with `server_extra` added to each `[server]` table.
    pub fn start_with(n: usize, server_extra: &str, raft_extra: &str) -> Self {
        Self::start_on(None, n, 0, server_extra, raft_extra, Layout::default())
    }

    /// Starts `n` voters, each in its own namespace of `network`, on the contract's ports.
    pub fn start_partitionable(network: Network, n: usize, raft_extra: &str) -> Self {
        Self::start_on(Some(network), n, 0, "", raft_extra, Layout::default())
    }

    fn start_on(
        network: Option<Network>,
        seed: usize,
        spare: usize,
        server_extra: &str,
        raft_extra: &str,
        layout: Layout,
    ) -> Self {
        let n = seed + spare;
        let dir = tempfile::tempdir().expect("tempdir");
        // (client ip, cluster ip, client, admin and cluster ports) of each voter.
        let addresses: Vec<(Ipv4Addr, Ipv4Addr, [u16; 3])> = match &network {
            Some(network) => (0..n)
                .map(|i| {
                    (
                        network.client_ips[i],
                        network.cluster_ips[i],
                        [4437, 4438, 4439],
                    )
                })
                .collect(),
            None => free_ports(3 * n)
                .chunks(3)
                .map(|p| (Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, [p[0], p[1], p[2]]))
                .collect(),
        };
        let group_count = 4;
        // Fast elections make each failover of these tests take well under a second. On a slow
        // machine (`URSULA_TEST_SLOW`) they would flap, as they would in production: there the
        // voters keep the product's defaults, as users on such machines do.
        let timeouts = if slow_machine() {
            ""
        } else {
            "heartbeat_interval = \"50ms\"\nelection_timeout = \"300ms\"\n"
        };
        let ids: Vec<u64> = (1..=n as u64).collect();
        let (certs, authority) = crate::certs::write_cluster(&dir.path().join("tls"), &ids);
        // Every voter signs webhooks and wake tokens with one key, as in production.
        let signing_key = dir.path().join("signing-key.pem");
        let made = std::process::Command::new(crate::binaries::node())
            .arg("signing-key")
            .arg("--out")
            .arg(&signing_key)
            .output()
            .expect("run ursula-node signing-key");
        assert!(made.status.success(), "ursula-node signing-key: {made:?}");
        let (mut peers, mut seed_peers) = (String::new(), String::new());
        for (id, &(client_ip, cluster_ip, ports)) in addresses.iter().enumerate() {
            if id == seed {
                seed_peers = peers.clone();
            }
            let listens: SocketAddr = (cluster_ip, ports[2]).into();
            let cluster_addr = layout
                .advertise
                .as_ref()
                .map_or(listens, |advertise| advertise(id, listens));
            peers.push_str(&format!(
                "[[raft.peers]]\nid = {}\ncluster_url = \"https://{cluster_addr}\"\nclient_url = \"http://{client_ip}:{}\"\n",
                id + 1,
                ports[0],
            ));
        }
        if spare == 0 {
            seed_peers = peers.clone();
        }
        let mut voters = Vec::new();
        for (id, &(client_ip, cluster_ip, ports)) in addresses.iter().enumerate() {
            let (join, peers) = if id < seed {
                ("", &seed_peers)
            } else {
                ("join = true\n", &peers)
            };
            let data = dir.path().join(format!("node-{}", id + 1));
            std::fs::create_dir_all(&data).expect("data dir");
            if let Some(prepare) = &layout.prepare_data {
                prepare(id, &data);
            }
            let config = dir.path().join(format!("node-{}.toml", id + 1));
            let text = format!(
                "node_id = {}\ndata_dir = {:?}\n[server]\nlisten = \"{client_ip}:{}\"\nadmin_listen = \"{client_ip}:{}\"\ncluster_listen = \"{cluster_ip}:{}\"\nlong_poll_timeout = \"300ms\"\n{}{server_extra}\n[raft]\ngroup_count = {group_count}\n{join}{timeouts}{raft_extra}\n[raft.wal]\nmin_available_size = 1048576\nresume_available_size = 2097152\n[subscriptions]\nsigning_key_file = {signing_key:?}\nallow_loopback_webhooks = true\n{peers}",
                id + 1,
                data,
                ports[0],
                ports[1],
                ports[2],
                tls_key(&certs, id as u64 + 1),
            );
            std::fs::write(&config, text).expect("config");
            voters.push(Voter {
                id: id as u64 + 1,
                ip: client_ip,
                netns: network.as_ref().map(|network| network.namespace(id)),
                client_port: ports[0],
                admin_port: ports[1],
                cluster_addr: (cluster_ip, ports[2]).into(),
                log: dir.path().join(format!("node-{}.log", id + 1)),
                config,
                env: layout
                    .environment
                    .as_ref()
                    .map_or_else(Vec::new, |environment| environment(id)),
                child: parking_lot::Mutex::new(None),
            });
        }
        let cluster = Self {
            dir,
            certs,
            authority,
            voters,
            group_count,
            network,
        };
        for i in 0..seed {
            cluster.spawn(i);
        }
        cluster
    }

    /// Starts spare voter `i` (see `start_growable`).
    pub fn start_spare(&self, i: usize) {
        self.spawn(i);
    }

    /// Voter `i` loses its volume: SIGKILL, its data directory emptied, and its config set to
    /// join the cluster, as a pod on a new volume would be. Not started again.
    pub fn wipe(&self, i: usize) {
        self.kill(i);
        let voter = &self.voters[i];
        // Emptied, not removed: it may be a disk of its own mounted there.
        for entry in std::fs::read_dir(self.data_dir(i)).expect("the data dir") {
            let path = entry.expect("a data dir entry").path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path).expect("remove from the data dir");
            } else {
                std::fs::remove_file(&path).expect("remove from the data dir");
            }
        }
        let config = std::fs::read_to_string(&voter.config).expect("config");
        if !config.contains("join = true") {
            let config = config.replacen("[raft]\n", "[raft]\njoin = true\n", 1);
            std::fs::write(&voter.config, config).expect("config");
        }
    }

    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("node-{}", self.voters[i].id))
    }

    /// Voter `i`'s admin API, with a JSON body or none: the answer's status and JSON.
    pub async fn admin_call(
        &self,
        i: usize,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (StatusCode, serde_json::Value) {
        let body = body.map_or_else(Bytes::new, |v| Bytes::from(v.to_string()));
        let headers: &[(&str, &str)] = &[("content-type", "application/json")];
        match self.voters[i]
            .admin()
            .try_send(method, path, headers, body)
            .await
        {
            Ok(reply) => (
                reply.status,
                serde_json::from_slice(&reply.body).unwrap_or(serde_json::Value::Null),
            ),
            Err(error) => (
                StatusCode::BAD_GATEWAY,
                serde_json::json!({ "error": error }),
            ),
        }
    }

    /// Every group as its leader reports it (`GET /admin/membership` of each running voter).
    pub async fn membership(&self) -> Vec<ursula_wire::admin::GroupMembership> {
        let mut reports = Vec::new();
        for (i, voter) in self.voters.iter().enumerate() {
            if !voter.is_running() {
                continue;
            }
            let (status, body) = self
                .admin_call(i, Method::GET, "/admin/membership", None)
                .await;
            if status == StatusCode::OK
                && let Ok(report) = serde_json::from_value(body)
            {
                reports.push(report);
            }
        }
        ursula_wire::admin::MembershipReport::leaders_view(&reports)
    }

    /// Waits, up to `within`, until every group's leader reports exactly `voters` and
    /// `learners` (node IDs), no change in progress, and every learner at most `max_lag`
    /// entries behind; else says what the groups report.
    pub async fn settle_membership(
        &self,
        voters: &[u64],
        learners: &[u64],
        max_lag: u64,
        within: Duration,
    ) -> Result<(), String> {
        let voters: BTreeSet<u64> = voters.iter().copied().collect();
        let learners: BTreeSet<u64> = learners.iter().copied().collect();
        let deadline = Instant::now() + within;
        loop {
            let groups = self.membership().await;
            let settled = groups.len() == self.group_count
                && groups.iter().all(|group| {
                    !group.joint
                        && group.voters.iter().copied().collect::<BTreeSet<_>>() == voters
                        && group.learners.iter().copied().collect::<BTreeSet<_>>() == learners
                        && learners
                            .iter()
                            .all(|id| group.lag.get(id).is_some_and(|lag| *lag <= max_lag))
                });
            if settled {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the groups did not settle on voters {voters:?} and learners {learners:?} in {within:?}: {groups:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn spawn(&self, i: usize) {
        let voter = &self.voters[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&voter.log)
            .expect("log file");
        // `ip netns exec` and the slow-machine wrapper exec what follows them: the child is the
        // node itself.
        let mut words: Vec<std::ffi::OsString> = Vec::new();
        if slow_machine() {
            let wrapper = concat!(env!("CARGO_MANIFEST_DIR"), "/../slow/exec.sh");
            let cgroup = format!("test-{}-{}", std::process::id(), voter.client_port);
            words.extend([wrapper.into(), cgroup.into()]);
        }
        if let Some(ns) = &voter.netns {
            words.extend(["ip".into(), "netns".into(), "exec".into(), ns.into()]);
        }
        words.push(crate::binaries::node().into());
        let mut command = Command::new(&words[0]);
        let child = command
            .args(&words[1..])
            .arg("--config")
            .arg(&voter.config)
            // The product's own log filter.
            .env_remove("RUST_LOG")
            .envs(voter.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn ursula-node");
        *voter.child.lock() = Some(child);
        // Serving once the client port answers.
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect((voter.ip, voter.client_port)).is_err() {
            let exited = voter
                .child
                .lock()
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "voter {} did not start ({}); its log ends:\n{}",
                voter.id,
                exited.map_or("still running".to_string(), |status| status.to_string()),
                log_tail(&voter.log),
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

    /// SIGTERM, as Kubernetes stops a pod: the node shuts down in order; SIGKILL if it has
    /// not exited after `grace`. How it exited, if by itself.
    pub fn stop(&self, i: usize, grace: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.voters[i].child.lock().take()?;
        // SAFETY: a signal to a child process this test started.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait().ok().flatten() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Whether voter `i`'s process exited by itself (it is then reaped, and not running).
    pub fn exited(&self, i: usize) -> Option<std::process::ExitStatus> {
        let mut child = self.voters[i].child.lock();
        let status = child.as_mut()?.try_wait().ok().flatten()?;
        *child = None;
        Some(status)
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

    /// Cuts voter `i` off the cluster network, or off both networks (`clients_too`): a real
    /// partition on the test's `Network`.
    pub fn partition(&self, i: usize, clients_too: bool) {
        let network = self
            .network
            .as_ref()
            .expect("started with start_partitionable");
        network.cut(i, Link::Cluster);
        if clients_too {
            network.cut(i, Link::Client);
        }
    }

    pub fn heal(&self, i: usize) {
        let network = self
            .network
            .as_ref()
            .expect("started with start_partitionable");
        network.reconnect(i, Link::Cluster);
        network.reconnect(i, Link::Client);
    }

    pub fn group_of(&self, bucket: &str) -> usize {
        crate::group_of(bucket, self.group_count)
    }

    /// The voters' client URLs, as a gateway's `--upstream`s.
    pub fn upstreams(&self) -> Vec<String> {
        self.voters
            .iter()
            .map(|voter| format!("http://{}:{}", voter.ip, voter.client_port))
            .collect()
    }

    /// Voter `i`'s Prometheus metrics, if it answers.
    async fn metrics(&self, i: usize) -> Option<String> {
        let reply = self.voters[i]
            .admin()
            .try_send(Method::GET, "/metrics", &[], Bytes::new())
            .await
            .ok()?;
        Some(reply.text())
    }

    /// The longest client request voter `i` has answered since it started, in seconds
    /// (`ursula_http_request_seconds_max`; live reads are not counted).
    pub async fn slowest_request(&self, i: usize) -> Option<f64> {
        let text = self.metrics(i).await?;
        text.lines().find_map(|line| {
            line.strip_prefix("ursula_http_request_seconds_max ")?
                .trim()
                .parse()
                .ok()
        })
    }

    /// Whether voter `i` says it leads `group` (a cut-off leader still does).
    pub async fn leads(&self, i: usize, group: usize) -> bool {
        let needle = format!("ursula_group_is_leader{{group=\"{group}\"}} 1");
        self.metrics(i)
            .await
            .is_some_and(|text| text.lines().any(|line| line == needle))
    }

    /// The last index in voter `i`'s Raft log of `group` (`None` if it cannot say).
    pub async fn last_log_index(&self, i: usize, group: usize) -> Option<u64> {
        let prefix = format!("ursula_group_last_log_index{{group=\"{group}\"}} ");
        self.metrics(i).await.and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix(&prefix)?.trim().parse().ok())
        })
    }

    /// The voter index that leads `group`, as the running voters report it.
    pub async fn leader_of(&self, group: usize) -> Option<usize> {
        for (i, voter) in self.voters.iter().enumerate() {
            if voter.is_running() && self.leads(i, group).await {
                return Some((voter.id - 1) as usize);
            }
        }
        None
    }

    /// Waits until every running voter is ready (knows every group's leader, applied its log).
    pub async fn wait_ready(&self) {
        // A restart replays every group's log and catches up with the leaders; on a loaded
        // 2-core CI host that has taken over 30 s.
        let deadline = Instant::now() + Duration::from_secs(60);
        for voter in self.voters.iter().filter(|v| v.is_running()) {
            loop {
                let answer = voter
                    .admin()
                    .try_send(Method::GET, "/readyz", &[], Bytes::new())
                    .await;
                let why = match answer {
                    Ok(reply) if reply.status == StatusCode::OK => break,
                    Ok(reply) => String::from_utf8_lossy(&reply.body).into_owned(),
                    Err(error) => error,
                };
                assert!(
                    Instant::now() < deadline,
                    "voter {} is not ready: {why}",
                    voter.id
                );
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

    /// A GET of `target`, answered by its group's leader (`send`, for up to 20 s).
    pub async fn get_from_leader(&self, target: &str) -> Reply {
        self.send(
            0,
            Method::GET,
            target,
            &[],
            Bytes::new(),
            Duration::from_secs(20),
        )
        .await
        .expect("a leader answers the read")
    }

    /// Reads a whole stream from its leader.
    pub async fn read_all(&self, path: &str) -> Vec<u8> {
        let read = self.read_if_there(path, "-1").await;
        read.unwrap_or_else(|| panic!("{path} is not there")).0
    }

    /// Reads a stream from `from` to its tail from its leader, with the last page's answer;
    /// `None` when it is not there (404, or 410 Gone).
    pub async fn read_if_there(&self, path: &str, from: &str) -> Option<(Vec<u8>, Reply)> {
        let get = async |target: &str| self.get_from_leader(target).await;
        let first = get(&format!("{path}?offset={from}")).await;
        if matches!(first.status, StatusCode::NOT_FOUND | StatusCode::GONE) {
            return None;
        }
        Some(crate::http::read_pages(path, from, get).await)
    }

    /// Waits until every running voter's own copy of the stream is the given bytes (its
    /// `/admin/replica` digest); panics after 20 s.
    pub async fn wait_replicas_equal(&self, bucket: &str, stream: &str, bytes: &[u8]) {
        if let Err(differs) = self.replicas_equal(bucket, stream, bytes).await {
            panic!("{differs}");
        }
    }

    /// Whether every running voter's own copy of the stream becomes the given bytes within
    /// 20 s; if not, which voter's differs.
    pub async fn replicas_equal(
        &self,
        bucket: &str,
        stream: &str,
        bytes: &[u8],
    ) -> Result<(), String> {
        let expected = crate::sha256_hex(bytes);
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
                if Instant::now() >= deadline {
                    return Err(format!(
                        "voter {}'s copy of {bucket}/{stream} differs: {digest:?}, expected {expected}",
                        voter.id
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
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
