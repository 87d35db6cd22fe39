//! Parsing what a request carries: headers, query parameters and bodies. Everything here
//! refuses bad input with a named 400 (or 413) before anything is proposed.

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::BodyExt;
use serde_json::value::RawValue;
use ursula_wire::{ErrorToken, headers};

use super::error::ApiError;
use crate::admission::{self, BodyPermit};
use crate::machine::{ExpiresAt, Payload, ProducerClaim};
use crate::offset::{self, OffsetParam};

/// The largest integer a JSON number (and so a JavaScript client) holds exactly: 2^53 - 1.
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

pub fn header<'a>(map: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    match map.get(name) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|v| Some(v.trim()))
            .map_err(|_| ApiError::header(name, "not visible ASCII")),
    }
}

/// Only a case-insensitive `true` counts; any other value is as if the header were absent.
pub fn flag(map: &HeaderMap, name: &str) -> bool {
    map.get(name)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// A decimal integer without sign, leading zeros, point or exponent.
pub fn strict_integer(text: &str) -> Option<u64> {
    let canonical = text == "0" || (!text.starts_with('0') && !text.is_empty());
    if !canonical || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

pub fn ttl(map: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(text) = header(map, headers::STREAM_TTL)? else {
        return Ok(None);
    };
    strict_integer(text).map(Some).ok_or_else(|| {
        ApiError::header(
            "Stream-TTL",
            format!("{text:?} is not a whole number of seconds"),
        )
    })
}

pub fn expires_at(map: &HeaderMap) -> Result<Option<ExpiresAt>, ApiError> {
    let Some(text) = header(map, headers::STREAM_EXPIRES_AT)? else {
        return Ok(None);
    };
    let parsed = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|_| {
            ApiError::header(
                "Stream-Expires-At",
                format!("{text:?} is not an RFC 3339 timestamp"),
            )
        })?;
    let unix_ms = i64::try_from(parsed.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| ApiError::header("Stream-Expires-At", "out of range"))?;
    Ok(Some(ExpiresAt {
        unix_ms,
        text: text.to_owned(),
    }))
}

pub fn producer(map: &HeaderMap) -> Result<Option<ProducerClaim>, ApiError> {
    let id = header(map, headers::PRODUCER_ID)?;
    let epoch = header(map, headers::PRODUCER_EPOCH)?;
    let seq = header(map, headers::PRODUCER_SEQ)?;
    let invalid = |message: String| ApiError::new(ErrorToken::InvalidProducer, message);
    match (id, epoch, seq) {
        (None, None, None) => Ok(None),
        (Some(id), Some(epoch), Some(seq)) => {
            if id.is_empty() {
                return Err(invalid("Producer-Id must not be empty".into()));
            }
            let number = |name: &str, text: &str| {
                text.bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| text.parse::<u64>().ok())
                    .flatten()
                    .filter(|n| !text.is_empty() && *n <= MAX_SAFE_INTEGER)
                    .ok_or_else(|| {
                        invalid(format!(
                            "{name} {text:?} is not an integer from 0 to 2^53-1"
                        ))
                    })
            };
            Ok(Some(ProducerClaim {
                id: id.to_owned(),
                epoch: number("Producer-Epoch", epoch)?,
                seq: number("Producer-Seq", seq)?,
            }))
        }
        _ => Err(invalid(
            "Producer-Id, Producer-Epoch and Producer-Seq must be sent together".into(),
        )),
    }
}

/// The query parameters of a read.
#[derive(Debug, Default)]
pub struct ReadQuery {
    pub offset: Option<OffsetParam>,
    pub live: Live,
    pub cursor: Option<String>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    #[default]
    No,
    LongPoll,
    Sse,
}

pub fn read_query(query: Option<&str>) -> Result<ReadQuery, ApiError> {
    let mut out = ReadQuery::default();
    let mut seen_offset = false;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = crate::names::percent_decode(&value.replace('+', " ")).ok_or_else(|| {
            ApiError::new(
                ErrorToken::InvalidOffset,
                format!("{key}: bad percent-encoding"),
            )
        })?;
        match key {
            "offset" => {
                if seen_offset {
                    return Err(ApiError::new(
                        ErrorToken::InvalidOffset,
                        "offset is given more than once",
                    ));
                }
                seen_offset = true;
                out.offset = Some(offset::parse_param(&value).ok_or_else(|| {
                    ApiError::new(
                        ErrorToken::InvalidOffset,
                        format!("{value:?} is not an offset: use -1, now, or an offset the server returned"),
                    )
                })?);
            }
            "live" => {
                out.live = match value.as_str() {
                    "long-poll" => Live::LongPoll,
                    "sse" => Live::Sse,
                    "" | "false" => Live::No,
                    other => {
                        return Err(ApiError::new(
                            ErrorToken::InvalidHeader,
                            format!("live={other:?}: use long-poll or sse"),
                        ));
                    }
                };
            }
            "cursor" => out.cursor = Some(value),
            // Unknown parameters are ignored: extensions must be pure supersets.
            _ => {}
        }
    }
    Ok(out)
}

