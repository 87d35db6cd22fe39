//! Bad input never crashes the node or gets a non-JSON error: random methods, paths, headers,
//! queries and bodies against a real node over HTTP.

mod support;

use bytes::Bytes;
use http::Method;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use support::start_in_process;

fn pick<T: Clone + std::fmt::Debug + 'static>(items: &[T]) -> impl Strategy<Value = T> + use<T> {
    prop::sample::select(items.to_vec())
}

#[test]
fn random_requests_get_clean_answers() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let node = runtime.block_on(start_in_process(|_| {}));
    runtime.block_on(async {
        node.client.put("/fuzz", &[], "").await;
        node.client
            .put("/fuzz/s", &[("content-type", "application/json")], "[1]")
            .await;
        node.client
            .put("/fuzz/t", &[("content-type", "text/plain")], "x")
            .await;
    });

    let method = pick(&[
        Method::GET,
        Method::PUT,
        Method::POST,
        Method::HEAD,
        Method::DELETE,
        Method::PATCH,
    ]);
    let path = pick(&[
        "/fuzz/s",
        "/fuzz/t",
        "/fuzz/s/bootstrap",
        "/fuzz/s/snapshot/x",
        "/fuzz/t/retention/-1",
        "/fuzz/%ff",
        "/fuzz/a%2F..%2Fb",
        "/fuzz",
        "/v1/stream/q",
        "/v1/stream/%00",
        "//",
        "/fuzz/s/",
        "/fuzz/t/snapshot/0000000000000000_0000000000000001",
    ]);
    let query = pick(&[
        "",
        "?offset=-1",
        "?offset=now&live=sse",
        "?offset=-1&live=long-poll",
        "?offset=%zz",
        "?offset=99999999999999999999_9",
        "?live=sse",
        "?offset=0000000000000000_0000000000000000&cursor=-5",
        "?offset=1&offset=2",
    ]);
    let header = pick(&[
        ("content-type", "application/json"),
        ("content-type", "text/plain; charset=utf-8"),
        ("content-type", ""),
        ("stream-ttl", "99999999999999999999999"),
        ("stream-ttl", "-0"),
        ("stream-expires-at", "9999-99-99T99:99:99Z"),
        ("stream-closed", "TRUE"),
        ("stream-seq", "\u{e9}t\u{e9}"),
        ("producer-id", "\u{e9}"),
        ("producer-id", "p"),
        ("producer-epoch", "18446744073709551616"),
        ("producer-seq", "0"),
        ("stream-forked-from", "/fuzz/s"),
        ("stream-forked-from", "http://[::1"),
        ("stream-fork-offset", "now"),
        ("stream-fork-sub-offset", "4294967296"),
        ("if-none-match", "*"),
    ]);
    let body = pick(&[
        Bytes::new(),
        Bytes::from_static(b"[]"),
        Bytes::from_static(b"[1,2"),
        Bytes::from_static(b"\xff\xfe\x00"),
        Bytes::from_static(b"{\"a\":[[[]]]}"),
        Bytes::from_static(b"12345678901234567890123456789012345678901234567890"),
    ]);
    let request = (
        method,
        path,
        query,
        prop::collection::vec(header, 0..5),
        body,
    );

    let mut runner = TestRunner::new(Config {
        cases: 400,
        ..Config::default()
    });
    runner
        .run(&request, |(method, path, query, headers, body)| {
            let uri = format!("{path}{query}");
            let reply = runtime.block_on(async {
                // Live reads may legitimately stay open; a short timeout ends them.
                tokio::time::timeout(
                    std::time::Duration::from_secs(2),
                    node.client
                        .try_send(method.clone(), &uri, &headers, body.clone()),
                )
                .await
            });
            let Ok(reply) = reply else {
                return Ok(());
            };
            let reply = reply.map_err(|e| TestCaseError::fail(format!("{method} {uri}: {e}")))?;
            prop_assert!(
                reply.status.as_u16() < 500,
                "{} {} {:?} -> {} {}",
                method,
                uri,
                headers,
                reply.status,
                reply.text()
            );
            if reply.status.as_u16() >= 400 && method != Method::HEAD {
                prop_assert_eq!(reply.header("content-type"), Some("application/json"));
                reply.error();
            }
            Ok(())
        })
        .unwrap_or_else(|failure| panic!("{failure}"));

    // Still serving, and nothing that was refused leaked into the streams' config.
    runtime.block_on(async {
        let health = node.admin.get("/healthz").await;
        assert_eq!(health.status, http::StatusCode::OK);
    });
}
