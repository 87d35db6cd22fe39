//! Collapsed long-polls: identical long-poll reads in flight at the same time get one upstream
//! request, and every one of them its answer, as a CDN collapses them (the protocol's cursors
//! exist so that it can). A thousand clients waiting at a stream's tail are then one wait on
//! the node, and one answer read, instead of a thousand.
//!
//! Identical means the same path and query, byte for byte (offset, cursor and all), and the
//! same CORS need (the node adds CORS headers when a request has an `Origin`). A request with
//! a conditional header (`If-None-Match`, ...) is never collapsed. A request that comes while
//! an identical one is in flight waits for its answer; once that answer is out, the next
//! identical request goes upstream again. The answer to a long-poll at an offset is the data
//! from that offset or "nothing yet", so it is right for every client that asked for it. If
//! the client whose request went upstream goes away, or its request is refused, the others
//! send their own.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode, header};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::prepared::{Prepared, Upstream};
use crate::refusal::{Body, Refusal, full};

/// An upstream answer, read whole, to give to every waiting client.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn response(&self) -> Response<Body> {
        let mut response = Response::new(full(self.body.clone()));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers.clone();
        response
    }
}

/// Where the request that went upstream is.
#[derive(Clone)]
enum Outcome {
    Pending,
    Answered(Arc<Answer>),
    /// The gateway refused it, or lost its answer: every client tries on its own.
    Refused,
}

/// One upstream request and the clients waiting for its outcome. The sender is dropped while
/// `Pending` if the request that went upstream is abandoned (its client left): the clients
/// waiting on it then collapse again behind one of them.
type Flight = watch::Receiver<Outcome>;

type InFlight = Arc<Mutex<HashMap<String, Flight>>>;

#[derive(Default)]
pub struct Collapse {
    in_flight: InFlight,
}

/// The collapsing key of a request that can be collapsed. `offset=now` never collapses: the
/// node resolves it when the request arrives, so an answer to an earlier one could hold data
/// acknowledged before a later one was sent.
pub(crate) fn key(prepared: &Prepared) -> Option<String> {
    if prepared.parts.method != Method::GET {
        return None;
    }
    let query = prepared.parts.uri.query()?;
    let mut live = query
        .split('&')
        .filter(|pair| *pair == "live" || pair.starts_with("live="));
    if live.next() != Some("live=long-poll") || live.next().is_some() {
        return None;
    }
    // Offsets are digits and `_`, or `-1`; anything else (`now`, or an encoded form of it)
    // goes on its own.
    let offset_is_fixed = query
        .split('&')
        .filter_map(|pair| pair.strip_prefix("offset="))
        .all(|value| {
            !value.is_empty()
                && value
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b == b'_' || b == b'-')
        });
    if !offset_is_fixed {
        return None;
    }
    let headers = &prepared.parts.headers;
    let conditional = [
        header::IF_NONE_MATCH,
        header::IF_MATCH,
        header::IF_MODIFIED_SINCE,
        header::IF_UNMODIFIED_SINCE,
        header::RANGE,
    ]
    .iter()
    .any(|name| headers.contains_key(name));
    if conditional {
        return None;
    }
    // The gateway's own address, as the client named it, goes into any `Location` it sends.
    let origin = prepared.origin.as_deref().unwrap_or("");
    Some(format!(
        "{}{} {origin}",
        prepared.path_and_query,
        prepared.cors_need()
    ))
}

/// Forgets the flight when the request that went upstream is done with, answered or not.
struct Leading {
    in_flight: InFlight,
    key: String,
    outcome: watch::Sender<Outcome>,
}

impl Drop for Leading {
    fn drop(&mut self) {
        let mut in_flight = self.in_flight.lock();
        if in_flight
            .get(&self.key)
            .is_some_and(|flight| flight.same_channel(&self.outcome.subscribe()))
        {
            in_flight.remove(&self.key);
        }
    }
}

impl Collapse {
    pub(crate) async fn serve(
        &self,
        gateway: &impl Upstream,
        prepared: &Prepared,
        key: String,
    ) -> Result<Response<Body>, Refusal> {
        loop {
            let waiting = {
                let mut in_flight = self.in_flight.lock();
                match in_flight.get(&key) {
                    Some(flight) => Ok(flight.clone()),
                    None => {
                        let (outcome, flight) = watch::channel(Outcome::Pending);
                        in_flight.insert(key.clone(), flight);
                        Err(Leading {
                            in_flight: self.in_flight.clone(),
                            key: key.clone(),
                            outcome,
                        })
                    }
                }
            };
            let mut flight = match waiting {
                Err(leading) => return lead(gateway, prepared, leading).await,
                Ok(flight) => flight,
            };
            let outcome = flight
                .wait_for(|outcome| !matches!(outcome, Outcome::Pending))
                .await
                .map(|outcome| outcome.clone());
            match outcome {
                Ok(Outcome::Answered(answer)) => {
                    gateway
                        .metrics()
                        .collapsed_long_polls
                        .fetch_add(1, Ordering::Relaxed);
                    return Ok(answer.response());
                }
                Ok(Outcome::Refused) => return gateway.send(prepared).await,
                // Abandoned: collapse again, behind whichever of its clients comes first.
                Ok(Outcome::Pending) | Err(_) => continue,
            }
        }
    }
}

/// Sends the request upstream for every identical one that comes meanwhile.
async fn lead(
    gateway: &impl Upstream,
    prepared: &Prepared,
    leading: Leading,
) -> Result<Response<Body>, Refusal> {
    let answer = match gateway.send(prepared).await {
        Ok(answer) => answer,
        Err(refusal) => {
            leading.outcome.send_replace(Outcome::Refused);
            return Err(refusal);
        }
    };
    let (parts, body) = answer.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(error) => {
            leading.outcome.send_replace(Outcome::Refused);
            return Err(Refusal::new(
                ursula_wire::ErrorToken::Unavailable,
                format!("the node's answer was lost: {error}"),
                false,
            ));
        }
    };
    let answer = Arc::new(Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    });
    leading
        .outcome
        .send_replace(Outcome::Answered(answer.clone()));
    drop(leading);
    Ok(answer.response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(method: Method, uri: &str, headers: &[(&str, &str)]) -> Option<String> {
        key(&Prepared::read(method, uri, headers))
    }

    #[test]
    fn which_requests_collapse() {
        let poll = "/d/s?offset=5&live=long-poll&cursor=7";
        assert_eq!(
            key_of(Method::GET, poll, &[]).as_deref(),
            Some(format!("{poll} ").as_str())
        );
        assert_ne!(
            key_of(Method::GET, poll, &[("origin", "https://a")]),
            key_of(Method::GET, poll, &[])
        );
        for (method, uri, headers) in [
            (Method::GET, poll, vec![("if-none-match", "\"x\"")]),
            (Method::HEAD, poll, vec![]),
            (Method::GET, "/d/s?offset=5", vec![]),
            (Method::GET, "/d/s?offset=5&live=sse", vec![]),
            (Method::GET, "/d/s?offset=5&live=long-poll&live=sse", vec![]),
            (Method::GET, "/d/s?offset=5&live", vec![]),
            (Method::GET, "/d/s?offset=now&live=long-poll", vec![]),
            (Method::GET, "/d/s?offset=%6Eow&live=long-poll", vec![]),
            (
                Method::GET,
                "/d/s?live=long-poll&offset=now&cursor=3",
                vec![],
            ),
        ] {
            assert_eq!(
                key_of(method.clone(), uri, &headers),
                None,
                "{method} {uri}"
            );
        }
    }
}
