//! The reconcilers against a FAKE in-process Kubernetes API server (see
//! `support/fake_apiserver.rs`; the real kube-apiserver comes with the e2e suite) and a FAKE
//! node admin listener that records drains and answers purges.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};
use support::fake_apiserver::FakeApiServer;
use tokio::net::TcpListener;
use ursula_operator::controller::{self, Context};
use ursula_operator::crd::{BucketPurge, UrsulaCluster};
use ursula_operator::nodes::Nodes;
use ursula_operator::purge;
use ursula_operator::upgrade::Limits;

const NS: &str = "ns";
const CLUSTER: &str = "/apis/ursula.io/v1alpha1/namespaces/ns/ursulaclusters/uc";
const SET: &str = "/apis/apps/v1/namespaces/ns/statefulsets/uc";
const GATEWAYS: &str = "/apis/apps/v1/namespaces/ns/deployments/uc-gateway";

/// A FAKE node admin listener: records every request path, answers purges.
async fn fake_admin(seen: Arc<Mutex<Vec<String>>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let path = request.uri().path().to_owned();
                        // Membership reports are what the operator observes, not what it
                        // does; these voters give none (the planner then changes nothing).
                        if path == "/admin/membership" {
                            let mut response = http::Response::new(Full::new(Bytes::new()));
                            *response.status_mut() = http::StatusCode::NOT_FOUND;
                            return Ok::<_, std::convert::Infallible>(response);
                        }
                        // What a node checks: the admin token, as a bearer token.
                        let token = request
                            .headers()
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("no token")
                            .to_owned();
                        seen.lock().unwrap().push(format!("{path} {token}"));
                        let body = match path.split('/').collect::<Vec<_>>().as_slice() {
                            ["", "admin", "buckets", bucket, "purge"] => json!({
                                "bucket": bucket, "purged_streams": 4, "fenced": true
                            })
                            .to_string(),
                            _ => "{}".to_owned(),
                        };
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from(body),
                        )))
                    }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

struct Setup {
    api: FakeApiServer,
    ctx: Arc<Context>,
    admin_seen: Arc<Mutex<Vec<String>>>,
}

async fn setup() -> Setup {
    let api = FakeApiServer::default();
    let addr = api.start().await;
    let config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
    let client = kube::Client::try_from(config).expect("client");
    let admin_seen = Arc::new(Mutex::new(Vec::new()));
    let admin = fake_admin(admin_seen.clone()).await;
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(
            client,
            Reporter {
                controller: "ursula-operator".into(),
                instance: None,
            },
        ),
        nodes: Nodes::with_admin(Arc::new(move |_, _| admin.clone())),
        limits: Limits {
            ready_timeout: Duration::from_secs(600),
        },
        namespace: Some("ursula-system".into()),
    });
    Setup {
        api,
        ctx,
        admin_seen,
    }
}

fn cluster(version: &str) -> Value {
    json!({
        "apiVersion": "ursula.io/v1alpha1", "kind": "UrsulaCluster",
        "metadata": {"name": "uc", "namespace": NS, "uid": "uid-uc", "generation": 1},
        "spec": {"version": version, "voters": 3, "storage": {"size": "1Gi"}}
    })
}

fn pod(ordinal: u8, version: &str, ready: bool) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("uc-{ordinal}"), "namespace": NS},
        "spec": {"containers": [{"name": "node", "image": format!("reg/ursula-node:{version}")}]},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    })
}

