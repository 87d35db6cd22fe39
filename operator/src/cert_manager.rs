//! The voters' certificates from cert-manager, when `spec.tls.issuerRef` names an issuer: one
//! `Certificate` per voter, for the same names the operator's own CA would put in it
//! (`ursula_wire::identity`), renewed by cert-manager. The voters mount the Secrets through one
//! projected volume (`workloads`) in the layout the operator's own Secret has, so a node's
//! configuration does not depend on where its certificate came from.
//!
//! The builders and the readiness check are pure; `ensure` applies and reads.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{CustomResource, ResourceExt};
use serde::{Deserialize, Serialize};

use crate::crd::{IssuerRef, UrsulaCluster};
use crate::credentials::{CERT_LIFETIME, CredentialsError, RENEW_BEFORE};
use crate::mounts::{
    CA_FILE, ISSUED_CERT, ISSUED_KEY, voter_certificate, voter_certificate_secret,
};
use crate::workloads::{NODE, labels, meta};

/// The fields of cert-manager's `Certificate` (cert-manager.io/v1) the operator writes. Its
/// schema is cert-manager's CRD; the apiserver checks these objects against it.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "cert-manager.io",
    version = "v1",
    kind = "Certificate",
    namespaced,
    schema = "disabled",
    status = "CertificateStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSpec {
    #[serde(default)]
    pub secret_name: String,
    #[serde(default)]
    pub dns_names: Vec<String>,
    #[serde(default)]
    pub usages: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<PrivateKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_template: Option<SecretTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<IssuerRef>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrivateKey {
    pub algorithm: String,
    pub size: u32,
    pub rotation_policy: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SecretTemplate {
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CertificateStatus {
    #[serde(default)]
    pub conditions: Vec<CertificateCondition>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CertificateCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default)]
    pub message: Option<String>,
}

fn hours(duration: std::time::Duration) -> String {
    format!("{}h", duration.as_secs() / 3600)
}

/// Voter `ordinal`'s `Certificate`: its node ID's name and its pod's DNS name, for both ends
/// of a mutual-TLS link, with the lifetime and renewal the operator's own CA uses. A new key
/// on every renewal.
pub fn voter_certificate_for(
    cluster: &UrsulaCluster,
    ordinal: u8,
    issuer: &IssuerRef,
) -> Certificate {
    let node = ursula_wire::identity::node_name(u64::from(ordinal) + 1);
    let spec = CertificateSpec {
        secret_name: voter_certificate_secret(cluster, ordinal),
        dns_names: vec![node, crate::objects::voter_host(cluster, ordinal)],
        usages: ["digital signature", "server auth", "client auth"]
            .map(String::from)
            .to_vec(),
        duration: Some(hours(CERT_LIFETIME)),
        renew_before: Some(hours(RENEW_BEFORE)),
        private_key: Some(PrivateKey {
            algorithm: "ECDSA".into(),
            size: 256,
            rotation_policy: "Always".into(),
        }),
        secret_template: Some(SecretTemplate {
            labels: labels(cluster, NODE),
        }),
        issuer_ref: Some(issuer.clone()),
    };
    Certificate {
        metadata: meta(cluster, voter_certificate(cluster, ordinal), NODE),
        spec,
        status: None,
    }
}

/// What the voters wait for: for each voter whose Secret lacks a file, its Secret's name and
/// what cert-manager says of its `Certificate` (its `Ready` condition's message). Empty when
/// every voter can start.
pub fn waiting_for(issued: &[(String, Option<Secret>, Option<Certificate>)]) -> Vec<String> {
    issued
        .iter()
        .filter(|(_, secret, _)| {
            let data = secret.as_ref().and_then(|s| s.data.as_ref());
            ![ISSUED_CERT, ISSUED_KEY, CA_FILE].iter().all(|key| {
                data.and_then(|d| d.get(*key))
                    .is_some_and(|v| !v.0.is_empty())
            })
        })
        .map(|(name, _, certificate)| {
            let said = certificate
                .as_ref()
                .and_then(|c| c.status.as_ref())
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                .and_then(|c| c.message.clone());
            match said {
                Some(message) => format!("{name} ({message})"),
                None => name.clone(),
            }
        })
        .collect()
}