/// The declared `Content-Length`, if any.
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    header(headers, "content-length")?
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| ApiError::header("Content-Length", "not a number"))
        })
        .transpose()
}

/// Reads a body of at most `limit` bytes (a longer one is a 413), holding its bytes in
/// `permit` (a body of unknown length takes its share as it arrives).
pub async fn body(
    headers: &HeaderMap,
    mut body: axum::body::Body,
    limit: u64,
    permit: &mut BodyPermit,
) -> Result<Bytes, ApiError> {
    let declared = content_length(headers)?;
    // Most bodies come in one frame: the first is kept apart, so that they need no list.
    let mut first: Option<Bytes> = None;
    let mut more: Vec<Bytes> = Vec::new();
    let mut total: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| {
            ApiError::new(
                ErrorToken::InvalidHeader,
                format!("the request body could not be read: {error}"),
            )
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len() as u64;
        if total > limit {
            return Err(admission::too_large(limit).into());
        }
        if declared.is_none() {
            permit.grow(data.len() as u64)?;
        }
        match first {
            None => first = Some(data),
            Some(_) => more.push(data),
        }
    }
    // A small body is a slice of the connection's read buffer; copying it lets that buffer
    // be reused instead of pinning it for as long as the record stays in the tail cache.
    Ok(match first {
        None => Bytes::new(),
        Some(only) if more.is_empty() && total > 64 * 1024 => only,
        Some(first) => {
            let mut out = Vec::with_capacity(total as usize);
            out.extend_from_slice(&first);
            for part in &more {
                out.extend_from_slice(part);
            }
            Bytes::from(out)
        }
    })
}

/// Splits a JSON body into messages, flattening one level of array.
///
/// Returns `None` for `[]`, which only a create accepts (an empty JSON stream).
pub fn json_payload(body: &[u8]) -> Result<Option<Payload>, ApiError> {
    let invalid = |e: &dyn std::fmt::Display| {
        ApiError::new(
            ErrorToken::InvalidJson,
            format!("the body is not valid JSON: {e}"),
        )
    };
    let text = std::str::from_utf8(body).map_err(|e| invalid(&e))?;
    let value: &RawValue = serde_json::from_str(text).map_err(|e| invalid(&e))?;
    let raw = value.get().trim();
    if !raw.starts_with('[') {
        return Ok(Some(Payload::inline(
            Bytes::copy_from_slice(raw.as_bytes()),
            1,
        )));
    }
    let items: Vec<&RawValue> = serde_json::from_str(raw).map_err(|e| invalid(&e))?;
    if items.is_empty() {
        return Ok(None);
    }
    Ok(Some(join_messages(&items)))
}

pub fn join_messages(items: &[&RawValue]) -> Payload {
    let mut bytes = Vec::with_capacity(items.iter().map(|i| i.get().len() + 1).sum());
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            bytes.push(b',');
        }
        bytes.extend_from_slice(item.get().trim().as_bytes());
    }
    Payload::inline(bytes.into(), items.len() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(body: &str) -> Option<(String, u32)> {
        json_payload(body.as_bytes())
            .unwrap()
            .map(|p| (String::from_utf8(p.bytes.to_vec()).unwrap(), p.messages))
    }

    #[test]
    fn json_flattens_exactly_one_level() {
        assert_eq!(messages(r#"{"a":1}"#), Some((r#"{"a":1}"#.into(), 1)));
        assert_eq!(
            messages(r#"[{"a":1},{"b":2}]"#),
            Some((r#"{"a":1},{"b":2}"#.into(), 2))
        );
        assert_eq!(messages("[[1,2],[3,4]]"), Some(("[1,2],[3,4]".into(), 2)));
        assert_eq!(messages("[[[1,2,3]]]"), Some(("[[1,2,3]]".into(), 1)));
        assert_eq!(messages(" 42 "), Some(("42".into(), 1)));
        assert_eq!(messages("[]"), None);
        for bad in ["", "{", "[1,]", "nope", "[1] [2]"] {
            assert!(json_payload(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn strict_integers() {
        assert_eq!(strict_integer("0"), Some(0));
        assert_eq!(strict_integer("3600"), Some(3600));
        for bad in [
            "",
            "03600",
            "+3600",
            "3600.0",
            "3.6e3",
            "-1",
            "1 ",
            "99999999999999999999999",
        ] {
            assert_eq!(strict_integer(bad), None, "{bad}");
        }
    }

    #[test]
    fn read_query_refusals() {
        assert!(read_query(Some("offset=")).is_err());
        assert!(read_query(Some("offset=-1&offset=-1")).is_err());
        assert!(read_query(Some("offset=../x")).is_err());
        let q = read_query(Some("offset=now&live=sse&cursor=12&x=y")).unwrap();
        assert_eq!(q.offset, Some(OffsetParam::Now));
        assert_eq!(q.live, Live::Sse);
        assert_eq!(q.cursor.as_deref(), Some("12"));
    }
}