fn image(object: &Value) -> String {
    object["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Marks the gateway Deployment as fully rolled out at its current generation.
fn gateways_rolled_out(api: &FakeApiServer) {
    let mut deployment = api.get(GATEWAYS).expect("the gateway Deployment");
    let generation = deployment["metadata"]["generation"].clone();
    deployment["status"] = json!({"observedGeneration": generation, "replicas": 2,
                                  "updatedReplicas": 2, "availableReplicas": 2});
    api.put(GATEWAYS, deployment);
}

async fn reconcile(setup: &Setup) -> Value {
    let object: UrsulaCluster =
        serde_json::from_value(setup.api.get(CLUSTER).expect("cluster")).expect("typed");
    controller::reconcile(Arc::new(object), setup.ctx.clone())
        .await
        .expect("reconcile");
    setup.api.get(CLUSTER).expect("cluster")
}

/// The admin token the operator made for the cluster, as its Secret holds it.
fn admin_token(api: &FakeApiServer) -> String {
    let secret = api
        .get("/api/v1/namespaces/ns/secrets/uc-admin-token")
        .expect("the admin token Secret");
    let token: k8s_openapi::ByteString =
        serde_json::from_value(secret["data"]["token"].clone()).expect("base64");
    String::from_utf8(token.0).expect("UTF-8")
}

/// A field of the cluster's condition `type_` ("" when absent).
fn condition_field(cluster: &Value, type_: &str, field: &str) -> String {
    cluster["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .map(|c| c[field].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

fn condition(cluster: &Value, type_: &str) -> String {
    condition_field(cluster, type_, "status")
}

fn condition_message(cluster: &Value, type_: &str) -> String {
    condition_field(cluster, type_, "message")
}

#[tokio::test]
async fn fake_api_a_new_cluster_gets_every_object_at_its_version() {
    let setup = setup().await;
    setup.api.put(CLUSTER, cluster("0.7.2"));
    let status = reconcile(&setup).await;
    for path in [
        "/api/v1/namespaces/ns/configmaps/uc-config",
        "/api/v1/namespaces/ns/services/uc-headless",
        "/api/v1/namespaces/ns/services/uc",
        "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/uc-voters",
        "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/uc-voters",
        "/api/v1/namespaces/ns/secrets/uc-admin-token",
        "/api/v1/namespaces/ns/secrets/uc-ca",
        "/api/v1/namespaces/ns/secrets/uc-cluster-tls",
    ] {
        assert!(setup.api.get(path).is_some(), "{path} was not applied");
    }
    assert_eq!(admin_token(&setup.api).len(), 64);
    assert_eq!(condition(&status, "CertificatesReady"), "True");
    // A second reconcile keeps the token and the certificates.
    let tls = setup
        .api
        .get("/api/v1/namespaces/ns/secrets/uc-cluster-tls");
    let token = admin_token(&setup.api);
    reconcile(&setup).await;
    assert_eq!(admin_token(&setup.api), token);
    assert_eq!(
        setup
            .api
            .get("/api/v1/namespaces/ns/secrets/uc-cluster-tls"),
        tls
    );
    assert!(image(&setup.api.get(SET).expect("voters")).ends_with(":0.7.2"));
    assert!(image(&setup.api.get(GATEWAYS).expect("gateways")).ends_with(":0.7.2"));
    // Pods are not ready yet: progressing, not available.
    assert_eq!(condition(&status, "Available"), "False");
    assert_eq!(condition(&status, "Progressing"), "True");
    assert_eq!(status["status"]["observedGeneration"], 1);
}

#[tokio::test]
async fn fake_api_with_an_issuer_ref_cert_manager_issues_the_voters_certificates() {
    let setup = setup().await;
    let mut object = cluster("0.7.2");
    object["spec"]["tls"] = json!({"issuerRef": {"name": "ursula-ca", "kind": "ClusterIssuer"}});
    setup.api.put(CLUSTER, object);
    // Left from when the cluster had 5 voters, and one another owner keeps.
    let leftover = |name: &str, owner: &str| {
        json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": name, "namespace": NS, "ownerReferences": [{
                "apiVersion": "ursula.io/v1alpha1", "kind": "UrsulaCluster", "name": "uc",
                "uid": owner, "controller": true}]},
            "spec": {"secretName": format!("{name}-tls")},
        })
    };
    let certificates = "/apis/cert-manager.io/v1/namespaces/ns/certificates";
    setup.api.put(
        &format!("{certificates}/uc-node-5"),
        leftover("uc-node-5", "uid-uc"),
    );
    setup.api.put(
        &format!("{certificates}/someone-elses"),
        leftover("someone-elses", "uid-other"),
    );
    let waiting = reconcile(&setup).await;
    for id in 1..=3 {
        let path = format!("/apis/cert-manager.io/v1/namespaces/ns/certificates/uc-node-{id}");
        let certificate = setup.api.get(&path).expect("a Certificate per voter");
        assert_eq!(
            certificate["spec"]["secretName"],
            format!("uc-node-{id}-tls")
        );
        assert_eq!(certificate["spec"]["issuerRef"]["name"], "ursula-ca");
        assert_eq!(
            certificate["spec"]["dnsNames"][0],
            format!("node-{id}.ursula.internal")
        );
    }
    assert!(
        setup
            .api
            .get(&format!("{certificates}/uc-node-5"))
            .is_none(),
        "a voter the cluster no longer has keeps no Certificate"
    );
    assert!(
        setup
            .api
            .get(&format!("{certificates}/someone-elses"))
            .is_some()
    );
    for own in ["uc-ca", "uc-cluster-tls"] {
        let path = format!("/api/v1/namespaces/ns/secrets/{own}");
        assert!(setup.api.get(&path).is_none(), "{own}: cert-manager issues");
    }
    assert!(
        setup
            .api
            .get("/api/v1/namespaces/ns/secrets/uc-admin-token")
            .is_some()
    );
    assert_eq!(condition(&waiting, "CertificatesReady"), "False");
    let message = condition_message(&waiting, "CertificatesReady");
    assert!(
        message.contains("uc-node-1-tls") && message.contains("uc-node-3-tls"),
        "{message}"
    );

    // cert-manager writes the Secrets (as its CA issuer does: the CA in each).
    let pem = |text: &str| k8s_openapi::ByteString(text.as_bytes().to_vec());
    for id in 1..=3 {
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": format!("uc-node-{id}-tls"), "namespace": NS},
            "data": {"tls.crt": pem("cert"), "tls.key": pem("key"), "ca.crt": pem("ca")},
        });
        setup.api.put(
            &format!("/api/v1/namespaces/ns/secrets/uc-node-{id}-tls"),
            secret,
        );
    }
    let issued = reconcile(&setup).await;
    assert_eq!(condition(&issued, "CertificatesReady"), "True");
    assert!(condition_message(&issued, "CertificatesReady").contains("ClusterIssuer ursula-ca"));
}

