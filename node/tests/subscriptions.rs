//! Subscriptions on real processes: a webhook that keeps being delivered when its group's
//! leader is SIGKILLed (a new generation, the old one fenced, the acknowledgement kept), a
//! pull-wake claim whose lease runs out going to another worker, and webhook URLs that could
//! reach something private refused with nothing created.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use ursula_testkit::cluster::TestCluster;
use ursula_testkit::node::NodeProcess;
use ursula_testkit::webhook::{self, Delivery, Receiver};
use ursula_testkit::{Client, Reply, runtime};

const JSON: &[(&str, &str)] = &[("content-type", "application/json")];
const TEXT: &[(&str, &str)] = &[("content-type", "text/plain")];
const PATIENCE: Duration = Duration::from_secs(20);

fn body(reply: &Reply) -> Value {
    serde_json::from_slice(&reply.body).unwrap_or(Value::Null)
}

fn path_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.find('/')
        .map_or("/".into(), |at| rest[at..].to_owned())
}

/// The signature is Ed25519 over `"<t>.<raw body>"` by the JWKS key it names.
fn signed_by(delivery: &Delivery, jwks: &Value) -> bool {
    let Some(header) = &delivery.signature else {
        return false;
    };
    let parts: Vec<&str> = header.split(',').collect();
    let [t, kid, sig] = parts.as_slice() else {
        return false;
    };
    let (Some(t), Some(kid), Some(sig)) = (
        t.strip_prefix("t="),
        kid.strip_prefix("kid="),
        sig.strip_prefix("ed25519="),
    ) else {
        return false;
    };
    let Some(key) = jwks["keys"]
        .as_array()
        .and_then(|keys| keys.iter().find(|k| k["kid"] == kid))
    else {
        return false;
    };
    let public = URL_SAFE_NO_PAD
        .decode(key["x"].as_str().unwrap_or_default())
        .unwrap_or_default();
    let signature = URL_SAFE_NO_PAD.decode(sig).unwrap_or_default();
    let mut signed = format!("{t}.").into_bytes();
    signed.extend_from_slice(&delivery.raw);
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public)
        .verify(&signed, &signature)
        .is_ok()
}

fn generation(delivery: &Delivery) -> u64 {
    delivery.body["generation"].as_u64().unwrap_or(0)
}

