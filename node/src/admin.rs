//! The admin listener: health, readiness and metrics. It is a separate socket from the client
//! listener, so nothing here is reachable through the client port.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use ursula_wire::ErrorToken;

use crate::engine::Engine;
use crate::http::error::ApiError;
use crate::http::response::{Body, Reply, add_common_headers};

pub struct Admin {
    pub engine: Arc<Engine>,
    /// Set once the client listener is serving.
    pub ready: AtomicBool,
}

pub async fn serve(listener: TcpListener, admin: Arc<Admin>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(admin.clone(), request));
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    admin: Arc<Admin>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let mut response = route(&admin, &request).unwrap_or_else(ApiError::into_response);
    add_common_headers(response.headers_mut(), false);
    Ok(response)
}

fn route(admin: &Admin, request: &Request<Incoming>) -> Result<Response<Body>, ApiError> {
    if request.method() != Method::GET {
        return Err(ApiError::new(
            ErrorToken::MethodNotAllowed,
            format!("{} is not allowed on the admin listener", request.method()),
        ));
    }
    match request.uri().path() {
        "/healthz" => Ok(json(StatusCode::OK, r#"{"status":"ok"}"#)),
        "/readyz" => {
            if admin.ready.load(Ordering::Acquire) {
                Ok(json(StatusCode::OK, r#"{"status":"ready"}"#))
            } else {
                Err(ApiError::new(
                    ErrorToken::Unavailable,
                    "the node is starting",
                ))
            }
        }
        "/metrics" => {
            let mut text = String::with_capacity(4096);
            admin.engine.metrics.render(&mut text);
            Ok(Reply::new(StatusCode::OK)
                .header("content-type", "text/plain; version=0.0.4")
                .body(text)
                .build())
        }
        other => Err(ApiError::new(
            ErrorToken::NotFound,
            format!("no admin route {other:?}"),
        )),
    }
}

fn json(status: StatusCode, body: &'static str) -> Response<Body> {
    Reply::new(status)
        .header("content-type", "application/json")
        .body(body)
        .build()
}