#[tokio::test]
async fn fake_api_an_upgrade_rolls_gateways_then_drains_and_replaces_voters_one_at_a_time() {
    let setup = setup().await;
    // A running cluster at 0.7.2.
    setup.api.put(CLUSTER, cluster("0.7.2"));
    reconcile(&setup).await;
    gateways_rolled_out(&setup.api);
    for ordinal in 0..3 {
        setup.api.put(
            &format!("/api/v1/namespaces/ns/pods/uc-{ordinal}"),
            pod(ordinal, "0.7.2", true),
        );
    }
    let settled = reconcile(&setup).await;
    assert_eq!(condition(&settled, "Available"), "True");
    assert_eq!(settled["status"]["readyVoters"], 3);
    assert_eq!(settled["status"]["readyGateways"], 2);
    assert_eq!(condition(&settled, "Progressing"), "False");

    // Version bump: gateways first, voters untouched.
    setup.api.put(CLUSTER, cluster("0.7.3"));
    let step = reconcile(&setup).await;
    assert!(image(&setup.api.get(GATEWAYS).unwrap()).ends_with(":0.7.3"));
    assert!(image(&setup.api.get(SET).unwrap()).ends_with(":0.7.2"));
    assert_eq!(step["status"]["upgradeStep"], "gateways");
    assert_eq!(condition(&step, "Upgrading"), "True");
    // Still rolling out: nothing more happens.
    reconcile(&setup).await;
    assert!(image(&setup.api.get(SET).unwrap()).ends_with(":0.7.2"));
    assert!(setup.admin_seen.lock().unwrap().is_empty());

    // Gateways done: the voters' template, then the highest ordinal is drained and deleted.
    gateways_rolled_out(&setup.api);
    reconcile(&setup).await;
    assert!(image(&setup.api.get(SET).unwrap()).ends_with(":0.7.3"));
    assert!(setup.api.deleted.lock().unwrap().is_empty());
    let replacing = reconcile(&setup).await;
    assert_eq!(replacing["status"]["upgradeStep"], "voter 2");
    assert_eq!(
        *setup.admin_seen.lock().unwrap(),
        vec![format!("/admin/drain Bearer {}", admin_token(&setup.api))]
    );
    assert_eq!(
        *setup.api.deleted.lock().unwrap(),
        vec!["/api/v1/namespaces/ns/pods/uc-2".to_owned()]
    );
    // While voter 2 is away, nobody else is touched.
    reconcile(&setup).await;
    assert_eq!(setup.api.deleted.lock().unwrap().len(), 1);
    // It comes back at 0.7.3: voter 1 next.
    setup
        .api
        .put("/api/v1/namespaces/ns/pods/uc-2", pod(2, "0.7.3", true));
    reconcile(&setup).await;
    assert_eq!(
        setup.api.deleted.lock().unwrap().last().map(String::as_str),
        Some("/api/v1/namespaces/ns/pods/uc-1")
    );
    let events = setup.api.events.lock().unwrap();
    let reasons: Vec<&str> = events.iter().filter_map(|e| e["reason"].as_str()).collect();
    assert!(reasons.contains(&"RollingGateways"), "{reasons:?}");
    assert!(reasons.contains(&"ReplacingVoter"), "{reasons:?}");
}

