//! Pure builders: an `UrsulaCluster` in, the desired objects out. No I/O, so table tests can
//! pin every decision.

use kube::{CustomResourceExt, ResourceExt};
use ursula_wire::ports;

use crate::crd::{BucketPurge, UrsulaCluster};

/// Every directory of the repository that ships the CRDs, relative to its root: `crdgen
/// --write` writes them all, and a test checks them all.
pub const CRD_DIRS: [&str; 3] = ["crds", "charts/ursula-operator/crds", "deploy/crds"];

/// The command that writes the CRDs into every `CRD_DIRS`.
pub const CRDGEN: &str = "cargo run -p ursula-operator --bin crdgen -- --write";

/// The CRD files `crdgen` writes.
pub fn crd_files() -> Vec<(&'static str, String)> {
    let yaml = |crd| {
        serde_json::to_value(&crd)
            .map(|mut value| {
                kubernetes_formats(&mut value);
                serde_yaml::to_string(&value).unwrap_or_default()
            })
            .unwrap_or_default()
    };
    vec![
        ("ursulacluster.yaml", yaml(UrsulaCluster::crd())),
        ("bucketpurge.yaml", yaml(BucketPurge::crd())),
    ]
}

/// schemars names Rust's unsigned integers (`uint8` ... `uint64`), formats the API server does
/// not know and warns about on every apply; its own are `int32` and `int64` (the `minimum: 0`
/// schemars also writes keeps them unsigned).
fn kubernetes_formats(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::String(format)) = map.get_mut("format") {
                let known = match format.as_str() {
                    "uint8" | "uint16" => Some("int32"),
                    "uint32" | "uint64" => Some("int64"),
                    _ => None,
                };
                if let Some(known) = known {
                    *format = known.to_owned();
                }
            }
            map.values_mut().for_each(kubernetes_formats);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(kubernetes_formats),
        _ => {}
    }
}

/// Raft groups every cluster runs.
pub const GROUP_COUNT: i64 = 16;

/// Node config keys the operator sets itself; `nodeConfig` may not override them.
const RESERVED_KEYS: [&str; 20] = [
    "node_id",
    "data_dir",
    "server.listen",
    "server.admin_listen",
    "server.cluster_listen",
    "server.admin_token_file",
    "server.cluster_tls",
    "server.cluster_tls.ca_file",
    "server.cluster_tls.cert_file",
    "server.cluster_tls.key_file",
    "raft.peers",
    "raft.group_count",
    "runtime.worker_threads",
    "storage.cold.url",
    "storage.cold.endpoint",
    "storage.cold.region",
    "storage.cold.allow_http",
    "storage.cold.access_key_id",
    "storage.cold.secret_access_key",
    "subscriptions.signing_key_file",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvalidSpec {
    ReservedKey(String),
    BadKey(String),
}

impl std::fmt::Display for InvalidSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ReservedKey(key) => {
                write!(f, "nodeConfig may not set {key}: the operator sets it")
            }
            Self::BadKey(key) => write!(f, "nodeConfig key {key:?} is not a dotted config key"),
        }
    }
}

/// The headless Service that gives each voter a stable DNS name.
pub fn headless_service_name(cluster: &UrsulaCluster) -> String {
    format!("{}-headless", cluster.name_any())
}

/// The stable DNS name of voter `ordinal`.
pub fn voter_host(cluster: &UrsulaCluster, ordinal: u8) -> String {
    let namespace = cluster.namespace().unwrap_or_else(|| "default".into());
    format!(
        "{}-{ordinal}.{}.{namespace}.svc",
        cluster.name_any(),
        headless_service_name(cluster)
    )
}

/// Where voter `ordinal`'s peers reach it (its cluster URL) and where clients are sent to
/// reach it (its client URL).
pub fn voter_urls(cluster: &UrsulaCluster, ordinal: u8) -> (String, String) {
    urls_at(&voter_host(cluster, ordinal))
}

/// The cluster and client URLs of a voter at `host`.
pub fn urls_at(host: &str) -> (String, String) {
    (
        format!("https://{host}:{}", ports::CLUSTER),
        format!("http://{host}:{}", ports::CLIENT),
    )
}

/// The voter pods there are to be: `spec.voters`, or more while voters beyond it are still
/// members (`status.voterPods`, set by the membership planner).
pub fn voter_pods(cluster: &UrsulaCluster) -> u8 {
    let pods = cluster.status.as_ref().and_then(|s| s.voter_pods);
    pods.unwrap_or(cluster.spec.voters).max(cluster.spec.voters)
}