async fn send(
    cluster: &TestCluster,
    first: usize,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> Reply {
    let body = if body.is_null() {
        Bytes::new()
    } else {
        Bytes::from(body.to_string())
    };
    cluster
        .send(first, method.clone(), path, headers, body, PATIENCE)
        .await
        .unwrap_or_else(|| panic!("{method} {path}: no answer"))
}

#[test]
fn a_webhook_keeps_being_delivered_when_its_groups_leader_is_killed() {
    runtime().block_on(async {
        let cluster = TestCluster::start(3, "");
        cluster.wait_ready().await;
        let receiver = Receiver::start().await;
        let group = cluster.group_of("default");
        let leader = cluster.leader_of(group).await.expect("a leader");
        // Created through a follower, which carries it to the leader.
        let follower = (leader + 1) % 3;
        let spec = json!({
            "type": "webhook",
            "pattern": "events/*",
            "webhook": { "url": receiver.url() },
            "lease_ttl_ms": 60_000,
        });
        let sub = "/v1/stream/__ds/subscriptions/failover";
        let created = cluster.voters[follower]
            .client()
            .put(sub, JSON, spec.to_string())
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
        let jwks_url = path_of(
            body(&created)["webhook"]["signing"]["jwks_url"]
                .as_str()
                .unwrap(),
        );
        let again = cluster.voters[leader]
            .client()
            .put(sub, JSON, spec.to_string())
            .await;
        assert_eq!(again.status, StatusCode::OK, "the same subscription again");

        let stream = "/v1/stream/events/a";
        let put = send(&cluster, follower, Method::PUT, stream, TEXT, Value::Null).await;
        assert_eq!(put.status, StatusCode::CREATED);
        let appended = cluster
            .send(
                follower,
                Method::POST,
                stream,
                TEXT,
                Bytes::from_static(b"hello"),
                PATIENCE,
            )
            .await
            .expect("append");
        assert_eq!(appended.status, StatusCode::NO_CONTENT);
        let tail = appended
            .header("stream-next-offset")
            .expect("tail")
            .to_owned();

        let first = receiver
            .wait_for(PATIENCE, |d| d.body["subscription_id"] == "failover")
            .await
            .expect("the first wake is delivered");
        // Every voter serves the same key, which signed the request.
        for voter in &cluster.voters {
            let jwks = body(&voter.client().get(&jwks_url).await);
            assert!(
                signed_by(&first, &jwks),
                "voter {} does not vouch for the signature",
                voter.id
            );
        }

        cluster.kill(leader);
        let second = receiver
            .wait_for(PATIENCE, |d| generation(d) > generation(&first))
            .await
            .expect("the new leader delivers the wake again, under a new generation");
        assert!(signed_by(
            &second,
            &body(&cluster.voters[follower].client().get(&jwks_url).await)
        ));

        let callback = path_of(second.body["callback_url"].as_str().expect("callback_url"));
        // An acknowledgement, through a follower, of `wake` that it is done, with `bearer`.
        let ack = async |wake: &Delivery, bearer: &str| {
            let done = webhook::done_ack(&wake.body, "events/a", &tail);
            let headers = [
                ("content-type", "application/json"),
                ("authorization", bearer),
            ];
            send(&cluster, follower, Method::POST, &callback, &headers, done).await
        };
        let stale = ack(&first, &webhook::bearer(&first.body)).await;
        assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.text());
        assert_eq!(body(&stale)["error"]["code"], "FENCED");
        let forged = ack(&second, "Bearer bm90LWEtdG9rZW4").await;
        assert_eq!(forged.status, StatusCode::UNAUTHORIZED, "{}", forged.text());
        let acked = ack(&second, &webhook::bearer(&second.body)).await;
        assert_eq!(acked.status, StatusCode::OK, "{}", acked.text());
        assert_eq!(body(&acked), json!({ "ok": true, "next_wake": false }));

        // The acknowledgement survives the next failover too.
        cluster.restart(leader);
        cluster.wait_ready().await;
        let now_leading = cluster.leader_of(group).await.expect("a leader");
        cluster.kill(now_leading);
        let read = send(&cluster, leader, Method::GET, sub, &[], Value::Null).await;
        assert_eq!(read.status, StatusCode::OK, "{}", read.text());
        let streams = body(&read)["streams"].clone();
        let link = streams
            .as_array()
            .and_then(|s| s.iter().find(|s| s["path"] == "events/a"))
            .unwrap_or_else(|| panic!("events/a is followed: {streams}"));
        assert_eq!(link["acked_offset"], tail.as_str());
        assert_eq!(link["has_pending"], false);
    });
}

async fn claim(client: &Client, sub: &str, worker: &str) -> Reply {
    client
        .post(
            &format!("{sub}/claim"),
            JSON,
            json!({ "worker": worker }).to_string(),
        )
        .await
}