/// Applies each voter's `Certificate`, deletes those of voters the cluster no longer has, and
/// answers what the voters still wait for (`waiting_for`).
pub async fn ensure(
    client: &kube::Client,
    ns: &str,
    cluster: &UrsulaCluster,
    issuer: &IssuerRef,
) -> Result<Vec<String>, CredentialsError> {
    let certificates: Api<Certificate> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let params = PatchParams::apply(crate::apply::FIELD_MANAGER).force();
    let mut issued = Vec::new();
    for ordinal in 0..crate::objects::voter_pods(cluster) {
        let wanted = voter_certificate_for(cluster, ordinal, issuer);
        // The answer is the whole object, status (cert-manager's word on it) included.
        let applied = match certificates
            .patch(&wanted.name_any(), &params, &Patch::Apply(&wanted))
            .await
        {
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Err(CredentialsError::CertManagerMissing);
            }
            applied => applied?,
        };
        let name = voter_certificate_secret(cluster, ordinal);
        let secret = secrets.get_opt(&name).await?;
        issued.push((name, secret, Some(applied)));
    }
    // Those of voters the cluster no longer has: the ones it owns beyond its voter pods.
    let owned = ListParams::default().labels(&format!(
        "app.kubernetes.io/instance={},app.kubernetes.io/name={NODE}",
        cluster.name_any()
    ));
    let wanted: Vec<String> = (0..crate::objects::voter_pods(cluster))
        .map(|ordinal| voter_certificate(cluster, ordinal))
        .collect();
    for certificate in certificates.list(&owned).await? {
        let ours = certificate
            .owner_references()
            .iter()
            .any(|owner| Some(&owner.uid) == cluster.metadata.uid.as_ref());
        let name = certificate.name_any();
        if ours && !wanted.contains(&name) {
            match certificates.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error.into()),
            }
        }
    }
    Ok(waiting_for(&issued))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;
    use crate::workloads::tests::cluster;

    fn issuer() -> IssuerRef {
        IssuerRef {
            name: "ursula-ca".into(),
            kind: "ClusterIssuer".into(),
            group: "cert-manager.io".into(),
        }
    }

    #[test]
    fn each_voter_gets_a_certificate_for_its_node_id_and_pod() {
        let cluster = cluster(3, 1);
        let certificate = voter_certificate_for(&cluster, 1, &issuer());
        assert_eq!(certificate.name_any(), "prod-node-2");
        assert_eq!(certificate.spec.secret_name, "prod-node-2-tls");
        assert_eq!(
            certificate.spec.dns_names,
            [
                "node-2.ursula.internal".to_owned(),
                crate::objects::voter_host(&cluster, 1)
            ]
        );
        for usage in ["server auth", "client auth"] {
            assert!(
                certificate.spec.usages.iter().any(|u| u == usage),
                "{usage}"
            );
        }
        assert_eq!(certificate.spec.duration.as_deref(), Some("2160h"));
        assert_eq!(certificate.spec.renew_before.as_deref(), Some("720h"));
        assert_eq!(certificate.spec.issuer_ref, Some(issuer()));
        assert!(certificate.metadata.owner_references.is_some());
        // As cert-manager's CRD spells the fields.
        let json = serde_json::to_value(&certificate).unwrap();
        assert_eq!(json["apiVersion"], "cert-manager.io/v1");
        assert_eq!(json["spec"]["secretName"], "prod-node-2-tls");
        assert_eq!(json["spec"]["issuerRef"]["kind"], "ClusterIssuer");
        assert_eq!(json["spec"]["privateKey"]["rotationPolicy"], "Always");
    }

    #[test]
    fn voters_wait_for_secrets_with_every_file() {
        let secret = |keys: &[&str]| Secret {
            data: Some(
                keys.iter()
                    .map(|k| ((*k).to_owned(), ByteString(b"pem".to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        };
        let said = |message: &str| Certificate {
            status: Some(CertificateStatus {
                conditions: vec![CertificateCondition {
                    type_: "Ready".into(),
                    status: "False".into(),
                    message: Some(message.into()),
                }],
            }),
            ..Certificate::new("c", CertificateSpec::default())
        };
        let complete = secret(&["tls.crt", "tls.key", "ca.crt"]);
        for (issued, expected) in [
            (vec![("a", Some(complete.clone()), None)], vec![]),
            (vec![("a", None, None)], vec!["a"]),
            (
                vec![("a", None, Some(said("Issuing certificate")))],
                vec!["a (Issuing certificate)"],
            ),
            (
                vec![
                    ("a", Some(complete.clone()), None),
                    ("b", Some(secret(&["tls.crt", "tls.key"])), None),
                ],
                vec!["b"],
            ),
            (vec![("a", Some(secret(&[])), None)], vec!["a"]),
        ] {
            let issued: Vec<_> = issued
                .into_iter()
                .map(|(n, s, c)| (n.to_owned(), s, c))
                .collect();
            assert_eq!(waiting_for(&issued), expected, "{issued:?}");
        }
    }
}
