//! Which resource a request path names.
//!
//! - `/{bucket}`: the bucket.
//! - `/{bucket}/{stream}` and its `/bootstrap`, `/snapshot/{offset}`, `/retention/{offset}`.
//! - `/v1/stream/{name}`: the compatibility family, `{name}` in the configured compat bucket.
//!   `v1` is not a valid bucket ID (too short), so the families cannot collide.
//! - `{root}/__ds/...`, with `{root}` either `/v1/stream` or `/{bucket}`: the protocol's
//!   reserved subscription APIs, for the streams of the root's bucket (`__ds` is no stream
//!   name in either family).

use http::Method;
use ursula_wire::ErrorToken;

use super::error::ApiError;
use super::marking::Write;
use crate::machine::StreamPath;
use crate::names::{is_valid_bucket, is_valid_stream_name, percent_decode};

const COMPAT_PREFIX: &str = "/v1/stream/";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Bucket(String),
    Stream(StreamPath),
    Bootstrap(StreamPath),
    Snapshot(StreamPath, String),
    Retention(StreamPath, String),
    Subscriptions(Ds),
}

/// A resource of the `__ds` APIs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ds {
    pub bucket: String,
    /// The family's root path the request came through: `/v1/stream` or `/{bucket}`.
    pub root: String,
    pub resource: DsResource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DsResource {
    Jwks,
    Subscription(String),
    /// `.../streams`: named links.
    Streams(String),
    /// `.../streams/{path}`: one named link.
    Link(String, String),
    Callback(String),
    Claim(String),
    Ack(String),
    Release(String),
}

impl DsResource {
    pub fn subscription_id(&self) -> Option<&str> {
        match self {
            Self::Jwks => None,
            Self::Subscription(id)
            | Self::Streams(id)
            | Self::Link(id, _)
            | Self::Callback(id)
            | Self::Claim(id)
            | Self::Ack(id)
            | Self::Release(id) => Some(id),
        }
    }
}

impl Target {
    /// The write a request for this resource is, or `None` for a read (or a method no write
    /// route takes). `closes`: it carries `Stream-Closed: true`; `has_body`: a body is
    /// declared or sent.
    pub fn write(&self, method: &Method, closes: bool, has_body: bool) -> Option<Write> {
        Some(match (self, method) {
            (Self::Bucket(_), &Method::PUT) => Write::CreateBucket,
            (Self::Stream(_), &Method::PUT) => Write::CreateStream { staged: false },
            (Self::Stream(_), &Method::POST) if closes && !has_body => Write::Close,
            (Self::Stream(_), &Method::POST) => Write::Append { staged: false },
            (Self::Stream(_), &Method::DELETE) => Write::DeleteStream,
            (Self::Snapshot(..), &Method::PUT) => Write::PublishSnapshot,
            (Self::Retention(..), &Method::PUT) => Write::AdvanceRetention,
            (Self::Subscriptions(ds), method) => match (&ds.resource, method) {
                (DsResource::Subscription(_), &Method::PUT | &Method::DELETE)
                | (DsResource::Streams(_), &Method::POST)
                | (DsResource::Link(..), &Method::DELETE)
                | (
                    DsResource::Callback(_)
                    | DsResource::Claim(_)
                    | DsResource::Ack(_)
                    | DsResource::Release(_),
                    &Method::POST,
                ) => Write::Subscription,
                _ => return None,
            },
            _ => return None,
        })
    }

    /// The bucket the target is in, which decides its Raft group.
    pub fn bucket(&self) -> &str {
        match self {
            Self::Bucket(bucket) => bucket,
            Self::Stream(path)
            | Self::Bootstrap(path)
            | Self::Snapshot(path, _)
            | Self::Retention(path, _) => &path.bucket,
            Self::Subscriptions(ds) => &ds.bucket,
        }
    }
}

