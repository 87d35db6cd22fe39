use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// A tag that keeps this run's streams apart from earlier runs' on a long-lived server.
pub fn run_id() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// A pooled HTTP/1.1 client bound to one server. Against a cluster it follows 307 leader
/// redirects, as a cluster's clients do, and remembers each stream's leader.
#[derive(Clone)]
pub struct Client {
    base: String,
    inner: HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// With `--ca`: how `lean` connections reach `https://` URLs.
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    leaders: std::sync::Arc<std::sync::RwLock<std::collections::HashMap<String, String>>>,
}

impl Client {
    /// A client of `base`; an `https://` one is trusted when its certificate chains to `ca`.
    pub fn new(base: &str, ca: Option<&std::path::Path>) -> Result<Self, Error> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.enforce_http(false);
        let tls = match ca {
            Some(ca) => Some(std::sync::Arc::new(ursula_tls::client_trusting(ca, &[])?)),
            None => None,
        };
        let trusted = match &tls {
            Some(config) => (**config).clone(),
            None => ursula_tls::client_trusting_none()?,
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(trusted)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let inner = HyperClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1024)
            .build(connector);
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            inner,
            tls,
            leaders: Default::default(),
        })
    }

    pub fn tls(&self) -> Option<std::sync::Arc<rustls::ClientConfig>> {
        self.tls.clone()
    }

    /// Creates a stream, failing on anything but success.
    pub async fn create(&self, path: &str, content_type: &str) -> Result<(), Error> {
        let status = self
            .send(Method::PUT, path, Some(content_type), Bytes::new())
            .await?;
        if !status.is_success() {
            return Err(format!("create {path}: {status}").into());
        }
        Ok(())
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Where a request for `path` goes: its leader's URL once a redirect named it.
    /// Where to send a request for `path` (which may carry a query): the leader a redirect for
    /// its stream named, or the server.
    pub fn target(&self, path: &str) -> String {
        let (stream, query) = match path.split_once('?') {
            Some((stream, query)) => (stream, Some(query)),
            None => (path, None),
        };
        let known = self
            .leaders
            .read()
            .ok()
            .and_then(|l| l.get(stream).cloned());
        match (known, query) {
            (Some(leader), Some(query)) => {
                let base = leader.split_once('?').map_or(leader.as_str(), |(b, _)| b);
                format!("{base}?{query}")
            }
            (Some(leader), None) => leader,
            (None, _) => self.url(path),
        }
    }

    pub fn remember_leader(&self, path: &str, location: &str) {
        if let Ok(mut leaders) = self.leaders.write() {
            leaders.insert(path.to_owned(), location.to_owned());
        }
    }

    /// A GET of `path` (a stream read): status, the `Stream-Next-Offset` and
    /// `Stream-Up-To-Date` headers, and the body's length.
    pub async fn read(
        &self,
        path: &str,
    ) -> Result<(StatusCode, Option<String>, bool, usize), Error> {
        let mut url = self.target(path);
        let mut hops = 0;
        let response = loop {
            let request = Request::builder()
                .method(Method::GET)
                .uri(&url)
                .body(Full::new(Bytes::new()))?;
            let response = self.inner.request(request).await?;
            let location = response
                .headers()
                .get("location")
                .and_then(|l| l.to_str().ok())
                .map(str::to_owned);
            match location {
                Some(location)
                    if response.status() == StatusCode::TEMPORARY_REDIRECT && hops < 4 =>
                {
                    response.into_body().collect().await?;
                    let stream = path.split_once('?').map_or(path, |(s, _)| s);
                    self.remember_leader(stream, &location);
                    url = location;
                    hops += 1;
                }
                _ => break response,
            }
        };
        let status = response.status();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let next = header("stream-next-offset");
        let up_to_date = header("stream-up-to-date").is_some_and(|v| v == "true");
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, next, up_to_date, body.len()))
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<StatusCode, Error> {
        let mut url = self.target(path);
        for _ in 0..4 {
            let mut request = Request::builder().method(method.clone()).uri(&url);
            if let Some(content_type) = content_type {
                request = request.header("content-type", content_type);
            }
            let response = self
                .inner
                .request(request.body(Full::new(body.clone()))?)
                .await?;
            let status = response.status();
            let location = response
                .headers()
                .get("location")
                .and_then(|l| l.to_str().ok())
                .map(str::to_owned);
            response.into_body().collect().await?;
            match location {
                Some(location) if status == StatusCode::TEMPORARY_REDIRECT => {
                    self.remember_leader(path, &location);
                    url = location;
                }
                _ => return Ok(status),
            }
        }
        Err(format!("{path}: too many redirects").into())
    }
}
