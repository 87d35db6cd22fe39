use super::*;

#[test]
fn empty_file_is_the_embedded_default() {
    let config = Config::from_toml("").unwrap();
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:4437");
    assert_eq!(config.server.admin_listen.to_string(), "127.0.0.1:4438");
    assert_eq!(config.data_dir, PathBuf::from("./ursula-data"));
}

#[test]
fn spec_keys_parse() {
    let config = Config::from_toml(
        "node_id = 3\n[server]\nlong_poll_timeout = \"500ms\"\ncompat_bucket = \"compat\"\n\
         [storage]\nmax_producers_per_stream = 8\nproducer_idle_timeout = \"1h\"\n",
    )
    .unwrap();
    assert_eq!(config.node_id, 3);
    assert_eq!(config.server.long_poll_timeout, Duration::from_millis(500));
    assert_eq!(config.limits().max_producers_per_stream, 8);
    assert_eq!(config.limits().producer_idle_ms, 3_600_000);
}

#[test]
fn unknown_keys_are_named() {
    let error = Config::from_toml("[server]\nlisten_addr = \"x\"\n").unwrap_err();
    assert!(error.contains("listen_addr"), "{error}");
    let error = Config::from_toml("colour = 1\n").unwrap_err();
    assert!(error.contains("colour"), "{error}");
}

#[test]
fn the_cold_tier_is_optional_and_checked() {
    assert!(Config::from_toml("").unwrap().storage.cold.is_none());
    let config = Config::from_toml(
        "[server]\nmax_append_size = 1048576\n\
         [storage.cold]\nurl = \"s3://ursula/prod\"\nendpoint = \"http://minio:9000\"\n\
         allow_http = true\nmax_hot_size_per_group = 1048576\nflush_interval = \"1s\"\n",
    )
    .unwrap();
    config.validate().unwrap();
    let cold = config.storage.cold.unwrap();
    assert_eq!(cold.max_hot_size_per_group, 1 << 20);
    assert_eq!(cold.flush_interval, Duration::from_secs(1));
    assert_eq!(cold.segment_size, 8 << 20, "a default");
    for (text, key) in [
        ("url = \"ftp://x\"", "storage.cold.url"),
        (
            // Under the default 64 MiB largest body.
            "url = \"s3://x\"\nmax_hot_size_per_group = 1048576",
            "storage.cold.max_hot_size_per_group",
        ),
    ] {
        let config = Config::from_toml(&format!("[storage.cold]\n{text}\n")).unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains(key), "{error}");
    }
    let error = Config::from_toml("[storage.cold]\nbucket = \"x\"\n").unwrap_err();
    assert!(error.contains("bucket"), "{error}");
    // Staging: only with a cold tier; a cap of 0 stages every body; a cap below the
    // largest unstaged body is refused.
    let staged = |text: &str| Config::from_toml(text).unwrap().validate();
    let error = staged("[runtime]\nexternal_payload_min_size = 1024\n").unwrap_err();
    assert!(error.to_string().contains("needs storage.cold"), "{error}");
    staged("[runtime]\nexternal_payload_min_size = 1024\n[storage.cold]\nurl = \"s3://x\"\nmax_hot_size_per_group = 1024\n").unwrap();
    staged("[storage.cold]\nurl = \"s3://x\"\nmax_hot_size_per_group = 0\n").unwrap();
    let error = staged("[runtime]\nexternal_payload_min_size = 4096\n[storage.cold]\nurl = \"s3://x\"\nmax_hot_size_per_group = 1024\n").unwrap_err();
    assert!(
        error.to_string().contains("max_hot_size_per_group"),
        "{error}"
    );
}

#[test]
fn bad_durations_are_refused() {
    let error = Config::from_toml("[server]\nlong_poll_timeout = \"soon\"\n").unwrap_err();
    assert!(error.contains("soon"), "{error}");
}

#[test]
fn sizes_take_units_and_a_bad_one_names_its_key() {
    let config = Config::from_toml(
        "[server]\nmax_append_size = \"16MiB\"\nread_chunk_size = 65536\n\
         [raft.wal]\nmin_available_size = \"1TiB\"\nresume_available_size = \"2TiB\"\n\
         [runtime]\nexternal_payload_min_size = \"512KiB\"\n",
    )
    .expect("sizes with units");
    assert_eq!(config.server.max_append_size, 16 << 20);
    assert_eq!(config.server.read_chunk_size, 65536);
    assert_eq!(config.raft.wal.min_available_size, 1 << 40);
    assert_eq!(config.runtime.external_payload_min_size, Some(512 << 10));
    let error = Config::from_toml("[raft.wal]\nmin_available_size = \"1 terabyte\"\n").unwrap_err();
    assert!(error.contains("min_available_size"), "{error}");
    assert!(error.contains("KiB, MiB, GiB or TiB"), "{error}");
}

#[test]
fn the_admin_token_file_is_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    let config = |extra: &str| {
        let config = Config::from_toml(&format!("[server]\n{extra}\n")).unwrap();
        config.validate().map_err(|e| e.to_string())
    };
    let error = config("metrics_require_token = true").unwrap_err();
    assert!(error.contains("server.metrics_require_token"), "{error}");
    let error = config(&format!("admin_token_file = {file:?}")).unwrap_err();
    assert!(error.contains("server.admin_token_file"), "{error}");
    std::fs::write(&file, "t").unwrap();
    config(&format!(
        "admin_token_file = {file:?}\nmetrics_require_token = true"
    ))
    .unwrap();
}

#[test]
fn a_node_with_peers_needs_cluster_tls_or_says_it_does_without() {
    let config = |scheme: &str, server: &str| {
        let peers: String = (1..=3)
            .map(|id| {
                format!(
                    "[[raft.peers]]\nid = {id}\ncluster_url = \"{scheme}://10.0.0.{id}:4439\"\nclient_url = \"http://10.0.0.{id}:4437\"\n"
                )
            })
            .collect();
        let text = format!("node_id = 1\n[server]\n{server}\n[raft]\n{peers}");
        Config::from_toml(&text)
            .unwrap()
            .validate()
            .map_err(|e| e.to_string())
    };
    let tls = "cluster_tls = { ca_file = \"ca.pem\", cert_file = \"n.pem\", key_file = \"n.key\" }";
    for (scheme, server, refused_for) in [
        ("http", "", Some("server.cluster_tls")),
        ("http", "allow_insecure_cluster = true", None),
        ("https", tls, None),
        ("http", tls, Some("not an https:// URL")),
        (
            "https",
            "allow_insecure_cluster = true",
            Some("not an http:// URL"),
        ),
    ] {
        match (config(scheme, server), refused_for) {
            (Ok(()), None) => {}
            (Err(error), Some(why)) => assert!(error.contains(why), "{scheme} {server}: {error}"),
            (result, _) => panic!("{scheme} {server}: {result:?}"),
        }
    }
}
