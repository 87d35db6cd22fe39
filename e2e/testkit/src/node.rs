//! One `ursula-node` process on ephemeral loopback ports.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::Client;

/// A real `ursula-node` process; SIGKILLed when dropped.
pub struct NodeProcess {
    pub child: Child,
    pub client_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The data directory, when the process owns it (`in_temp_dir`).
    _dir: Option<tempfile::TempDir>,
}

impl NodeProcess {
    /// A node on `data_dir` with `extra` command-line arguments.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Self {
        Self::start_with(data_dir, "", extra)
    }

    /// A node on a data directory of its own, deleted with it.
    pub fn in_temp_dir() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut node = Self::start(&dir.path().join("data"), &[]);
        node._dir = Some(dir);
        node
    }

    /// `server_toml` goes into the config file's `[server]` table.
    pub fn start_with(data_dir: &Path, server_toml: &str, extra: &[&str]) -> Self {
        std::fs::create_dir_all(data_dir).expect("data dir");
        // Test machines may have little free disk: lower the disk-pressure thresholds.
        let config = data_dir.join("test-node.toml");
        std::fs::write(
            &config,
            format!("[server]\n{server_toml}\n[raft.wal]\nmin_available_size = 1048576\nresume_available_size = 2097152\nsegment_size = 4194304\n"),
        )
        .expect("config file");
        let mut child = Command::new(crate::binaries::node())
            .arg("--config")
            .arg(&config)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(data_dir)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ursula-node");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let mut found = None;
        for line in lines.by_ref() {
            let line = line.expect("stderr line");
            if line.contains("ursula-node serving") {
                let addr = |key: &str| -> SocketAddr {
                    let rest = &line[line.find(key).expect("address in log") + key.len()..];
                    let end = rest.find(' ').unwrap_or(rest.len());
                    rest[..end]
                        .trim_matches(|c| c == '"')
                        .parse()
                        .expect("address")
                };
                found = Some((addr("client="), addr("admin=")));
                break;
            }
        }
        // Keep draining stderr so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let (client_addr, admin_addr) = found.expect("the node reported its addresses");
        Self {
            child,
            client_addr,
            admin_addr,
            _dir: None,
        }
    }

    pub fn client(&self) -> Client {
        Client::new(self.client_addr)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.client_addr)
    }

    /// Resident memory, from `/proc`.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    /// SIGSTOP: the node keeps its connections and answers nothing, as a stalled machine.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT.
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: a signal to a child process this test started and has not reaped.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "kill({signal})");
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
