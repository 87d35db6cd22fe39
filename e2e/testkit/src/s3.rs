//! A real S3-API server for the cold-tier tests: moto in server mode, as a child process on a
//! free loopback port. `e2e/s3/setup.sh` installs it (`.ci/run` runs it first);
//! `URSULA_TEST_S3_SERVER` may name another `moto_server`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::Client;

pub struct S3Server {
    child: Child,
    pub port: u16,
    client: Client,
}

impl S3Server {
    pub fn start() -> Self {
        let binary = std::env::var("URSULA_TEST_S3_SERVER").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/../.tools/s3/bin/moto_server").to_owned()
        });
        assert!(
            std::path::Path::new(&binary).exists(),
            "no S3-API server at {binary}: run e2e/s3/setup.sh (or set URSULA_TEST_S3_SERVER)"
        );
        let port = crate::ports::free_ports(1)[0];
        let child = Command::new(&binary)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the S3-API server");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the S3-API server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            port,
            client: Client::new(([127, 0, 0, 1], port).into()),
        }
    }

    pub async fn create_bucket(&self, bucket: &str) {
        let reply = self.client.put(&format!("/{bucket}"), &[], "").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }

    /// The names of the objects under `prefix`, as the server lists them.
    pub async fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let reply = self
            .client
            .send(
                Method::GET,
                &format!("/{bucket}?list-type=2&prefix={prefix}"),
                &[],
                Bytes::new(),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        reply
            .text()
            .split("<Key>")
            .filter_map(|part| part.split_once("</Key>").map(|(key, _)| key.to_owned()))
            .collect()
    }

    /// A `[storage.cold]` table for a node that keeps its cold objects under
    /// `s3://{bucket}/{prefix}` here; `extra` adds keys.
    pub fn cold_toml(&self, bucket: &str, prefix: &str, extra: &str) -> String {
        format!(
            "[storage.cold]\nurl = \"s3://{bucket}/{prefix}\"\nendpoint = \"http://127.0.0.1:{}\"\nallow_http = true\nregion = \"us-east-1\"\naccess_key_id = \"test\"\nsecret_access_key = \"test\"\n{extra}\n",
            self.port
        )
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