/// The node config file of voter `ordinal` (TOML), with the peers list derived from the
/// StatefulSet's stable DNS names and the spec's overrides applied. Once the cluster has
/// formed (`status.bootstrapped`) every voter joins it: a voter whose volume is new, and a
/// voter added by a growth, seed nothing and wait to be added (`raft.join`).
pub fn node_config(cluster: &UrsulaCluster, ordinal: u8) -> Result<String, InvalidSpec> {
    use toml::{Table, Value};
    let mut root = Table::new();
    root.insert("node_id".into(), Value::Integer(i64::from(ordinal) + 1));
    root.insert("data_dir".into(), Value::String("/var/lib/ursula".into()));
    let mut server = Table::new();
    let listen = |port: u16| Value::String(format!("0.0.0.0:{port}"));
    server.insert("listen".into(), listen(ports::CLIENT));
    server.insert("admin_listen".into(), listen(ports::ADMIN));
    server.insert("cluster_listen".into(), listen(ports::CLUSTER));
    // The Secrets of `credentials`, mounted by `workloads`.
    use crate::mounts::{ADMIN_DIR, CA_FILE, TLS_DIR, TOKEN_KEY, cert_file, key_file};
    let file = |dir: &str, name: &str| Value::String(format!("{dir}/{name}"));
    server.insert("admin_token_file".into(), file(ADMIN_DIR, TOKEN_KEY));
    let mut tls = Table::new();
    tls.insert("ca_file".into(), file(TLS_DIR, CA_FILE));
    tls.insert("cert_file".into(), file(TLS_DIR, &cert_file(ordinal)));
    tls.insert("key_file".into(), file(TLS_DIR, &key_file(ordinal)));
    server.insert("cluster_tls".into(), Value::Table(tls));
    // Subscription callbacks point at the gateways' Service; `nodeConfig` may name an ingress.
    let namespace = cluster.namespace().unwrap_or_else(|| "default".into());
    server.insert(
        "public_url".into(),
        Value::String(format!(
            "http://{}.{namespace}.svc:{}",
            cluster.name_any(),
            ports::CLIENT
        )),
    );
    root.insert("server".into(), Value::Table(server));
    let mut subscriptions = Table::new();
    subscriptions.insert(
        "signing_key_file".into(),
        file(crate::mounts::SIGNING_DIR, crate::mounts::SIGNING_KEY),
    );
    root.insert("subscriptions".into(), Value::Table(subscriptions));
    let mut raft = Table::new();
    raft.insert("group_count".into(), Value::Integer(GROUP_COUNT));
    let peers = (0..voter_pods(cluster))
        .map(|i| {
            let (cluster_url, client_url) = voter_urls(cluster, i);
            let mut peer = Table::new();
            peer.insert("id".into(), Value::Integer(i64::from(i) + 1));
            peer.insert("cluster_url".into(), Value::String(cluster_url));
            peer.insert("client_url".into(), Value::String(client_url));
            Value::Table(peer)
        })
        .collect();
    raft.insert("peers".into(), Value::Array(peers));
    let bootstrapped = cluster.status.as_ref().is_some_and(|s| s.bootstrapped);
    if bootstrapped {
        raft.insert("join".into(), Value::Boolean(true));
    }
    root.insert("raft".into(), Value::Table(raft));
    if let Some(store) = &cluster.spec.object_store {
        let namespace = cluster.namespace().unwrap_or_else(|| "default".into());
        let prefix = store
            .prefix
            .clone()
            .unwrap_or_else(|| format!("{namespace}/{}", cluster.name_any()));
        let mut cold = Table::new();
        cold.insert(
            "url".into(),
            Value::String(format!(
                "s3://{}/{}",
                store.bucket,
                prefix.trim_matches('/')
            )),
        );
        if let Some(endpoint) = &store.endpoint {
            cold.insert("endpoint".into(), Value::String(endpoint.clone()));
            cold.insert(
                "allow_http".into(),
                Value::Boolean(endpoint.starts_with("http://")),
            );
        }
        if let Some(region) = &store.region {
            cold.insert("region".into(), Value::String(region.clone()));
        }
        // Credentials come from the Secret, as environment variables (see `workloads`).
        let mut storage = Table::new();
        storage.insert("cold".into(), Value::Table(cold));
        root.insert("storage".into(), Value::Table(storage));
    }

    for (key, value) in &cluster.spec.node_config {
        if RESERVED_KEYS.contains(&key.as_str()) {
            return Err(InvalidSpec::ReservedKey(key.clone()));
        }
        let parts: Vec<&str> = key.split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(InvalidSpec::BadKey(key.clone()));
        }
        let value = toml_value(value).ok_or_else(|| InvalidSpec::BadKey(key.clone()))?;
        let (last, tables) = parts
            .split_last()
            .ok_or_else(|| InvalidSpec::BadKey(key.clone()))?;
        let mut table = &mut root;
        for part in tables {
            let entry = table
                .entry((*part).to_owned())
                .or_insert_with(|| Value::Table(Table::new()));
            table = match entry {
                Value::Table(inner) => inner,
                _ => return Err(InvalidSpec::BadKey(key.clone())),
            };
        }
        table.insert((*last).to_owned(), value);
    }
    Ok(toml::to_string(&root).unwrap_or_default())
}