#[tokio::test]
async fn fake_api_a_bucket_purge_succeeds_through_a_voter_and_is_not_repeated() {
    let setup = setup().await;
    setup.api.put(CLUSTER, cluster("0.7.2"));
    // The cluster's reconciler makes its admin token.
    reconcile(&setup).await;
    let path = "/apis/ursula.io/v1alpha1/namespaces/ns/bucketpurges/p";
    setup.api.put(
        path,
        json!({"apiVersion": "ursula.io/v1alpha1", "kind": "BucketPurge",
               "metadata": {"name": "p", "namespace": NS, "uid": "uid-p"},
               "spec": {"cluster": "uc", "bucket": "old-data"}}),
    );
    let object: BucketPurge = serde_json::from_value(setup.api.get(path).unwrap()).unwrap();
    purge::reconcile(Arc::new(object), setup.ctx.clone())
        .await
        .expect("reconcile");
    let done = setup.api.get(path).unwrap();
    assert_eq!(done["status"]["phase"], "Succeeded");
    assert_eq!(done["status"]["purgedStreams"], 4);
    assert_eq!(
        *setup.admin_seen.lock().unwrap(),
        vec![format!(
            "/admin/buckets/old-data/purge Bearer {}",
            admin_token(&setup.api)
        )]
    );
    // Finished: a later reconcile does not purge again.
    let object: BucketPurge = serde_json::from_value(done).unwrap();
    purge::reconcile(Arc::new(object), setup.ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(setup.admin_seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn fake_api_a_rollback_replaces_voters_before_gateways() {
    let setup = setup().await;
    // A cluster fully at 0.7.3.
    setup.api.put(CLUSTER, cluster("0.7.3"));
    reconcile(&setup).await;
    gateways_rolled_out(&setup.api);
    for ordinal in 0..3 {
        setup.api.put(
            &format!("/api/v1/namespaces/ns/pods/uc-{ordinal}"),
            pod(ordinal, "0.7.3", true),
        );
    }
    reconcile(&setup).await;
    // Back to 0.7.2: the voters' template first, then voter 2; gateways stay at 0.7.3.
    setup.api.put(CLUSTER, cluster("0.7.2"));
    reconcile(&setup).await;
    assert!(image(&setup.api.get(SET).unwrap()).ends_with(":0.7.2"));
    assert!(image(&setup.api.get(GATEWAYS).unwrap()).ends_with(":0.7.3"));
    let step = reconcile(&setup).await;
    assert_eq!(step["status"]["upgradeStep"], "voter 2");
    assert!(image(&setup.api.get(GATEWAYS).unwrap()).ends_with(":0.7.3"));
    // Every voter back at 0.7.2: only now the gateways.
    for ordinal in 0..3 {
        setup.api.put(
            &format!("/api/v1/namespaces/ns/pods/uc-{ordinal}"),
            pod(ordinal, "0.7.2", true),
        );
    }
    let gateways = reconcile(&setup).await;
    assert_eq!(gateways["status"]["upgradeStep"], "gateways");
    assert!(image(&setup.api.get(GATEWAYS).unwrap()).ends_with(":0.7.2"));
}

#[tokio::test]
async fn fake_api_an_invalid_spec_is_reported_degraded_and_changes_nothing() {
    let setup = setup().await;
    let mut invalid = cluster("0.7.2");
    invalid["spec"]["nodeConfig"] = json!({"raft.group_count": 32});
    setup.api.put(CLUSTER, invalid);
    let status = reconcile(&setup).await;
    assert_eq!(condition(&status, "Degraded"), "True");
    let degraded = status["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap()
        .clone();
    assert_eq!(degraded["reason"], "InvalidSpec");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap()
            .contains("raft.group_count")
    );
    assert!(setup.api.get(SET).is_none(), "nothing was applied");
    let events = setup.api.events.lock().unwrap();
    assert!(events.iter().any(|e| e["reason"] == "InvalidSpec"));
}
