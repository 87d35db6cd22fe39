//! The Ursula operator's building blocks: the custom resources (`crd`) and the pure functions
//! that turn an `UrsulaCluster` into the Kubernetes objects it needs (`objects`).
//!
//! Following kube-rs `controller-rs`: read, validate, build desired objects as pure functions,
//! apply them with server-side apply, write status conditions. The reconcile loop, upgrade
//! planner and the `ursula-operator` binary are still to come.

pub mod crd;
pub mod objects;
pub mod workloads;
