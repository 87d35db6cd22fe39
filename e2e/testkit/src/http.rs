//! An HTTP client for tests: one request, its whole answer.

use std::net::SocketAddr;

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

/// Requests to any URL.
#[derive(Clone)]
pub struct Http(HyperClient<HttpConnector, Full<Bytes>>);

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    pub fn new() -> Self {
        Self(HyperClient::builder(TokioExecutor::new()).build_http())
    }

    /// The whole answer, or why there is none (the server died, the connection broke).
    pub async fn request(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: impl AsRef<[u8]>,
    ) -> Result<Reply, String> {
        let method = Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
        self.send(method, url, headers, Bytes::copy_from_slice(body.as_ref()))
            .await
    }

    async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Reply, String> {
        let mut request = Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(body)).map_err(|e| e.to_string())?;
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

/// Requests to one server, by path.
#[derive(Clone)]
pub struct Client {
    base: String,
    http: Http,
}

impl Client {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            base: format!("http://{addr}"),
            http: Http::new(),
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
        let url = format!("{}{}", self.base, path);
        self.http.send(method, &url, headers, body.into()).await
    }

    /// Reads a whole stream from the start, page by page.
    pub async fn read_all(&self, path: &str) -> (Vec<u8>, Reply) {
        self.read_all_from(path, "-1").await
    }

    /// Reads a stream from `offset` to its tail, page by page.
    pub async fn read_all_from(&self, path: &str, offset: &str) -> (Vec<u8>, Reply) {
        read_pages(path, offset, async |target| self.get(target).await).await
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

/// Reads `path` from `offset` to its tail, one `get` of `{path}?offset=...` per page; the
/// bytes, and the last page's answer.
pub(crate) async fn read_pages(
    path: &str,
    offset: &str,
    mut get: impl AsyncFnMut(&str) -> Reply,
) -> (Vec<u8>, Reply) {
    let mut offset = offset.to_owned();
    let mut out = Vec::new();
    loop {
        let reply = get(&format!("{path}?offset={offset}")).await;
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
