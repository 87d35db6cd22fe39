//! The voters' NetworkPolicy (pure): nothing internal is reachable from where it need not be.
//! The cluster port only from the cluster's own voters; the admin port only from the
//! operator's namespace and the spec's metrics scrapers; the client port from the cluster's
//! gateways and the spec's `clientAccess`. Probes come from the kubelet on the node, which
//! network plugins let through.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use ursula_wire::ports;

use crate::crd::UrsulaCluster;
use crate::workloads::{GATEWAY, NODE, labels, meta, selector};

pub fn voter_policy_name(cluster: &UrsulaCluster) -> String {
    format!("{}-voters", cluster.name_any())
}

fn pods(cluster: &UrsulaCluster, component: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(labels(cluster, component)),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    }
}

fn namespace(name: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_owned(),
                name.to_owned(),
            )])),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    }
}

fn rule(port: u16, from: Vec<NetworkPolicyPeer>) -> NetworkPolicyIngressRule {
    NetworkPolicyIngressRule {
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(i32::from(port))),
            protocol: Some("TCP".to_owned()),
            ..NetworkPolicyPort::default()
        }]),
        from: Some(from),
    }
}

/// The voters' policy, or `None` when the spec turns it off. `operator_namespace` is where the
/// operator runs, when it knows (it runs in a pod); unknown, only `metricsFrom` reaches the
/// admin port.
pub fn voter_policy(
    cluster: &UrsulaCluster,
    operator_namespace: Option<&str>,
) -> Option<NetworkPolicy> {
    let spec = &cluster.spec;
    if !spec.network_policy.enabled {
        return None;
    }
    let mut admin_from: Vec<NetworkPolicyPeer> =
        operator_namespace.map(namespace).into_iter().collect();
    admin_from.extend(spec.network_policy.metrics_from.iter().cloned());
    let mut client_from = vec![pods(cluster, GATEWAY)];
    client_from.extend(spec.client_access.iter().cloned());
    let mut ingress = vec![
        rule(ports::CLUSTER, vec![pods(cluster, NODE)]),
        rule(ports::CLIENT, client_from),
    ];
    // A rule with no peers would let everyone in: without any, the admin port has no rule.
    if !admin_from.is_empty() {
        ingress.push(rule(ports::ADMIN, admin_from));
    }
    Some(NetworkPolicy {
        metadata: meta(cluster, voter_policy_name(cluster), NODE),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(cluster, NODE)),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(ingress),
            ..NetworkPolicySpec::default()
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::tests::cluster;

    /// Each port's peers, as (pod labels' component, namespace) pairs.
    fn peers_of(policy: &NetworkPolicy, port: u16) -> Option<Vec<String>> {
        let rules = policy.spec.as_ref()?.ingress.as_ref()?;
        let rule = rules.iter().find(|r| {
            r.ports
                .as_ref()
                .is_some_and(|p| p[0].port == Some(IntOrString::Int(i32::from(port))))
        })?;
        Some(
            rule.from
                .iter()
                .flatten()
                .map(|peer| {
                    let pods = peer
                        .pod_selector
                        .as_ref()
                        .and_then(|s| s.match_labels.as_ref());
                    let ns = peer
                        .namespace_selector
                        .as_ref()
                        .and_then(|s| s.match_labels.as_ref());
                    match (pods, ns) {
                        (Some(labels), None) => {
                            format!("pods:{}", labels["app.kubernetes.io/name"])
                        }
                        (None, Some(labels)) => {
                            format!("namespace:{}", labels["kubernetes.io/metadata.name"])
                        }
                        _ => "other".to_owned(),
                    }
                })
                .collect(),
        )
    }

    #[test]
    fn each_port_is_open_only_to_whom_it_serves() {
        let mut with_access = cluster(3, 2);
        with_access.spec.client_access = vec![namespace("apps")];
        with_access.spec.network_policy.metrics_from = vec![namespace("monitoring")];
        for (uc, operator, cluster_port, client_port, admin_port) in [
            (
                cluster(3, 2),
                Some("ursula-system"),
                Some(vec!["pods:ursula-node"]),
                Some(vec!["pods:ursula-gateway"]),
                Some(vec!["namespace:ursula-system"]),
            ),
            (
                with_access,
                Some("ops"),
                Some(vec!["pods:ursula-node"]),
                Some(vec!["pods:ursula-gateway", "namespace:apps"]),
                Some(vec!["namespace:ops", "namespace:monitoring"]),
            ),
            // Not knowing its namespace, the operator opens the admin port to nobody.
            (
                cluster(3, 2),
                None,
                Some(vec!["pods:ursula-node"]),
                Some(vec!["pods:ursula-gateway"]),
                None,
            ),
        ] {
            let policy = voter_policy(&uc, operator).expect("on by default");
            let owned = |v: Option<Vec<&str>>| {
                v.map(|v| v.into_iter().map(String::from).collect::<Vec<_>>())
            };
            assert_eq!(peers_of(&policy, ports::CLUSTER), owned(cluster_port));
            assert_eq!(peers_of(&policy, ports::CLIENT), owned(client_port));
            assert_eq!(peers_of(&policy, ports::ADMIN), owned(admin_port));
            let spec = policy.spec.unwrap();
            assert_eq!(spec.policy_types, Some(vec!["Ingress".to_owned()]));
            assert_eq!(
                spec.pod_selector.unwrap().match_labels.unwrap()["app.kubernetes.io/name"],
                NODE
            );
        }
    }

    #[test]
    fn the_policy_can_be_turned_off() {
        let mut uc = cluster(3, 1);
        uc.spec.network_policy.enabled = false;
        assert!(voter_policy(&uc, Some("ursula-system")).is_none());
    }
}
