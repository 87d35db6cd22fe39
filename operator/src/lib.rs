//! The Ursula operator's building blocks: the custom resources (`crd`), the pure functions that
//! turn an `UrsulaCluster` into the Kubernetes objects it needs (`objects`, `workloads`,
//! `gateways`), and the
//! upgrade planner (`upgrade`), which picks the one next step of a version change.
//!
//! Following kube-rs `controller-rs`: read, validate, build desired objects as pure functions,
//! apply them with server-side apply, write status conditions. `controller` and `purge` are the
//! reconcilers the `ursula-operator` binary runs; `nodes` calls the nodes' admin API.

pub mod apply;
pub mod cert_manager;
pub mod conditions;
pub mod controller;
pub mod crd;
pub mod credentials;
pub mod gateways;
pub mod membership;
pub mod mounts;
pub mod nodes;
pub mod objects;
pub mod policies;
pub mod purge;
pub mod resize;
pub mod upgrade;
pub mod workloads;
