//! Shared by the gateway's integration tests: a gateway started in this process, an SSE
//! subscriber, and the gateway's metrics. Nodes and clusters come from the workspace's test
//! kit (`ursula_testkit`), which builds the `ursula-node` binary these tests need.

#![allow(dead_code)]

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ursula_gateway::config::Config;
use ursula_testkit::Http;

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
