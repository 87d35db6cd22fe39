//! Shared by the gateway's integration tests: a gateway started in this process, and a small
//! HTTP client that answers status, headers and body.

#![allow(dead_code)]

pub mod voters;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ursula_gateway::config::Config;

pub struct Reply {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Clone)]
pub struct Http(Client<HttpConnector, Full<Bytes>>);

impl Http {
    pub fn new() -> Self {
        Self(Client::builder(TokioExecutor::new()).build_http())
    }

    pub async fn request(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Reply, String> {
        let mut request = Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .map_err(|e| e.to_string())?;
        let response = self.0.request(request).await.map_err(|e| e.to_string())?;
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
}

/// A gateway on a free loopback port in front of `upstreams`, with `edit` applied to its config.
pub async fn gateway(upstreams: Vec<String>, edit: impl FnOnce(&mut Config)) -> SocketAddr {
    start_gateway(upstreams, edit).await.addr
}

/// Like `gateway`, returning the running gateway (its metrics, its admin address).
pub async fn start_gateway(
    upstreams: Vec<String>,
    edit: impl FnOnce(&mut Config),
) -> ursula_gateway::Running {
    let mut config = Config {
        listen: "127.0.0.1:0".parse().expect("address"),
        admin_listen: "127.0.0.1:0".parse().expect("address"),
        upstreams,
        ..Config::default()
    };
    edit(&mut config);
    ursula_gateway::start(config).await.expect("gateway")
}

/// An SSE response read event by event.
pub struct Subscriber {
    body: hyper::body::Incoming,
    buffer: String,
}

#[derive(Debug, Default)]
pub struct Seen {
    pub data: String,
    /// `streamNextOffset` of each control event, in order.
    pub offsets: Vec<String>,
    /// `streamCursor` of each control event that has one.
    pub cursors: Vec<u64>,
    pub closed: bool,
}

impl Subscriber {
    pub async fn open(url: &str) -> Self {
        Self::open_with(url, &[]).await.0
    }

    pub async fn open_with(url: &str, headers: &[(&str, &str)]) -> (Self, http::HeaderMap) {
        Self::try_open(url, headers)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Opens `url`; an answer other than a 200 event stream is an error.
    pub async fn try_open(
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<(Self, http::HeaderMap), String> {
        let client =
            Client::builder(TokioExecutor::new()).build_http::<http_body_util::Empty<Bytes>>();
        let mut request = Request::get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(http_body_util::Empty::new())
            .map_err(|e| e.to_string())?;
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let event_stream = response
            .headers()
            .get("content-type")
            .is_some_and(|v| v == "text/event-stream");
        if response.status() != StatusCode::OK || !event_stream {
            return Err(format!(
                "{url}: {} {:?}",
                response.status(),
                response.headers()
            ));
        }
        let headers = response.headers().clone();
        let subscriber = Self {
            body: response.into_body(),
            buffer: String::new(),
        };
        Ok((subscriber, headers))
    }

    /// The next event, or `None` when the response ended.
    pub async fn event(&mut self) -> Option<String> {
        self.try_event(std::time::Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The next event within `wait`, or `None` when the response ended; an error when none
    /// came in time (`Err("timeout")`, and reading can go on) or the response failed.
    pub async fn try_event(&mut self, wait: std::time::Duration) -> Result<Option<String>, String> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                return Ok(Some(self.buffer.drain(..end + 2).collect()));
            }
            let Ok(frame) = tokio::time::timeout(wait, self.body.frame()).await else {
                return Err("timeout".into());
            };
            let Some(frame) = frame else {
                return Ok(None);
            };
            if let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() {
                self.buffer
                    .push_str(std::str::from_utf8(&data).map_err(|e| e.to_string())?);
            }
        }
    }

    /// The control event that must come next.
    pub async fn control(&mut self) -> serde_json::Value {
        let event = self.event().await.expect("an event");
        let json = event
            .strip_prefix("event: control\ndata:")
            .unwrap_or_else(|| panic!("not a control event: {event:?}"));
        serde_json::from_str(json.trim_end()).expect("control JSON")
    }

    /// Events until a control event at `offset` (or the end), with what they said.
    pub async fn until(&mut self, offset: &str) -> Seen {
        let mut seen = Seen::default();
        while let Some(event) = self.event().await {
            if seen.read(&event).is_some_and(|at| at == offset) {
                break;
            }
        }
        seen
    }
}

impl Seen {
    /// Takes in one event; the `streamNextOffset` of a control event.
    pub fn read(&mut self, event: &str) -> Option<String> {
        if let Some(data) = event.strip_prefix("event: data\n") {
            for line in data.lines().filter_map(|l| l.strip_prefix("data:")) {
                self.data.push_str(line);
            }
            return None;
        }
        let json = event.strip_prefix("event: control\ndata:")?;
        let control: serde_json::Value = serde_json::from_str(json.trim_end()).ok()?;
        self.closed |= control["streamClosed"] == true;
        if let Some(cursor) = control["streamCursor"].as_str() {
            self.cursors
                .push(cursor.parse().expect("a cursor in digits"));
        }
        let at = control["streamNextOffset"].as_str()?.to_owned();
        self.offsets.push(at.clone());
        Some(at)
    }
}

/// A real `ursula-node` process on free loopback ports (the binary the workspace build puts
/// next to the gateway's).
pub struct Node {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Node {
    pub fn start() -> Self {
        let binary =
            PathBuf::from(env!("CARGO_BIN_EXE_ursula-gateway")).with_file_name("ursula-node");
        assert!(
            binary.exists(),
            "{binary:?} is missing: build the workspace"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("node.toml");
        std::fs::write(
            &config,
            "[raft.wal]\nmin_available_size = 1048576\nresume_available_size = 2097152\n",
        )
        .expect("config");
        let mut child = Command::new(binary)
            .arg("--config")
            .arg(&config)
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ursula-node");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let addr = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|line| {
                let rest = &line[line.find("ursula-node serving")?..];
                let rest = &rest[rest.find("client=")? + "client=".len()..];
                rest.split(' ').next()?.trim_matches('"').parse().ok()
            })
            .expect("the node reported its address");
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            addr,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGSTOP: the node keeps its connections and answers nothing, as a stalled machine.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill(1)");
        assert!(sent.success(), "kill {signal}");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A counter or gauge from a gateway's `/metrics`.
pub async fn metric(admin: SocketAddr, name: &str) -> u64 {
    let reply = Http::new()
        .request("GET", &format!("http://{admin}/metrics"), &[], "")
        .await
        .expect("metrics");
    String::from_utf8_lossy(&reply.body)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name}"))
}
