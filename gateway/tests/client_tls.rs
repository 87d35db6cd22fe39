//! TLS where users need it: a node's client listener (`server.tls`) and the gateway's
//! (`--tls-cert`, `--tls-key`), HTTP/1.1 and HTTP/2 by ALPN, and the gateway talking TLS to
//! `https://` nodes, verified against `--upstream-ca`, over HTTP and over the gateway link.
//! Real processes and sockets; the client is rustls with the CA as its only root.

mod support;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ursula_testkit::certs::{Authority, VALID_FOR};
use ursula_testkit::node::NodeProcess;

type TlsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client that trusts only `ca`, speaking HTTP/2 or HTTP/1.1 as ALPN picks (`http2`), or
/// HTTP/1.1 only.
fn client(ca: &std::path::Path, http2: bool) -> TlsClient {
    let config = ursula_tls::client_trusting(ca, &[]).unwrap();
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only();
    let connector = if http2 {
        builder.enable_all_versions().build()
    } else {
        builder.enable_http1().build()
    };
    Client::builder(TokioExecutor::new()).build(connector)
}

async fn send(
    client: &TlsClient,
    method: Method,
    url: &str,
    body: &'static str,
) -> (StatusCode, Version, String) {
    let request = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let response = client.request(request).await.expect("a TLS answer");
    let (status, version) = (response.status(), response.version());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, version, String::from_utf8_lossy(&body).into_owned())
}

struct Certs {
    _dir: tempfile::TempDir,
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

/// A CA and one server certificate for `127.0.0.1` and `localhost`.
fn certs() -> Certs {
    let dir = tempfile::tempdir().unwrap();
    let authority = Authority::new("client TLS test", VALID_FOR).unwrap();
    let issued = authority
        .issue_server(&["127.0.0.1".into(), "localhost".into()], VALID_FOR)
        .unwrap();
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("ca.pem"), authority.cert_pem()).unwrap();
    std::fs::write(path("server.pem"), &issued.cert_pem).unwrap();
    std::fs::write(path("server.key"), &issued.key_pem).unwrap();
    Certs {
        ca: path("ca.pem"),
        cert: path("server.pem"),
        key: path("server.key"),
        _dir: dir,
    }
}

#[tokio::test]
async fn clients_reach_nodes_and_gateways_over_tls_with_either_http_version() {
    let certs = certs();
    let data = tempfile::tempdir().unwrap();
    let node = NodeProcess::start_with(
        data.path(),
        &format!(
            "tls = {{ cert_file = {:?}, key_file = {:?} }}",
            certs.cert, certs.key
        ),
        &[],
    );
    let node_url = format!("https://{}", node.client_addr);
    let running = support::start_gateway(vec![node_url.clone()], |config| {
        config.tls_cert_file = Some(certs.cert.clone());
        config.tls_key_file = Some(certs.key.clone());
        config.upstream_ca_file = Some(certs.ca.clone());
    })
    .await;
    let gateway_url = format!("https://{}", running.addr);

    for (http2, version) in [(true, Version::HTTP_2), (false, Version::HTTP_11)] {
        let client = client(&certs.ca, http2);
        // Straight to the node, and through the gateway (which talks TLS to the node).
        for (name, base) in [("node", &node_url), ("gateway", &gateway_url)] {
            let stream = format!("{base}/tls-{}/{name}", u8::from(http2));
            let (status, seen, _) = send(&client, Method::PUT, &stream, "").await;
            assert!(status.is_success(), "{stream}: {status}");
            assert_eq!(seen, version, "ALPN");
            let (status, _, _) = send(&client, Method::POST, &stream, "over tls").await;
            assert_eq!(status, StatusCode::NO_CONTENT, "{stream}");
            let (status, _, text) =
                send(&client, Method::GET, &format!("{stream}?offset=-1"), "").await;
            assert_eq!(
                (status, text.as_str()),
                (StatusCode::OK, "over tls"),
                "{stream}"
            );
        }
    }
    // The gateway answered over its link to the node: TLS there too.
    let link_requests =
        support::metric(running.admin_addr, "ursula_gateway_link_requests_total").await;
    assert!(link_requests > 0, "no request went over the gateway link");

    // Plain HTTP to a TLS listener gets no HTTP answer.
    let plain: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    for addr in [node.client_addr, running.addr] {
        let request = Request::get(format!("http://{addr}/tls-1/node?offset=-1"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let answer =
            tokio::time::timeout(std::time::Duration::from_secs(10), plain.request(request))
                .await
                .expect("the listener does not hang");
        assert!(answer.is_err(), "{addr} answered plain HTTP: {answer:?}");
    }

    // A client that does not trust the CA cannot connect.
    let stranger = Authority::new("another CA", VALID_FOR).unwrap();
    let other_ca = data.path().join("other-ca.pem");
    std::fs::write(&other_ca, stranger.cert_pem()).unwrap();
    let untrusting = client(&other_ca, true);
    let request = Request::get(format!("{gateway_url}/tls-1/node?offset=-1"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert!(untrusting.request(request).await.is_err());
}

#[tokio::test]
async fn a_gateway_refuses_to_start_with_https_upstreams_and_no_ca() {
    let config = ursula_gateway::config::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        upstreams: vec!["https://127.0.0.1:1".into()],
        ..Default::default()
    };
    let error = ursula_gateway::start(config).await.err().expect("refused");
    assert!(error.to_string().contains("--upstream-ca"), "{error}");
}

#[tokio::test]
async fn a_gateway_does_not_talk_to_a_node_whose_certificate_another_ca_signed() {
    let certs = certs();
    let data = tempfile::tempdir().unwrap();
    let node = NodeProcess::start_with(
        data.path(),
        &format!(
            "tls = {{ cert_file = {:?}, key_file = {:?} }}",
            certs.cert, certs.key
        ),
        &[],
    );
    let stranger = Authority::new("another CA", VALID_FOR).unwrap();
    let other_ca = data.path().join("other-ca.pem");
    std::fs::write(&other_ca, stranger.cert_pem()).unwrap();
    let gateway = support::gateway(vec![format!("https://{}", node.client_addr)], |config| {
        config.upstream_ca_file = Some(other_ca.clone());
        config.request_timeout = std::time::Duration::from_secs(2);
    })
    .await;
    let plain = ursula_testkit::Client::new(gateway);
    let refused = plain
        .put("/untrusted/s", &[("content-type", "text/plain")], "")
        .await;
    assert!(
        refused.status.is_server_error(),
        "{}: {}",
        refused.status,
        refused.text()
    );
    // Nothing reached the node: the stream is not there.
    let direct = client(&certs.ca, true);
    let (status, _, _) = send(
        &direct,
        Method::GET,
        &format!("https://{}/untrusted/s?offset=-1", node.client_addr),
        "",
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