#[test]
fn a_pull_wake_claim_whose_lease_runs_out_goes_to_another_worker() {
    runtime().block_on(async {
        let node = NodeProcess::in_temp_dir();
        let client = node.client();
        let wake_stream = "/v1/stream/wake/pool";
        assert_eq!(client.put(wake_stream, JSON, "[]").await.status, StatusCode::CREATED);
        let sub = "/v1/stream/__ds/subscriptions/pool";
        let spec = json!({ "type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wake/pool", "lease_ttl_ms": 1_000 });
        assert_eq!(client.put(sub, JSON, spec.to_string()).await.status, StatusCode::CREATED);
        let job = client.put("/v1/stream/jobs/1", TEXT, "work").await;
        assert_eq!(job.status, StatusCode::CREATED);
        let tail = job.header("stream-next-offset").expect("tail").to_owned();
        let events = body(&client.get(wake_stream).await);
        assert!(
            events.as_array().is_some_and(|e| e.iter().any(|e| e["subscription_id"] == "pool")),
            "the wake is announced: {events}"
        );

        let first = claim(&client, sub, "worker-1").await;
        assert_eq!(first.status, StatusCode::OK, "{}", first.text());
        let first = body(&first);
        let busy = claim(&client, sub, "worker-2").await;
        assert_eq!(busy.status, StatusCode::CONFLICT);
        assert_eq!(body(&busy)["error"]["code"], "ALREADY_CLAIMED");
        assert_eq!(body(&busy)["error"]["current_holder"], "worker-1");

        // worker-1 goes quiet past its lease: worker-2 gets the wake under a new generation.
        tokio::time::sleep(Duration::from_millis(1_300)).await;
        let second = claim(&client, sub, "worker-2").await;
        assert_eq!(second.status, StatusCode::OK, "{}", second.text());
        let second = body(&second);
        assert!(second["generation"].as_u64() > first["generation"].as_u64(), "{second}");
        let ack = |claimed: &Value| {
            let body = webhook::done_ack(claimed, "jobs/1", &tail);
            (webhook::bearer(claimed), body.to_string())
        };
        let (token, late) = ack(&first);
        let fenced = client
            .post(&format!("{sub}/ack"), &[("content-type", "application/json"), ("authorization", &token)], late)
            .await;
        assert_eq!(fenced.status, StatusCode::CONFLICT);
        assert_eq!(body(&fenced)["error"]["code"], "FENCED");
        let (token, done) = ack(&second);
        let acked = client
            .post(&format!("{sub}/ack"), &[("content-type", "application/json"), ("authorization", &token)], done)
            .await;
        assert_eq!(acked.status, StatusCode::OK, "{}", acked.text());
        assert_eq!(body(&acked), json!({ "ok": true, "next_wake": false }));
        let link = body(&client.get(sub).await)["streams"][0].clone();
        assert_eq!((link["path"].clone(), link["acked_offset"].clone()), (json!("jobs/1"), json!(tail)));
    });
}

/// URLs no subscription may name, each with the range it reaches.
pub const FORBIDDEN: &[&str] = &[
    "http://10.0.0.1/hook",
    "https://10.1.2.3/hook",
    "https://172.16.0.1/hook",
    "https://192.168.0.10/hook",
    "https://169.254.169.254/latest/meta-data/",
    "https://100.64.0.1/hook",
    "https://0.0.0.0/hook",
    "https://224.0.0.1/hook",
    "https://[fd00:ec2::254]/hook",
    "https://[fe80::1]/hook",
    "https://[::ffff:192.168.0.1]/hook",
    "http://hooks.example.com/hook",
    "https://user:secret@hooks.example.com/hook",
];

#[test]
fn webhook_urls_that_could_reach_private_addresses_are_refused_and_nothing_is_created() {
    runtime().block_on(async {
        let node = NodeProcess::in_temp_dir();
        let client = node.client();
        for url in FORBIDDEN {
            let spec = json!({ "type": "webhook", "pattern": "a/*", "webhook": { "url": url } });
            let refused = client.put("/v1/stream/__ds/subscriptions/ssrf", JSON, spec.to_string()).await;
            assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{url}: {}", refused.text());
            assert_eq!(body(&refused)["error"]["code"], "WEBHOOK_URL_REJECTED", "{url}");
            assert!(body(&refused)["error"]["message"].is_string());
            let get = client.get("/v1/stream/__ds/subscriptions/ssrf").await;
            assert_eq!(get.status, StatusCode::NOT_FOUND, "{url} created a subscription");
            assert_eq!(body(&get)["error"]["code"], "SUBSCRIPTION_NOT_FOUND");
        }
        // A single node takes a receiver beside it on loopback.
        let local = json!({ "type": "webhook", "pattern": "a/*", "webhook": { "url": "http://127.0.0.1:9/hook" } });
        let ok = client.put("/v1/stream/__ds/subscriptions/local", JSON, local.to_string()).await;
        assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.text());
    });
}
