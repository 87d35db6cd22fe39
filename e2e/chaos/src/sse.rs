//! A minimal SSE client for the followers: opens a live read (following a voter's redirect),
//! and yields data and control events as they arrive.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use std::net::SocketAddr;

pub enum Event {
    /// A data event's text, each of its lines ended by a newline again (every record of the
    /// campaign is one line).
    Data(String),
    Control {
        next: String,
    },
}

pub struct Events {
    body: hyper::body::Incoming,
    buffer: BytesMut,
}

type Body = Empty<Bytes>;

/// Opens `target` at `addr`, following a redirect to the voter it names (`voters`, by node ID
/// from 1); an answer other than a 200 event stream is an error.
pub async fn subscribe(
    mut addr: SocketAddr,
    voters: &[SocketAddr],
    target: &str,
    stop: &AtomicBool,
) -> Result<Events, String> {
    let client: Client<_, Body> = Client::builder(TokioExecutor::new()).build_http();
    for _ in 0..4 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let request = Request::get(format!("http://{addr}{target}"))
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let response = tokio::time::timeout(Duration::from_secs(5), client.request(request))
            .await
            .map_err(|_| "no answer".to_owned())?
            .map_err(|e| e.to_string())?;
        if response.status() == StatusCode::TEMPORARY_REDIRECT {
            let leader = response
                .headers()
                .get("x-ursula-leader-id")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|id| (1..=voters.len()).contains(id))
                .ok_or("a redirect without a leader")?;
            addr = voters[leader - 1];
            continue;
        }
        if response.status() != StatusCode::OK {
            return Err(format!("{}", response.status()));
        }
        return Ok(Events {
            body: response.into_body(),
            buffer: BytesMut::new(),
        });
    }
    Err("too many redirects".into())
}

impl Events {
    /// The next event; `None` when the response ends, fails, or `stop` is set.
    pub async fn next(&mut self, stop: &AtomicBool) -> Option<Event> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let raw = self.buffer.split_to(end + 2);
                let text = String::from_utf8_lossy(&raw).into_owned();
                if let Some(event) = parse(&text) {
                    return Some(event);
                }
                continue;
            }
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            let frame = tokio::time::timeout(Duration::from_millis(200), self.body.frame()).await;
            match frame {
                Err(_) => continue,
                Ok(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        self.buffer.extend_from_slice(data);
                    }
                }
                Ok(_) => return None,
            }
        }
    }
}

fn parse(event: &str) -> Option<Event> {
    if let Some(data) = event.strip_prefix("event: data\n") {
        let mut text = String::new();
        for line in data.lines().filter_map(|l| l.strip_prefix("data:")) {
            if !line.is_empty() {
                text.push_str(line);
                text.push('\n');
            }
        }
        return Some(Event::Data(text));
    }
    let json = event.strip_prefix("event: control\ndata:")?;
    let control: serde_json::Value = serde_json::from_str(json.trim_end()).ok()?;
    Some(Event::Control {
        next: control["streamNextOffset"].as_str()?.to_owned(),
    })
}
