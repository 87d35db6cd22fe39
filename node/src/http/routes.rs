//! The client listener's route table, as the API overview lists the resources, and the thin
//! handlers that hand each route's extracted request to its module under `handlers`.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::routing::{MethodRouter, delete, get, post, put};
use bytes::Bytes;
use http::request::Parts;
use http::{Method, Response, Uri};

use super::error::ApiError;
use super::extract::{Admitted, BootstrapOf, BucketId, Led, RetentionAt, SnapshotAt, unrouted};
use super::layers::{Answers, ClientService};
use super::response::Body;
use super::route::Ds;
use super::{App, handlers, link};
use crate::machine::StreamPath;

type Answered = Result<Response<Body>, ApiError>;

/// The route table inside the layer every answer passes through.
pub fn service(app: Arc<App>) -> ClientService {
    Answers::new(app.clone(), router(app))
}

fn router(app: Arc<App>) -> Router {
    let stream = || -> MethodRouter<Arc<App>> {
        put(create_stream)
            .post(append)
            .get(read)
            .head(head)
            .delete(delete_stream)
    };
    let mut router = Router::new();
    // The `__ds` APIs under both families' roots; their static segments win over the stream
    // routes' parameters.
    for root in ["/v1/stream", "/{bucket}"] {
        router = router
            .route(&format!("{root}/__ds/jwks.json"), get(jwks).head(no_route))
            .route(
                &format!("{root}/__ds/subscriptions/{{id}}"),
                put(put_subscription)
                    .get(get_subscription)
                    .delete(delete_subscription)
                    .head(no_route),
            )
            .route(
                &format!("{root}/__ds/subscriptions/{{id}}/streams"),
                post(link_streams),
            )
            .route(
                &format!("{root}/__ds/subscriptions/{{id}}/streams/{{*path}}"),
                delete(unlink_stream),
            )
            .route(
                &format!("{root}/__ds/subscriptions/{{id}}/{{action}}"),
                post(wake_action),
            );
    }
    router
        // `/v1/stream/{name}`: the compatibility family, names in `server.compat_bucket`.
        .route("/v1/stream/{*name}", stream())
        .route("/{bucket}", put(create_bucket))
        .route("/{bucket}/{stream}", stream())
        // axum would answer a HEAD with the GET handler: these resources take no HEAD.
        .route(
            "/{bucket}/{stream}/bootstrap",
            get(bootstrap).head(no_route),
        )
        .route(
            "/{bucket}/{stream}/snapshot/{offset}",
            get(read_snapshot).head(no_route).put(publish_snapshot),
        )
        .route(
            "/{bucket}/{stream}/retention/{offset}",
            put(advance_retention),
        )
        .route(ursula_wire::link::PATH, get(gateway_link).head(no_route))
        .fallback(no_route)
        .method_not_allowed_fallback(no_route)
        .with_state(app)
}

/// The gateway link's requests take the same routes and layers as requests over HTTP.
async fn gateway_link(State(app): State<Arc<App>>, request: Request) -> Response<Body> {
    link::accept(app.clone(), request, service(app))
}

async fn no_route(State(app): State<Arc<App>>, method: Method, uri: Uri) -> ApiError {
    unrouted(&app, &method, uri.path())
}

async fn create_bucket(State(app): State<Arc<App>>, write: Admitted<BucketId>) -> Answered {
    write
        .answer(async |BucketId(bucket), _, _| handlers::bucket::create(&app, bucket).await)
        .await
}

async fn create_stream(State(app): State<Arc<App>>, write: Admitted<StreamPath>) -> Answered {
    write
        .answer(async |path, parts, body| handlers::create::handle(&app, parts, body, path).await)
        .await
}

async fn append(State(app): State<Arc<App>>, write: Admitted<StreamPath>) -> Answered {
    write
        .answer(async |path, parts, body| handlers::append::handle(&app, parts, body, path).await)
        .await
}

async fn delete_stream(State(app): State<Arc<App>>, write: Admitted<StreamPath>) -> Answered {
    write
        .answer(async |path, _, _| handlers::meta::delete(&app, path).await)
        .await
}

async fn publish_snapshot(State(app): State<Arc<App>>, write: Admitted<SnapshotAt>) -> Answered {
    write
        .answer(async |SnapshotAt(path, offset), parts, body| {
            handlers::snapshot::publish(&app, parts, body, path, &offset).await
        })
        .await
}

async fn advance_retention(State(app): State<Arc<App>>, write: Admitted<RetentionAt>) -> Answered {
    write
        .answer(async |RetentionAt(path, offset), _, _| {
            handlers::snapshot::retain(&app, path, &offset).await
        })
        .await
}

async fn jwks(State(app): State<Arc<App>>) -> Response<Body> {
    handlers::subscriptions::jwks(&app)
}

/// A `__ds` write: its refusals in the protocol's shape.
async fn ds_write<F>(write: Admitted<Ds>, handler: impl FnOnce(Ds, Parts, Bytes) -> F) -> Answered
where
    F: Future<Output = Answered>,
{
    write
        .answer(handler)
        .await
        .map_err(ApiError::in_protocol_shape)
}

async fn put_subscription(State(app): State<Arc<App>>, write: Admitted<Ds>) -> Answered {
    ds_write(write, async |ds, parts, body| {
        handlers::subscriptions::put(&app, &parts, body, ds).await
    })
    .await
}

async fn get_subscription(State(app): State<Arc<App>>, Led(ds): Led<Ds>) -> Answered {
    handlers::subscriptions::get(&app, &ds).map_err(ApiError::in_protocol_shape)
}

async fn delete_subscription(State(app): State<Arc<App>>, write: Admitted<Ds>) -> Answered {
    ds_write(write, async |ds, _, _| {
        handlers::subscriptions::delete(&app, ds).await
    })
    .await
}

async fn link_streams(State(app): State<Arc<App>>, write: Admitted<Ds>) -> Answered {
    ds_write(write, async |ds, _, body| {
        handlers::subscriptions::link(&app, body, ds).await
    })
    .await
}

async fn unlink_stream(State(app): State<Arc<App>>, write: Admitted<Ds>) -> Answered {
    ds_write(write, async |ds, _, _| {
        handlers::subscriptions::unlink(&app, ds).await
    })
    .await
}

async fn wake_action(State(app): State<Arc<App>>, write: Admitted<Ds>) -> Answered {
    ds_write(write, async |ds, parts, body| {
        handlers::subscriptions::wake_action(&app, &parts, body, ds).await
    })
    .await
}

async fn read(
    State(app): State<Arc<App>>,
    Led(path): Led<StreamPath>,
    request: Request,
) -> Answered {
    handlers::read::handle(&app, request, path).await
}

async fn head(State(app): State<Arc<App>>, Led(path): Led<StreamPath>) -> Answered {
    handlers::meta::head(&app, &path)
}

async fn bootstrap(
    State(app): State<Arc<App>>,
    Led(BootstrapOf(path)): Led<BootstrapOf>,
) -> Answered {
    handlers::snapshot::bootstrap(&app, &path).await
}

async fn read_snapshot(
    State(app): State<Arc<App>>,
    Led(SnapshotAt(path, offset)): Led<SnapshotAt>,
) -> Answered {
    handlers::snapshot::read(&app, &path, &offset).await
}
