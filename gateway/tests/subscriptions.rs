//! The `__ds` subscription APIs through the gateway, in front of a real node: refusals of
//! webhook URLs that could reach private addresses come back as the node gave them, vouched;
//! a wake's callback with its bearer token goes through like any write.

mod support;

use http::StatusCode;
use serde_json::{Value, json};
use support::gateway;
use ursula_testkit::node::NodeProcess;
use ursula_testkit::webhook::{self, Receiver};
use ursula_testkit::{Http, Reply};

const JSON: (&str, &str) = ("content-type", "application/json");

fn body(reply: &Reply) -> Value {
    serde_json::from_slice(&reply.body).unwrap_or(Value::Null)
}

#[tokio::test]
async fn subscription_refusals_and_callbacks_go_through_the_gateway() {
    let node = NodeProcess::in_temp_dir();
    let addr = gateway(vec![node.url()], |_| {}).await;
    let http = Http::new();
    let url = |path: &str| format!("http://{addr}{path}");
    let sub = "/v1/stream/__ds/subscriptions/via-gateway";
    for hook in [
        "http://10.0.0.1/hook",
        "https://192.168.1.1/hook",
        "https://169.254.169.254/latest/meta-data/",
        "https://[fd00:ec2::254]/hook",
        "https://[::ffff:10.0.0.1]/hook",
        "http://hooks.example.com/hook",
    ] {
        let spec = json!({ "type": "webhook", "pattern": "events/*", "webhook": { "url": hook } });
        let refused = http
            .request("PUT", &url(sub), &[JSON], spec.to_string())
            .await
            .expect("answer");
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{hook}: {}",
            refused.text()
        );
        assert_eq!(
            body(&refused)["error"]["code"],
            "WEBHOOK_URL_REJECTED",
            "{hook}"
        );
        assert_eq!(refused.header("x-ursula-not-applied"), None, "{hook}");
        assert_eq!(
            refused.header("x-ursula-not-applied-checked"),
            Some("1"),
            "{hook}"
        );
        let get = http
            .request("GET", &url(sub), &[], "")
            .await
            .expect("answer");
        assert_eq!(
            get.status,
            StatusCode::NOT_FOUND,
            "{hook} created a subscription"
        );
    }

    let receiver = Receiver::start().await;
    let spec =
        json!({ "type": "webhook", "pattern": "events/*", "webhook": { "url": receiver.url() } });
    let created = http
        .request("PUT", &url(sub), &[JSON], spec.to_string())
        .await
        .expect("answer");
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    let stream = url("/v1/stream/events/one");
    let put = http
        .request("PUT", &stream, &[("content-type", "text/plain")], "hi")
        .await
        .expect("answer");
    assert_eq!(put.status, StatusCode::CREATED);
    let tail = put.header("stream-next-offset").expect("tail").to_owned();
    let wake = receiver
        .wait_for(std::time::Duration::from_secs(10), |d| {
            d.body["subscription_id"] == "via-gateway"
        })
        .await
        .expect("a webhook");
    let token = webhook::bearer(&wake.body);
    let ack = webhook::done_ack(&wake.body, "events/one", &tail);
    let callback = url(&format!("{sub}/callback"));
    let acked = http
        .request(
            "POST",
            &callback,
            &[JSON, ("authorization", &token)],
            ack.to_string(),
        )
        .await
        .expect("answer");
    assert_eq!(acked.status, StatusCode::OK, "{}", acked.text());
    assert_eq!(body(&acked), json!({ "ok": true, "next_wake": false }));
    let again = http
        .request(
            "POST",
            &callback,
            &[JSON, ("authorization", &token)],
            ack.to_string(),
        )
        .await
        .expect("answer");
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(body(&again)["error"]["code"], "FENCED");
    assert_eq!(again.header("x-ursula-not-applied-checked"), Some("1"));
}
