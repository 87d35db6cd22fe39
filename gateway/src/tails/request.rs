//! Which SSE requests can share a subscription, and with whom.

use http::Method;
use ursula_wire::cursor::Cursor;

use crate::prepared::Prepared;

/// An SSE request that can share a subscription.
pub(crate) struct TailRequest {
    /// Requests with the same key get the same events from the node: the same path, the same
    /// other query parameters, and the same CORS headers (the node adds them when the request
    /// has an `Origin`).
    pub key: String,
    pub start: Start,
    /// The `cursor` the client echoed: the node gives a client that echoes one at or past the
    /// current interval a greater one of its own.
    pub echo: Option<Cursor>,
    /// The request as the node is sent it when this client opens the subscription: without
    /// the client's cursor, so that the node's control events suit every client.
    pub upstream_path_and_query: String,
}

pub(crate) enum Start {
    Now,
    At(String),
}

impl TailRequest {
    /// `Some` for a GET with one `live=sse`, one `offset` that is `now` or an offset, and at
    /// most one `cursor`, in digits.
    pub(crate) fn of(prepared: &Prepared) -> Option<Self> {
        if prepared.parts.method != Method::GET {
            return None;
        }
        let mut live = None;
        let mut offset = None;
        let mut echoed = None;
        let mut rest = Vec::new();
        for pair in prepared.parts.uri.query()?.split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match name {
                "live" => &mut live,
                "offset" => &mut offset,
                "cursor" => &mut echoed,
                _ => {
                    rest.push(pair);
                    continue;
                }
            };
            if slot.replace(value).is_some() {
                return None;
            }
        }
        if live != Some("sse") {
            return None;
        }
        let echo = match echoed {
            None => None,
            Some(text) => Some(Cursor::parse_echo(text)?),
        };
        let start = match offset? {
            "now" => Start::Now,
            at if is_offset(at) => Start::At(at.to_owned()),
            _ => return None,
        };
        let upstream_path_and_query = format!(
            "{}?{}",
            prepared.path,
            prepared
                .parts
                .uri
                .query()?
                .split('&')
                .filter(|pair| !pair.starts_with("cursor=") && *pair != "cursor")
                .collect::<Vec<_>>()
                .join("&")
        );
        rest.sort_unstable();
        Some(Self {
            key: format!(
                "{}?{}{}",
                prepared.path,
                rest.join("&"),
                prepared.cors_need()
            ),
            start,
            echo,
            upstream_path_and_query,
        })
    }
}

/// The node's offsets: 16 digits, `_`, 16 digits. They sort as they compare.
pub(crate) fn is_offset(text: &str) -> bool {
    text.len() == 33
        && text.bytes().enumerate().all(|(i, b)| {
            if i == 16 {
                b == b'_'
            } else {
                b.is_ascii_digit()
            }
        })
}

#[cfg(test)]
mod tests {

    use super::*;

    const P1: &str = "0000000000000000_0000000000000005";

    fn of(method: Method, uri: &str, origin: bool) -> Option<TailRequest> {
        let headers: &[(&str, &str)] = if origin {
            &[("origin", "https://app.example")]
        } else {
            &[]
        };
        TailRequest::of(&Prepared::read(method, uri, headers))
    }

    #[test]
    fn which_requests_share_a_subscription() {
        let at = format!("/d/s?live=sse&offset={P1}");
        let cases: Vec<(Method, &str, Option<&str>)> = vec![
            (Method::GET, "/d/s?offset=now&live=sse", Some("/d/s?")),
            (Method::GET, &at, Some("/d/s?")),
            (
                Method::GET,
                "/d/s?x=2&offset=now&a=1&live=sse",
                Some("/d/s?a=1&x=2"),
            ),
            (
                Method::GET,
                "/d/s?offset=now&live=sse&cursor=99999999999",
                Some("/d/s?"),
            ),
            (Method::GET, "/d/s?offset=now&live=sse&cursor=%31", None),
            (Method::GET, "/d/s?offset=now&live=sse&cursor=", None),
            (
                Method::GET,
                "/d/s?offset=now&live=sse&cursor=99999999999999999999999",
                Some("/d/s?"),
            ),
            (
                Method::GET,
                "/d/s?offset=now&live=sse&cursor=1&cursor=2",
                None,
            ),
            (Method::GET, "/d/s?offset=-1&live=sse", None),
            (Method::GET, "/d/s?live=sse", None),
            (Method::GET, "/d/s?offset=now&offset=now&live=sse", None),
            (Method::GET, "/d/s?offset=now&live=sse&live=sse", None),
            (Method::GET, "/d/s?offset=now&live=long-poll", None),
            (Method::GET, "/d/s?offset=now", None),
            (Method::HEAD, "/d/s?offset=now&live=sse", None),
        ];
        for (method, uri, key) in cases {
            let found = of(method.clone(), uri, false).map(|r| r.key);
            assert_eq!(found.as_deref(), key, "{method} {uri}");
        }
        assert!(is_offset(P1));
        assert!(!is_offset("0000000000000000-0000000000000005"));
        assert!(!is_offset("5"));
    }

    #[test]
    fn the_node_is_asked_without_the_cursor_and_cors_requests_share_apart() {
        let request = of(Method::GET, "/d/s?cursor=42&offset=now&live=sse", false).unwrap();
        assert_eq!(request.echo, Some(Cursor::Number(42)));
        assert_eq!(request.upstream_path_and_query, "/d/s?offset=now&live=sse");
        let cors = of(Method::GET, "/d/s?offset=now&live=sse", true).unwrap();
        assert_ne!(cors.key, request.key);
    }
}
