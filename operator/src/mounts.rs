//! Where the voters find the Secrets `credentials` keeps: their names, the directories they
//! are mounted at, and the file of each key. A leaf: the builders of the node config
//! (`objects`), the StatefulSet (`workloads`) and the Secrets (`credentials`) share it.

use kube::ResourceExt;

use crate::crd::UrsulaCluster;

/// Where the voters find the admin token and the cluster TLS files.
pub const ADMIN_DIR: &str = "/var/run/secrets/ursula/admin";
pub const TLS_DIR: &str = "/var/run/secrets/ursula/tls";
/// The admin token Secret's key (and file name).
pub const TOKEN_KEY: &str = "token";
/// Where the voters find the key they sign subscription webhooks and wake tokens with, and
/// its Secret's key (and file name).
pub const SIGNING_DIR: &str = "/var/run/secrets/ursula/signing";
pub const SIGNING_KEY: &str = "signing-key.pem";

pub fn signing_key_secret(cluster: &UrsulaCluster) -> String {
    format!("{}-signing-key", cluster.name_any())
}

pub fn admin_token_secret(cluster: &UrsulaCluster) -> String {
    format!("{}-admin-token", cluster.name_any())
}

pub fn ca_secret(cluster: &UrsulaCluster) -> String {
    format!("{}-ca", cluster.name_any())
}

pub fn tls_secret(cluster: &UrsulaCluster) -> String {
    format!("{}-cluster-tls", cluster.name_any())
}

/// With `spec.tls.issuerRef`: voter `ordinal`'s cert-manager `Certificate`, and the
/// `kubernetes.io/tls` Secret cert-manager writes for it (keys `tls.crt`, `tls.key`, `ca.crt`).
pub fn voter_certificate(cluster: &UrsulaCluster, ordinal: u8) -> String {
    format!("{}-node-{}", cluster.name_any(), u64::from(ordinal) + 1)
}
pub fn voter_certificate_secret(cluster: &UrsulaCluster, ordinal: u8) -> String {
    format!("{}-tls", voter_certificate(cluster, ordinal))
}
pub const ISSUED_CERT: &str = "tls.crt";
pub const ISSUED_KEY: &str = "tls.key";

/// The TLS Secret's file names: the CA, and voter `ordinal`'s certificate and key.
pub const CA_FILE: &str = "ca.crt";
pub fn cert_file(ordinal: u8) -> String {
    format!("node-{}.crt", u64::from(ordinal) + 1)
}
pub fn key_file(ordinal: u8) -> String {
    format!("node-{}.key", u64::from(ordinal) + 1)
}
