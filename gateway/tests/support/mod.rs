//! Shared by the gateway's integration tests: a gateway started in this process, and a small
//! HTTP client that answers status, headers and body.

#![allow(dead_code)]

use std::net::SocketAddr;

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
