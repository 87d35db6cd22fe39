//! Test support: a node on loopback (in-process or as a real child process) and a small HTTP
//! client that returns status, headers and body.

#![allow(dead_code)]

pub mod cluster;
pub mod netns;
pub mod s3;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `error` token of a JSON error body; panics if the body is not one.
    pub fn error(&self) -> String {
        let value: serde_json::Value = serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("error body is not JSON: {:?}", self.text()));
        assert!(value["message"].is_string(), "no message in {value}");
        value["error"].as_str().expect("error token").to_owned()
    }
}

#[derive(Clone)]
pub struct Client {
    base: String,
    inner: HyperClient<HttpConnector, Full<Bytes>>,
}

impl Client {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            base: format!("http://{addr}"),
            inner: HyperClient::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        self.try_send(method, path, headers, body)
            .await
            .expect("server answers")
    }

    /// Like `send`, but a failed exchange (the server died) is an error, not a panic.
    pub async fn try_send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Reply, String> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(body.into()))
            .map_err(|e| e.to_string())?;
        let response = self
            .inner
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// Reads a whole stream from the start, page by page.
    pub async fn read_all(&self, path: &str) -> (Vec<u8>, Reply) {
        self.read_all_from(path, "-1").await
    }

    /// Reads a stream from `offset` to its tail, page by page.
    pub async fn read_all_from(&self, path: &str, offset: &str) -> (Vec<u8>, Reply) {
        let mut offset = offset.to_owned();
        let mut out = Vec::new();
        loop {
            let reply = self.get(&format!("{path}?offset={offset}")).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
            out.extend_from_slice(&reply.body);
            offset = reply
                .header("stream-next-offset")
                .expect("next offset")
                .to_owned();
            if reply.header("stream-up-to-date") == Some("true") {
                return (out, reply);
            }
        }
    }

    pub async fn put(&self, path: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Reply {
        self.send(Method::PUT, path, headers, body).await
    }

    pub async fn post(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        self.send(Method::POST, path, headers, body).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, &[], Bytes::new()).await
    }

    /// Creates `bucket` and its streams `s0` .. `s{count - 1}` of `content_type`.
    pub async fn create_streams(&self, bucket: &str, count: usize, content_type: &str) {
        let created = self.put(&format!("/{bucket}"), &[], "").await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
        for s in 0..count {
            let path = format!("/{bucket}/s{s}");
            let created = self.put(&path, &[("content-type", content_type)], "").await;
            assert_eq!(
                created.status,
                StatusCode::CREATED,
                "{path}: {}",
                created.text()
            );
        }
    }
}

/// A runtime for tests that also drive child processes from the test thread.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A node in this process, on ephemeral loopback ports, with its own data directory.
pub struct InProcess {
    pub client: Client,
    pub admin: Client,
    pub client_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub node: ursula_node::Node,
}

pub async fn start_in_process(edit: impl FnOnce(&mut ursula_node::config::Config)) -> InProcess {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ursula_node::config::Config {
        data_dir: dir.path().to_owned(),
        ..Default::default()
    };
    config.server.listen = "127.0.0.1:0".parse().expect("addr");
    config.server.admin_listen = "127.0.0.1:0".parse().expect("addr");
    config.server.long_poll_timeout = Duration::from_millis(300);
    // Test machines may have little free disk; tests that need disk pressure set their own.
    config.raft.wal.min_available_size = 1 << 20;
    config.raft.wal.resume_available_size = 2 << 20;
    // Many test nodes run at once; 64 MiB preallocated segments each would crowd small disks.
    config.raft.wal.segment_size = 4 << 20;
    edit(&mut config);
    let node = ursula_node::start(config).await.expect("node starts");
    InProcess {
        client: Client::new(node.client_addr),
        admin: Client::new(node.admin_addr),
        client_addr: node.client_addr,
        admin_addr: node.admin_addr,
        dir,
        node,
    }
}

/// A real `ursula-node` process.
pub struct Process {
    pub child: Child,
    pub client_addr: SocketAddr,
    pub admin_addr: SocketAddr,
}

impl Process {
    pub fn start(data_dir: &Path, extra: &[&str]) -> Self {
        Self::start_with(data_dir, "", extra)
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
        let mut child = Command::new(env!("CARGO_BIN_EXE_ursula-node"))
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
        }
    }

    pub fn client(&self) -> Client {
        Client::new(self.client_addr)
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

    /// SIGKILL: no shutdown code runs.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
