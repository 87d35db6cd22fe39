//! A FAKE Kubernetes API server, in process, for reconcile tests until the e2e suite runs the
//! real kube-apiserver (issue 7). It keeps objects as JSON by URL path and implements only what
//! the reconcilers use: get, list (all objects of the kind in the namespace; label selectors
//! are ignored), server-side apply as a merge of the applied fields, the `status`
//! subresource, delete, and event creation. It does not validate schemas, run controllers or
//! track field managers.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{Value, json};
use tokio::net::TcpListener;

#[derive(Clone, Default)]
pub struct FakeApiServer {
    /// Objects by path, e.g. `/apis/apps/v1/namespaces/ns/statefulsets/uc`.
    pub objects: Arc<Mutex<BTreeMap<String, Value>>>,
    pub events: Arc<Mutex<Vec<Value>>>,
    pub deleted: Arc<Mutex<Vec<String>>>,
}

fn respond(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().expect("header"));
    response
}

fn not_found(path: &str) -> Response<Full<Bytes>> {
    respond(
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "reason": "NotFound", "code": 404, "message": format!("{path} not found")}),
    )
}

/// Applied fields replace the stored ones, objects merged key by key.
/// Whether `path` names a collection (`/api/v1/namespaces/ns/pods`), not one object in it.
fn is_collection(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.first() {
        // api/v1/{resource} or api/v1/namespaces/{ns}/{resource}
        Some(&"api") => segments.len() == 3 || segments.len() == 5,
        // apis/{group}/{version}/{resource} or .../namespaces/{ns}/{resource}
        Some(&"apis") => segments.len() == 4 || segments.len() == 6,
        _ => false,
    }
}

fn merge(stored: &mut Value, applied: &Value) {
    match (stored, applied) {
        (Value::Object(stored), Value::Object(applied)) => {
            for (key, value) in applied {
                match stored.get_mut(key) {
                    Some(existing) if existing.is_object() && value.is_object() => {
                        merge(existing, value)
                    }
                    _ => {
                        stored.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (stored, applied) => *stored = applied.clone(),
    }
}

impl FakeApiServer {
    pub async fn start(&self) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let server = server.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let server = server.clone();
                        async move { Ok::<_, Infallible>(server.handle(request).await) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        addr
    }

    pub fn put(&self, path: &str, object: Value) {
        self.objects.lock().unwrap().insert(path.to_owned(), object);
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.objects.lock().unwrap().get(path).cloned()
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let body = request
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut objects = self.objects.lock().unwrap();
        match method {
            Method::GET => {
                if let Some(object) = objects.get(&path) {
                    return respond(StatusCode::OK, object.clone());
                }
                // A list: every object directly under this path.
                let prefix = format!("{path}/");
                let items: Vec<Value> = objects
                    .iter()
                    .filter(|(key, _)| {
                        key.strip_prefix(&prefix)
                            .is_some_and(|rest| !rest.contains('/'))
                    })
                    .map(|(_, object)| object.clone())
                    .collect();
                if is_collection(&path) {
                    return respond(
                        StatusCode::OK,
                        json!({"apiVersion": "v1", "kind": "List",
                               "metadata": {"resourceVersion": "1"}, "items": items}),
                    );
                }
                not_found(&path)
            }
            Method::PATCH => {
                if let Some(object_path) = path.strip_suffix("/status") {
                    let Some(stored) = objects.get_mut(object_path) else {
                        return not_found(&path);
                    };
                    if let Some(status) = parsed.get("status") {
                        stored["status"] = status.clone();
                    }
                    return respond(StatusCode::OK, stored.clone());
                }
                let name = path.rsplit('/').next().unwrap_or_default().to_owned();
                let stored = objects.entry(path.clone()).or_insert_with(|| {
                    json!({"metadata": {"name": name, "uid": format!("uid-{name}"),
                                        "generation": 0, "resourceVersion": "1"}})
                });
                let before = stored.get("spec").cloned();
                merge(stored, &parsed);
                if stored.get("spec").cloned() != before || before.is_none() {
                    let generation = stored["metadata"]["generation"].as_i64().unwrap_or(0);
                    stored["metadata"]["generation"] = json!(generation + 1);
                }
                respond(StatusCode::OK, stored.clone())
            }
            Method::POST if path.ends_with("/events") => {
                self.events.lock().unwrap().push(parsed.clone());
                respond(StatusCode::CREATED, parsed)
            }
            // A create: 409 when the object exists, as the API server answers.
            Method::POST => {
                let name = parsed["metadata"]["name"].as_str().unwrap_or_default();
                let object_path = format!("{path}/{name}");
                if objects.contains_key(&object_path) {
                    return respond(
                        StatusCode::CONFLICT,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "reason": "AlreadyExists", "code": 409,
                               "message": format!("{object_path} already exists")}),
                    );
                }
                objects.insert(object_path, parsed.clone());
                respond(StatusCode::CREATED, parsed)
            }
            Method::DELETE => match objects.remove(&path) {
                Some(object) => {
                    self.deleted.lock().unwrap().push(path);
                    respond(StatusCode::OK, object)
                }
                None => not_found(&path),
            },
            _ => respond(
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"kind": "Status", "code": 405}),
            ),
        }
    }
}
