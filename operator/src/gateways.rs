//! The gateway Deployment: a pure builder from the `UrsulaCluster`, including the gateway
//! options of `spec.gateway` (flags, and the access keys Secret mounted read-only).

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, PodSpec, PodTemplateSpec, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use ursula_wire::ports;

use crate::crd::UrsulaCluster;
use crate::objects::voter_host;
use crate::workloads::{
    GATEWAY, labels, meta, port, probe, security, selector, service_account_name,
    spread_over_machines,
};

/// Where a gateway finds its keys file (`spec.gateway.accessKeysSecret`).
const ACCESS_KEYS_DIR: &str = "/etc/ursula-gateway";
/// The key of the keys file in that Secret.
pub const ACCESS_KEYS_KEY: &str = "access-keys.toml";
/// Where `spec.gateway.tlsSecret` (`tls.crt`, `tls.key`) is mounted.
const TLS_DIR: &str = "/var/run/secrets/ursula/gateway-tls";

/// The gateways, pointed at every voter's client listener directly (nothing in between may
/// resend requests).
pub fn gateway_deployment(cluster: &UrsulaCluster) -> Deployment {
    gateway_deployment_at(cluster, &cluster.spec.version)
}

/// The gateways with their pod template at `version`.
pub fn gateway_deployment_at(cluster: &UrsulaCluster, version: &str) -> Deployment {
    let spec = &cluster.spec;
    let mut args = vec![
        "--listen".to_owned(),
        format!("0.0.0.0:{}", ports::CLIENT),
        "--admin-listen".to_owned(),
        format!("0.0.0.0:{}", ports::ADMIN),
    ];
    for ordinal in 0..crate::objects::voter_pods(cluster) {
        args.push("--upstream".to_owned());
        args.push(format!(
            "http://{}:{}",
            voter_host(cluster, ordinal),
            ports::CLIENT
        ));
    }
    let options = spec.gateway.clone().unwrap_or_default();
    let flags = [
        (
            "--max-buffered-body-size",
            options.max_buffered_body_size.map(|n| n.to_string()),
        ),
        (
            "--max-buffered-snapshot-size",
            options.max_buffered_snapshot_size.map(|n| n.to_string()),
        ),
        ("--request-timeout", options.request_timeout.clone()),
        (
            "--access-keys-file",
            options
                .access_keys_secret
                .as_ref()
                .map(|_| format!("{ACCESS_KEYS_DIR}/{ACCESS_KEYS_KEY}")),
        ),
        (
            "--tls-cert",
            options
                .tls_secret
                .as_ref()
                .map(|_| format!("{TLS_DIR}/tls.crt")),
        ),
        (
            "--tls-key",
            options
                .tls_secret
                .as_ref()
                .map(|_| format!("{TLS_DIR}/tls.key")),
        ),
    ];
    for (flag, value) in flags {
        if let Some(value) = value {
            args.extend([flag.to_owned(), value]);
        }
    }
    // The keys file and the TLS pair come from their Secrets, mounted read-only (not with
    // `subPath`, so that rotated files reach the gateway); never through the pod spec.
    let mut volumes = Vec::new();
    let mut volume_mounts = Vec::new();
    for (name, secret, dir) in [
        ("access-keys", &options.access_keys_secret, ACCESS_KEYS_DIR),
        ("tls", &options.tls_secret, TLS_DIR),
    ] {
        let Some(secret) = secret else { continue };
        volumes.push(Volume {
            name: name.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
        volume_mounts.push(VolumeMount {
            name: name.to_owned(),
            mount_path: dir.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    let volumes = (!volumes.is_empty()).then_some(volumes);
    let volume_mounts = (!volume_mounts.is_empty()).then_some(volume_mounts);
    let container = Container {
        name: "gateway".to_owned(),
        image: Some(format!("{}:{version}", spec.gateway_image)),
        args: Some(args),
        ports: Some(vec![
            port("client", ports::CLIENT),
            port("admin", ports::ADMIN),
        ]),
        readiness_probe: Some(probe("/readyz")),
        liveness_probe: Some(probe("/healthz")),
        resources: spec.gateway_resources.clone(),
        volume_mounts,
        ..Container::default()
    };
    Deployment {
        metadata: meta(cluster, format!("{}-gateway", cluster.name_any()), GATEWAY),
        spec: DeploymentSpec {
            replicas: Some(i32::from(spec.gateway_replicas)),
            selector: selector(cluster, GATEWAY),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(cluster, GATEWAY)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    affinity: Some(spread_over_machines(cluster, GATEWAY)),
                    volumes,
                    security_context: Some(security()),
                    service_account_name: Some(service_account_name(cluster)),
                    automount_service_account_token: Some(false),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        ..Deployment::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::GatewaySpec;
    use crate::workloads::tests::cluster;

    fn args_of(deployment: &Deployment) -> Vec<String> {
        let pod = deployment.spec.template.spec.as_ref().unwrap();
        pod.containers[0].args.clone().unwrap()
    }

    #[test]
    fn gateways_point_at_every_voter_directly() {
        let deployment = gateway_deployment(&cluster(3, 2));
        let spec = &deployment.spec;
        assert_eq!(spec.replicas, Some(2));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("prod-ursula"));
        assert_eq!(pod.automount_service_account_token, Some(false));
        let gateway = &pod.containers[0];
        assert_eq!(gateway.image.as_deref(), Some("reg/ursula-gateway:1.2.3"));
        let upstreams: Vec<&String> = gateway
            .args
            .as_ref()
            .unwrap()
            .windows(2)
            .filter(|w| w[0] == "--upstream")
            .map(|w| &w[1])
            .collect();
        assert_eq!(
            upstreams,
            vec![
                "http://prod-0.prod-headless.ns.svc:4437",
                "http://prod-1.prod-headless.ns.svc:4437",
                "http://prod-2.prod-headless.ns.svc:4437"
            ]
        );
    }

    #[test]
    fn gateway_options_become_flags_and_the_keys_secret_a_read_only_mount() {
        let flag = |args: &[String], name: &str| {
            args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone())
        };
        // (options, expected flags)
        let cases: [(GatewaySpec, [Option<&str>; 6]); 4] = [
            (GatewaySpec::default(), [None, None, None, None, None, None]),
            (
                GatewaySpec {
                    max_buffered_body_size: Some(1_048_576),
                    request_timeout: Some("30s".into()),
                    ..GatewaySpec::default()
                },
                [Some("1048576"), None, Some("30s"), None, None, None],
            ),
            (
                GatewaySpec {
                    max_buffered_snapshot_size: Some(536_870_912),
                    access_keys_secret: Some("prod-gateway-keys".into()),
                    ..GatewaySpec::default()
                },
                [
                    None,
                    Some("536870912"),
                    None,
                    Some("/etc/ursula-gateway/access-keys.toml"),
                    None,
                    None,
                ],
            ),
            (
                GatewaySpec {
                    tls_secret: Some("prod-gateway-tls".into()),
                    ..GatewaySpec::default()
                },
                [
                    None,
                    None,
                    None,
                    None,
                    Some("/var/run/secrets/ursula/gateway-tls/tls.crt"),
                    Some("/var/run/secrets/ursula/gateway-tls/tls.key"),
                ],
            ),
        ];
        for (options, expected) in cases {
            let mut uc = cluster(3, 2);
            uc.spec.gateway = Some(options.clone());
            let deployment = gateway_deployment(&uc);
            let args = args_of(&deployment);
            let names = [
                "--max-buffered-body-size",
                "--max-buffered-snapshot-size",
                "--request-timeout",
                "--access-keys-file",
                "--tls-cert",
                "--tls-key",
            ];
            for (name, want) in names.iter().zip(expected) {
                assert_eq!(flag(&args, name).as_deref(), want, "{name} for {options:?}");
            }
            let pod = deployment.spec.template.spec.as_ref().unwrap();
            let mounts = pod.containers[0].volume_mounts.clone().unwrap_or_default();
            let volumes = pod.volumes.clone().unwrap_or_default();
            let expected: Vec<(&String, &str)> = [
                (&options.access_keys_secret, "/etc/ursula-gateway"),
                (&options.tls_secret, "/var/run/secrets/ursula/gateway-tls"),
            ]
            .into_iter()
            .filter_map(|(secret, dir)| secret.as_ref().map(|s| (s, dir)))
            .collect();
            assert_eq!(volumes.len(), expected.len(), "{options:?}");
            assert_eq!(mounts.len(), expected.len(), "{options:?}");
            for ((secret, dir), (volume, mount)) in expected.iter().zip(volumes.iter().zip(&mounts))
            {
                let source = volume.secret.as_ref().expect("a Secret volume");
                assert_eq!(source.secret_name.as_deref(), Some(secret.as_str()));
                assert_eq!(mount.mount_path, *dir);
                assert_eq!(mount.name, volume.name);
                assert_eq!(mount.read_only, Some(true));
            }
        }
    }
}
