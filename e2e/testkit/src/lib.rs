//! What the tests of every crate of the workspace share: real `ursula-node` processes (one, or
//! a cluster of voters, optionally each in a network namespace of its own), an S3-API server,
//! loopback ports that are safe to hand to a child process, and an HTTP client that returns
//! status, headers and body.

pub mod binaries;
pub mod certs;
pub mod cluster;
mod http;
pub mod load;
pub mod netns;
pub mod node;
pub mod ports;
pub mod s3;
pub mod webhook;

pub use http::{Client, Http, Reply};

pub use ursula_wire::placement::group_of;

/// The SHA-256 of `bytes` in hex, as a voter's `/admin/replica` digest spells it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

/// A runtime for tests that also drive child processes from the test thread.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}
