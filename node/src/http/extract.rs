//! Extractors: what a handler may rely on before it runs. A read names a resource of a group
//! this node leads; a write has passed admission, its body has been read within the budget
//! it holds, and leadership was checked where the node checks it (`marking::Write`).

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Request};
use bytes::Bytes;
use http::Method;
use http::request::Parts;
use ursula_wire::{ErrorToken, headers};

use super::App;
use super::error::ApiError;
use super::marking::Write;
use super::request;
use super::response::Body;
use super::route::{self, Ds, DsResource, Target};
use crate::admission::BodyPermit;
use crate::machine::StreamPath;

/// The part of a request's target a route's handler takes; the target back when the path is
/// not one this route's resources have (a route table and `route::parse` that disagreed).
pub trait Resource: Sized + Send {
    fn of(target: Target) -> Result<Self, Target>;
}

impl Resource for StreamPath {
    fn of(target: Target) -> Result<Self, Target> {
        match target {
            Target::Stream(path) => Ok(path),
            other => Err(other),
        }
    }
}

/// `/{bucket}`.
pub struct BucketId(pub String);

impl Resource for Ds {
    fn of(target: Target) -> Result<Self, Target> {
        match target {
            Target::Subscriptions(ds) => Ok(ds),
            other => Err(other),
        }
    }
}

/// `.../bootstrap`.
pub struct BootstrapOf(pub StreamPath);

/// `.../snapshot/{offset}`.
pub struct SnapshotAt(pub StreamPath, pub String);

/// `.../retention/{offset}`.
pub struct RetentionAt(pub StreamPath, pub String);

impl Resource for BucketId {
    fn of(target: Target) -> Result<Self, Target> {
        match target {
            Target::Bucket(bucket) => Ok(Self(bucket)),
            other => Err(other),
        }
    }
}

impl Resource for BootstrapOf {
    fn of(target: Target) -> Result<Self, Target> {
        match target {
            Target::Bootstrap(path) => Ok(Self(path)),
            other => Err(other),
        }
    }
}

impl Resource for SnapshotAt {
    fn of(target: Target) -> Result<Self, Target> {
        match target {
            Target::Snapshot(path, offset) => Ok(Self(path, offset)),
            other => Err(other),
        }
    }
}

impl Resource for RetentionAt {
    fn of(target: Target) -> Result<Self, Target> {
        match target {
            Target::Retention(path, offset) => Ok(Self(path, offset)),
            other => Err(other),
        }
    }
}

/// The resource a read names, in a group this node hosts and leads, once it has applied every
/// acknowledged write (`Engine::ready_to_read`).
pub struct Led<R>(pub R);

impl<R: Resource> FromRequestParts<Arc<App>> for Led<R> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        let target = app.target(parts.uri.path())?;
        app.require_leader(target.bucket())?;
        if !app.engine(target.bucket())?.ready_to_read().await {
            return Err(ApiError::leader_not_caught_up());
        }
        R::of(target)
            .map(Self)
            .map_err(|target| method_not_allowed(&target, &parts.method))
    }
}

/// A write that passed admission, with its body.
pub struct Admitted<R> {
    resource: R,
    write: Write,
    parts: Parts,
    body: Bytes,
    /// The body's share of `server.http_inflight_body_size`, held until the answer is ready.
    permit: BodyPermit,
}

impl<R: Resource> FromRequest<Arc<App>> for Admitted<R> {
    type Rejection = ApiError;

    async fn from_request(request: Request, app: &Arc<App>) -> Result<Self, ApiError> {
        let (parts, body) = request.into_parts();
        let target = route::parse(parts.uri.path(), &app.config.server.compat_bucket)?;
        let declared = request::content_length(&parts.headers);
        let has_body = match declared {
            Ok(Some(len)) => len > 0,
            _ => parts.headers.contains_key(http::header::TRANSFER_ENCODING),
        };
        let closes = request::flag(&parts.headers, headers::STREAM_CLOSED);
        let Some(write) = target.write(&parts.method, closes, has_body) else {
            return Err(method_not_allowed(&target, &parts.method));
        };
        let refused = |error: ApiError| error.during(Some(write));
        let declared = declared.map_err(refused)?;
        // A group this node does not host: sent to a node that does.
        let engine = app.engine(target.bucket()).map_err(refused)?;
        let limit = match write {
            Write::PublishSnapshot => app.config.server.max_snapshot_size,
            _ => app.config.server.max_append_size,
        };
        let mut permit = app
            .admission
            .admit(has_body, declared, limit)
            .map_err(|refusal| refused(refusal.into()))?;
        let body = request::body(&parts.headers, body, limit, &mut permit)
            .await
            .map_err(refused)?;
        let write = write.staged(engine.stages(body.len() as u64));
        // Checked once the body is in: a client still sending a large body to a node that
        // answered early would get a broken pipe instead of the redirect.
        if write.checks_leadership() {
            app.require_leader(target.bucket())
                .map_err(|error| error.during(Some(write)))?;
        }
        let resource =
            R::of(target).map_err(|target| method_not_allowed(&target, &parts.method))?;
        Ok(Self {
            resource,
            write,
            parts,
            body,
            permit,
        })
    }
}

impl<R> Admitted<R> {
    /// Runs the write's handler on its resource, request head and body; its refusals name the
    /// write, for the marker. The body's budget is given back once the answer is ready.
    pub async fn answer<F>(
        self,
        handler: impl FnOnce(R, Parts, Bytes) -> F,
    ) -> Result<http::Response<Body>, ApiError>
    where
        F: Future<Output = Result<http::Response<Body>, ApiError>>,
    {
        let Self {
            resource,
            write,
            parts,
            body,
            permit,
        } = self;
        let answer = handler(resource, parts, body).await;
        drop(permit);
        answer.map_err(|error| error.during(Some(write)))
    }
}

/// What a path and method no route takes get: the path's own refusal (a bad bucket ID or
/// stream name, no such route), or 405 naming the methods its resource allows.
pub fn unrouted(app: &App, method: &Method, path: &str) -> ApiError {
    match route::parse(path, &app.config.server.compat_bucket) {
        Ok(target) => method_not_allowed(&target, method),
        Err(error) => error,
    }
}

pub fn method_not_allowed(target: &Target, method: &Method) -> ApiError {
    let allowed = match target {
        Target::Bucket(_) => "PUT, OPTIONS",
        Target::Stream(_) => "PUT, POST, GET, HEAD, DELETE, OPTIONS",
        Target::Bootstrap(_) => "GET, OPTIONS",
        Target::Snapshot(..) => "GET, PUT, OPTIONS",
        Target::Retention(..) => "PUT, OPTIONS",
        Target::Subscriptions(ds) => match ds.resource {
            DsResource::Jwks => "GET, OPTIONS",
            DsResource::Subscription(_) => "PUT, GET, DELETE, OPTIONS",
            DsResource::Link(..) => "DELETE, OPTIONS",
            _ => "POST, OPTIONS",
        },
    };
    ApiError::new(
        ErrorToken::MethodNotAllowed,
        format!("{method} is not allowed here; allowed: {allowed}"),
    )
    .with_header("allow", allowed)
}
