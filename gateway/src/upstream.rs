//! The upstream nodes: their origins, which one to try first, and where a redirect points.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

/// `scheme://host:port`, lower-cased, with the default port made explicit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin(String);

impl Origin {
    pub fn parse(url: &str) -> Option<Self> {
        let uri: http::Uri = url.parse().ok()?;
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        let authority = uri.authority()?;
        let port = authority.port_u16().unwrap_or(default_port);
        Some(Self(format!(
            "{scheme}://{}:{port}",
            authority.host().to_ascii_lowercase()
        )))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the node is reached over TLS.
    pub fn is_tls(&self) -> bool {
        self.0.starts_with("https://")
    }

    /// `host:port`.
    pub fn address(&self) -> &str {
        self.0.split_once("://").map_or(&self.0, |(_, rest)| rest)
    }

    /// The host, the name a TLS server certificate must carry.
    pub fn host(&self) -> &str {
        let address = self.address();
        address.rsplit_once(':').map_or(address, |(host, _)| host)
    }
}

/// Streams whose leader was last seen; bounded, cleared when full.
const LEADER_CACHE: usize = 100_000;

pub struct Upstreams {
    origins: Vec<Origin>,
    next: AtomicUsize,
    leaders: Mutex<HashMap<String, usize>>,
}

impl Upstreams {
    pub fn new(urls: &[String]) -> Self {
        Self {
            origins: urls.iter().filter_map(|u| Origin::parse(u)).collect(),
            next: AtomicUsize::new(0),
            leaders: Mutex::new(HashMap::new()),
        }
    }

    pub fn len(&self) -> usize {
        self.origins.len()
    }

    pub fn is_empty(&self) -> bool {
        self.origins.is_empty()
    }

    pub fn origin(&self, index: usize) -> &Origin {
        &self.origins[index]
    }

    /// The upstream a `Location` points at, if it is one of ours.
    pub fn find(&self, location: &str) -> Option<usize> {
        let origin = Origin::parse(location)?;
        self.origins.iter().position(|o| *o == origin)
    }

    /// The last leader seen for this stream, else the next upstream in turn.
    pub fn pick(&self, path: &str) -> usize {
        if let Some(leader) = self.leaders.lock().get(path) {
            return *leader;
        }
        self.next.fetch_add(1, Ordering::Relaxed) % self.origins.len()
    }

    pub fn remember_leader(&self, path: &str, index: usize) {
        let mut leaders = self.leaders.lock();
        // Most writes go where the last one went: no new key to allocate.
        if leaders.get(path) == Some(&index) {
            return;
        }
        if leaders.len() >= LEADER_CACHE {
            leaders.clear();
        }
        leaders.insert(path.to_owned(), index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_compare_by_scheme_host_and_port() {
        let ups = Upstreams::new(&["http://Node-0:4437".into(), "http://node-1:4437/".into()]);
        assert_eq!(ups.find("http://node-0:4437/demo/s?x=1"), Some(0));
        assert_eq!(ups.find("http://NODE-1:4437/v1/stream/a"), Some(1));
        assert_eq!(ups.find("http://node-2:4437/demo/s"), None);
        assert_eq!(ups.find("/relative"), None);
        assert_eq!(Origin::parse("http://h/x").unwrap().as_str(), "http://h:80");
        let secure = Origin::parse("https://Node-1.example/x").unwrap();
        assert_eq!(secure.as_str(), "https://node-1.example:443");
        assert!(secure.is_tls());
        assert_eq!(secure.address(), "node-1.example:443");
        assert_eq!(secure.host(), "node-1.example");
        assert!(Origin::parse("ftp://h/x").is_none());
    }

    #[test]
    fn leaders_are_remembered_and_others_rotate() {
        let ups = Upstreams::new(&["http://a:1".into(), "http://b:1".into()]);
        let first = ups.pick("/d/x");
        let second = ups.pick("/d/x");
        assert_ne!(first, second);
        ups.remember_leader("/d/x", 1);
        assert_eq!(ups.pick("/d/x"), 1);
        assert_eq!(ups.pick("/d/x"), 1);
    }
}
