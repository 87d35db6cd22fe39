//! Test support: the workspace's test kit (`e2e/testkit`: node processes, clusters, network
//! namespaces, an S3 server, the HTTP client), and a node in this test's own process.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use ursula_testkit::{Client, s3};

/// A node in this process, on ephemeral loopback ports, with its own data directory.
pub struct InProcess {
    pub client: Client,
    pub admin: Client,
    pub client_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub node: ursula_node::Node,
}

pub async fn start_in_process(edit: impl FnOnce(&mut ursula_node::config::Config)) -> InProcess {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = ursula_node::config::Config {
        data_dir: dir.path().to_owned(),
        ..Default::default()
    };
    config.server.listen = "127.0.0.1:0".parse().expect("addr");
    config.server.admin_listen = "127.0.0.1:0".parse().expect("addr");
    config.server.long_poll_timeout = Duration::from_millis(300);
    // Test machines may have little free disk; tests that need disk pressure set their own.
    config.raft.wal.min_available_size = 1 << 20;
    config.raft.wal.resume_available_size = 2 << 20;
    // Many test nodes run at once; 64 MiB preallocated segments each would crowd small disks.
    config.raft.wal.segment_size = 4 << 20;
    edit(&mut config);
    let node = ursula_node::start(config).await.expect("node starts");
    InProcess {
        client: Client::new(node.client_addr),
        admin: Client::new(node.admin_addr),
        client_addr: node.client_addr,
        admin_addr: node.admin_addr,
        dir,
        node,
    }
}

/// `s3.cold_toml(..)` as the config struct an in-process node takes.
pub fn cold_config(
    s3: &s3::S3Server,
    bucket: &str,
    prefix: &str,
    extra: &str,
) -> ursula_node::config::ColdConfig {
    let text = s3.cold_toml(bucket, prefix, extra);
    ursula_node::config::Config::from_toml(&text)
        .expect("cold config")
        .storage
        .cold
        .expect("storage.cold")
}