pub fn parse(path: &str, compat_bucket: &str) -> Result<Target, ApiError> {
    if let Some(name) = path.strip_prefix(COMPAT_PREFIX) {
        if let Some(rest) = name.strip_prefix("__ds/") {
            return parse_ds(
                rest,
                compat_bucket,
                COMPAT_PREFIX.trim_end_matches('/'),
                path,
            );
        }
        let name = decode_name(name)?;
        if name == "__ds" {
            return Err(not_found(path));
        }
        return Ok(Target::Stream(StreamPath::new(compat_bucket, name)));
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(not_found(path));
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let bucket = |raw: &str| -> Result<String, ApiError> {
        if is_valid_bucket(raw) {
            Ok(raw.to_owned())
        } else {
            Err(ApiError::new(
                ErrorToken::InvalidBucketId,
                format!(
                    "{raw:?} is not a bucket ID: use 3 to 63 characters of a-z, 0-9 and '-', \
                     starting and ending with a letter or digit"
                ),
            ))
        }
    };
    let stream = |b: &str, s: &str| -> Result<StreamPath, ApiError> {
        Ok(StreamPath::new(bucket(b)?, decode_name(s)?))
    };
    if let [b, "__ds", ..] = segments.as_slice() {
        let bucket = bucket(b)?;
        let ds = rest
            .strip_prefix(*b)
            .and_then(|r| r.strip_prefix("/__ds/"))
            .unwrap_or_default();
        return parse_ds(ds, &bucket, &format!("/{bucket}"), path);
    }
    match segments.as_slice() {
        [""] => Err(not_found(path)),
        [b] => Ok(Target::Bucket(bucket(b)?)),
        [b, s] => Ok(Target::Stream(stream(b, s)?)),
        [b, s, "bootstrap"] => Ok(Target::Bootstrap(stream(b, s)?)),
        [b, s, "snapshot", offset] => Ok(Target::Snapshot(stream(b, s)?, (*offset).to_owned())),
        [b, s, "retention", offset] => Ok(Target::Retention(stream(b, s)?, (*offset).to_owned())),
        _ => Err(not_found(path)),
    }
}

/// Resolves a `Stream-Forked-From` value: a URL path of either family, or a full URL.
pub fn parse_stream_reference(value: &str, compat_bucket: &str) -> Result<StreamPath, ApiError> {
    let mut path = value.trim();
    for scheme in ["http://", "https://"] {
        if let Some(rest) = path.strip_prefix(scheme) {
            path = rest.find('/').map_or("/", |i| &rest[i..]);
        }
    }
    let path = path.split(['?', '#']).next().unwrap_or_default();
    match parse(path, compat_bucket) {
        Ok(Target::Stream(stream)) => Ok(stream),
        _ => Err(ApiError::new(
            ErrorToken::InvalidForkRequest,
            format!("Stream-Forked-From {value:?} is not the path of a stream"),
        )),
    }
}

fn decode_name(raw: &str) -> Result<String, ApiError> {
    let invalid = || {
        ApiError::new(
            ErrorToken::InvalidStreamName,
            format!(
                "{raw:?} is not a stream name: use 1 to 1024 bytes of UTF-8 in segments that are \
                 not empty, '.' or '..', without control characters"
            ),
        )
    };
    let name = percent_decode(raw).ok_or_else(invalid)?;
    if is_valid_stream_name(&name) {
        Ok(name)
    } else {
        Err(invalid())
    }
}

/// `__ds/` and what follows it (`rest`, still percent-encoded) under the root of `bucket`.
fn parse_ds(rest: &str, bucket: &str, root: &str, path: &str) -> Result<Target, ApiError> {
    let segments: Vec<&str> = rest.split('/').collect();
    let id = |raw: &str| -> Result<String, ApiError> {
        match percent_decode(raw) {
            Some(id) if is_valid_subscription_id(&id) => Ok(id),
            _ => Err(ApiError::new(
                ErrorToken::InvalidSubscription,
                format!(
                    "{raw:?} is not a subscription ID: use 1 to 128 characters of A-Z, a-z, \
                     0-9, '.', '_', '~' and '-'"
                ),
            )
            .in_protocol_shape()),
        }
    };
    let resource = match segments.as_slice() {
        ["jwks.json"] => DsResource::Jwks,
        ["subscriptions", s] => DsResource::Subscription(id(s)?),
        ["subscriptions", s, "streams"] => DsResource::Streams(id(s)?),
        ["subscriptions", s, "streams", link @ ..] if !link.is_empty() => {
            let name = decode_name(&link.join("/")).map_err(ApiError::in_protocol_shape)?;
            DsResource::Link(id(s)?, name)
        }
        ["subscriptions", s, "callback"] => DsResource::Callback(id(s)?),
        ["subscriptions", s, "claim"] => DsResource::Claim(id(s)?),
        ["subscriptions", s, "ack"] => DsResource::Ack(id(s)?),
        ["subscriptions", s, "release"] => DsResource::Release(id(s)?),
        _ => return Err(not_found(path).in_protocol_shape()),
    };
    Ok(Target::Subscriptions(Ds {
        bucket: bucket.to_owned(),
        root: root.to_owned(),
        resource,
    }))
}

pub fn is_valid_subscription_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._~-".contains(&b))
}