fn toml_value(value: &serde_json::Value) -> Option<toml::Value> {
    use serde_json::Value as J;
    Some(match value {
        J::Bool(b) => toml::Value::Boolean(*b),
        J::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None => toml::Value::Float(n.as_f64()?),
        },
        J::String(s) => toml::Value::String(s.clone()),
        J::Array(items) => toml::Value::Array(items.iter().map(toml_value).collect::<Option<_>>()?),
        J::Null | J::Object(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::crd::{StorageSpec, UrsulaClusterSpec};

    fn cluster(voters: u8, overrides: &[(&str, serde_json::Value)]) -> UrsulaCluster {
        let mut cluster = UrsulaCluster::new(
            "ursula",
            UrsulaClusterSpec {
                version: "0.1.0".into(),
                node_image: "ursula/ursula-node".into(),
                gateway_image: "ursula/ursula-gateway".into(),
                voters,
                volume_reclaim: Default::default(),
                gateway_replicas: 2,
                node_resources: None,
                gateway_resources: None,
                gateway: None,
                storage: StorageSpec {
                    size: "10Gi".into(),
                    class_name: None,
                },
                object_store: None,
                node_config: overrides
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.clone()))
                    .collect::<BTreeMap<_, _>>(),
                client_access: Vec::new(),
                network_policy: Default::default(),
                tls: None,
                paused: false,
            },
        );
        cluster.metadata.namespace = Some("streams".into());
        cluster
    }

    fn parsed(text: &str) -> toml::Table {
        text.parse().expect("valid TOML")
    }

    #[test]
    fn peers_follow_the_statefulset_dns_names() {
        for voters in [1u8, 3, 5] {
            for ordinal in 0..voters {
                let config = parsed(&node_config(&cluster(voters, &[]), ordinal).unwrap());
                assert_eq!(config["node_id"].as_integer(), Some(i64::from(ordinal) + 1));
                let peers = config["raft"]["peers"].as_array().unwrap();
                assert_eq!(peers.len(), voters as usize);
                for (i, peer) in peers.iter().enumerate() {
                    assert_eq!(peer["id"].as_integer(), Some(i as i64 + 1));
                    assert_eq!(
                        peer["cluster_url"].as_str(),
                        Some(
                            format!("https://ursula-{i}.ursula-headless.streams.svc:4439").as_str()
                        )
                    );
                    assert_eq!(
                        peer["client_url"].as_str(),
                        Some(
                            format!("http://ursula-{i}.ursula-headless.streams.svc:4437").as_str()
                        )
                    );
                }
                assert_eq!(
                    config["server"]["admin_listen"].as_str(),
                    Some("0.0.0.0:4438")
                );
                // Each voter's own certificate, and the admin token the operator sends.
                let tls = &config["server"]["cluster_tls"];
                let id = u64::from(ordinal) + 1;
                assert_eq!(
                    tls["cert_file"].as_str(),
                    Some(format!("/var/run/secrets/ursula/tls/node-{id}.crt").as_str())
                );
                assert_eq!(
                    tls["key_file"].as_str(),
                    Some(format!("/var/run/secrets/ursula/tls/node-{id}.key").as_str())
                );
                assert_eq!(
                    tls["ca_file"].as_str(),
                    Some("/var/run/secrets/ursula/tls/ca.crt")
                );
                assert_eq!(
                    config["server"]["admin_token_file"].as_str(),
                    Some("/var/run/secrets/ursula/admin/token")
                );
                // One signing key for every voter; callbacks point at the gateways.
                assert_eq!(
                    config["subscriptions"]["signing_key_file"].as_str(),
                    Some("/var/run/secrets/ursula/signing/signing-key.pem")
                );
                assert_eq!(
                    config["server"]["public_url"].as_str(),
                    Some("http://ursula.streams.svc:4437")
                );
            }
        }
    }

    #[test]
    fn overrides_apply_and_reserved_keys_are_refused() {
        let config = parsed(
            &node_config(
                &cluster(
                    3,
                    &[
                        ("raft.snapshot_log_budget", serde_json::json!(1024)),
                        ("server.long_poll_timeout", serde_json::json!("5s")),
                        ("storage.max_producers_per_stream", serde_json::json!(8)),
                        (
                            "server.public_url",
                            serde_json::json!("https://streams.example.com"),
                        ),
                    ],
                ),
                0,
            )
            .unwrap(),
        );
        assert_eq!(
            config["raft"]["snapshot_log_budget"].as_integer(),
            Some(1024)
        );
        assert_eq!(
            config["raft"]["group_count"].as_integer(),
            Some(GROUP_COUNT)
        );
        assert_eq!(config["server"]["long_poll_timeout"].as_str(), Some("5s"));
        assert_eq!(
            config["server"]["public_url"].as_str(),
            Some("https://streams.example.com")
        );
        assert_eq!(
            config["storage"]["max_producers_per_stream"].as_integer(),
            Some(8)
        );
        let cases = [
            (
                "raft.peers",
                serde_json::json!([]),
                InvalidSpec::ReservedKey("raft.peers".into()),
            ),
            (
                "node_id",
                serde_json::json!(9),
                InvalidSpec::ReservedKey("node_id".into()),
            ),
            (
                "subscriptions.signing_key_file",
                serde_json::json!("/tmp/mine.pem"),
                InvalidSpec::ReservedKey("subscriptions.signing_key_file".into()),
            ),
            (
                "server..listen",
                serde_json::json!(1),
                InvalidSpec::BadKey("server..listen".into()),
            ),
            (
                "server.listen.x",
                serde_json::json!(1),
                InvalidSpec::BadKey("server.listen.x".into()),
            ),
            (
                "raft.wal",
                serde_json::json!({"a": 1}),
                InvalidSpec::BadKey("raft.wal".into()),
            ),
        ];
        for (key, value, expected) in cases {
            assert_eq!(
                node_config(&cluster(3, &[(key, value)]), 0),
                Err(expected),
                "{key}"
            );
        }
    }

    #[test]
    fn an_object_store_becomes_the_cold_tier() {
        let store = |prefix: Option<&str>, endpoint: Option<&str>| crate::crd::ObjectStoreSpec {
            bucket: "cold".into(),
            prefix: prefix.map(str::to_owned),
            endpoint: endpoint.map(str::to_owned),
            region: Some("eu-west-1".into()),
            credentials_secret: "s3".into(),
        };
        let parse = |cluster: &UrsulaCluster| -> toml::Table {
            toml::from_str(&node_config(cluster, 1).unwrap()).unwrap()
        };
        let cases = [
            (store(None, None), "s3://cold/apps/ursula", None, None),
            (
                store(Some("/shared/ursula-a/"), Some("http://minio.storage:9000")),
                "s3://cold/shared/ursula-a",
                Some("http://minio.storage:9000"),
                Some(true),
            ),
            (
                store(None, Some("https://s3.example.com")),
                "s3://cold/apps/ursula",
                Some("https://s3.example.com"),
                Some(false),
            ),
        ];
        for (spec, url, endpoint, allow_http) in cases {
            let mut with_store =
                cluster(3, &[("storage.cold.max_hot_size_per_group", 1024.into())]);
            with_store.metadata.namespace = Some("apps".into());
            with_store.spec.object_store = Some(spec);
            let config = parse(&with_store);
            let cold = &config["storage"]["cold"];
            assert_eq!(cold["url"].as_str(), Some(url));
            assert_eq!(cold.get("endpoint").and_then(|v| v.as_str()), endpoint);
            assert_eq!(cold.get("allow_http").and_then(|v| v.as_bool()), allow_http);
            assert_eq!(cold["region"].as_str(), Some("eu-west-1"));
            assert_eq!(
                cold["max_hot_size_per_group"].as_integer(),
                Some(1024),
                "overrides apply"
            );
            assert!(
                cold.get("secret_access_key").is_none(),
                "credentials stay in the Secret"
            );
        }
        assert!(
            parse(&cluster(3, &[])).get("storage").is_none(),
            "no object store, no cold tier"
        );
        assert_eq!(
            node_config(
                &cluster(3, &[("storage.cold.url", "s3://elsewhere".into())]),
                0
            ),
            Err(InvalidSpec::ReservedKey("storage.cold.url".into()))
        );
    }

    #[test]
    fn crds_use_only_integer_formats_the_api_server_knows() {
        for (file, yaml) in crd_files() {
            let formats: Vec<&str> = yaml
                .lines()
                .filter_map(|line| line.trim().strip_prefix("format: "))
                .collect();
            assert!(!formats.is_empty(), "{file}");
            for format in formats {
                assert!(
                    ["int32", "int64", "date-time"].contains(&format),
                    "{file}: format {format}"
                );
            }
        }
    }

    #[test]
    fn every_shipped_copy_of_the_crds_matches_the_types() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for dir in CRD_DIRS {
            for (file, yaml) in crd_files() {
                let committed = std::fs::read_to_string(root.join(dir).join(file))
                    .unwrap_or_else(|_| panic!("{dir}/{file} is missing: run `{CRDGEN}`"));
                assert_eq!(
                    committed, yaml,
                    "{dir}/{file} differs from the types: run `{CRDGEN}`"
                );
            }
        }
    }
}