fn not_found(path: &str) -> ApiError {
    ApiError::new(ErrorToken::NotFound, format!("no route for {path:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(b: &str, s: &str) -> StreamPath {
        StreamPath::new(b, s)
    }

    fn ds(bucket: &str, root: &str, resource: DsResource) -> Target {
        Target::Subscriptions(Ds {
            bucket: bucket.into(),
            root: root.into(),
            resource,
        })
    }

    #[test]
    fn routes() {
        let cases = [
            ("/demo", Target::Bucket("demo".into())),
            ("/demo/hello", Target::Stream(stream("demo", "hello"))),
            ("/demo/a%2Fb", Target::Stream(stream("demo", "a/b"))),
            (
                "/demo/hello/bootstrap",
                Target::Bootstrap(stream("demo", "hello")),
            ),
            (
                "/demo/hello/snapshot/0000000000000000_0000000000000010",
                Target::Snapshot(
                    stream("demo", "hello"),
                    "0000000000000000_0000000000000010".into(),
                ),
            ),
            (
                "/demo/hello/retention/7",
                Target::Retention(stream("demo", "hello"), "7".into()),
            ),
            ("/v1/stream/x", Target::Stream(stream("default", "x"))),
            (
                "/v1/stream/a/b/c",
                Target::Stream(stream("default", "a/b/c")),
            ),
            (
                "/v1/stream/__ds/jwks.json",
                ds("default", "/v1/stream", DsResource::Jwks),
            ),
            (
                "/v1/stream/__ds/subscriptions/sub-1",
                ds(
                    "default",
                    "/v1/stream",
                    DsResource::Subscription("sub-1".into()),
                ),
            ),
            (
                "/v1/stream/__ds/subscriptions/s/streams/manual%2Fb",
                ds(
                    "default",
                    "/v1/stream",
                    DsResource::Link("s".into(), "manual/b".into()),
                ),
            ),
            (
                "/v1/stream/__ds/subscriptions/s/streams/a/b",
                ds(
                    "default",
                    "/v1/stream",
                    DsResource::Link("s".into(), "a/b".into()),
                ),
            ),
            (
                "/demo/__ds/subscriptions/s/claim",
                ds("demo", "/demo", DsResource::Claim("s".into())),
            ),
            (
                "/demo/__ds/jwks.json",
                ds("demo", "/demo", DsResource::Jwks),
            ),
        ];
        for (path, expected) in cases {
            assert_eq!(parse(path, "default").unwrap(), expected, "{path}");
        }
    }

    #[test]
    fn refusals_name_the_cause() {
        let cases = [
            ("/", ErrorToken::NotFound),
            ("/ab", ErrorToken::InvalidBucketId),
            ("/Demo/x", ErrorToken::InvalidBucketId),
            ("/demo/", ErrorToken::InvalidStreamName),
            ("/demo/%zz", ErrorToken::InvalidStreamName),
            ("/demo/..", ErrorToken::InvalidStreamName),
            ("/demo/x/unknown", ErrorToken::NotFound),
            ("/v1/stream/", ErrorToken::InvalidStreamName),
            ("/v1/stream/a//b", ErrorToken::InvalidStreamName),
            ("/v1/stream/__ds", ErrorToken::NotFound),
            ("/v1/stream/__ds/other", ErrorToken::NotFound),
            (
                "/v1/stream/__ds/subscriptions/a%20b",
                ErrorToken::InvalidSubscription,
            ),
            (
                "/v1/stream/__ds/subscriptions/x/streams/a//b",
                ErrorToken::InvalidStreamName,
            ),
            ("/demo/__ds/subscriptions/x/unknown", ErrorToken::NotFound),
        ];
        for (path, token) in cases {
            assert_eq!(parse(path, "default").unwrap_err().token, token, "{path}");
        }
    }

    #[test]
    fn writes_are_named_from_the_request() {
        let append = Write::Append { staged: false };
        let cases = [
            (
                Target::Bucket("bkt".into()),
                Method::PUT,
                false,
                false,
                Some(Write::CreateBucket),
            ),
            (
                Target::Stream(stream("b", "s")),
                Method::PUT,
                false,
                true,
                Some(Write::CreateStream { staged: false }),
            ),
            (
                Target::Stream(stream("b", "s")),
                Method::POST,
                false,
                true,
                Some(append),
            ),
            (
                Target::Stream(stream("b", "s")),
                Method::POST,
                true,
                true,
                Some(append),
            ),
            (
                Target::Stream(stream("b", "s")),
                Method::POST,
                true,
                false,
                Some(Write::Close),
            ),
            (
                Target::Stream(stream("b", "s")),
                Method::DELETE,
                false,
                false,
                Some(Write::DeleteStream),
            ),
            (
                Target::Stream(stream("b", "s")),
                Method::GET,
                false,
                false,
                None,
            ),
            (
                Target::Bootstrap(stream("b", "s")),
                Method::PUT,
                false,
                true,
                None,
            ),
            (
                Target::Snapshot(stream("b", "s"), "1".into()),
                Method::PUT,
                false,
                true,
                Some(Write::PublishSnapshot),
            ),
            (
                Target::Retention(stream("b", "s"), "1".into()),
                Method::PUT,
                false,
                false,
                Some(Write::AdvanceRetention),
            ),
        ];
        for (target, method, closes, has_body, expected) in cases {
            assert_eq!(
                target.write(&method, closes, has_body),
                expected,
                "{target:?} {method}"
            );
        }
    }

    #[test]
    fn fork_references_resolve_in_both_families() {
        assert_eq!(
            parse_stream_reference("/v1/stream/src", "default").unwrap(),
            stream("default", "src")
        );
        assert_eq!(
            parse_stream_reference("http://host:4437/demo/src?x=1", "default").unwrap(),
            stream("demo", "src")
        );
        assert!(parse_stream_reference("/demo", "default").is_err());
    }
}
