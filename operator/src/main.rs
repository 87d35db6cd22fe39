//! `ursula-operator`: runs the `UrsulaCluster` and `BucketPurge` controllers against the
//! cluster's API server (in-cluster config, or the local kubeconfig).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client};
use ursula_operator::controller::{self, Context, FIELD_MANAGER};
use ursula_operator::crd::{BucketPurge, UrsulaCluster};
use ursula_operator::nodes::Nodes;
use ursula_operator::purge;
use ursula_operator::upgrade::Limits;

/// The Ursula operator: reconciles `UrsulaCluster` and `BucketPurge` resources.
#[derive(Debug, Parser)]
#[command(name = "ursula-operator", version)]
struct Args {
    /// Where voters' admin listeners are, as a URL template with `{name}`, `{namespace}` and
    /// `{ordinal}` (for an operator outside the cluster network, e.g. through a tunnel).
    /// Default: the headless Service's names, `http://{name}-{ordinal}.{name}-headless.{namespace}.svc:4438`.
    #[arg(long, value_name = "TEMPLATE")]
    voter_admin_url: Option<String>,
    /// The host a voter is announced at when it is added to the Raft groups (its cluster and
    /// client URLs), as a template like `--voter-admin-url`'s, for voters that are not at
    /// their headless Service names. Default: those names.
    #[arg(long, value_name = "TEMPLATE")]
    voter_member_host: Option<String>,
    /// How long a replaced voter, or a gateway rollout, may take to become ready before the
    /// upgrade halts with `Degraded`.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    ready_timeout: u64,
}

/// Where the operator runs: `POD_NAMESPACE` (the chart sets it), else its service account's
/// namespace file; unknown outside a pod.
fn operator_namespace() -> Option<String> {
    std::env::var("POD_NAMESPACE").ok().or_else(|| {
        std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            .ok()
            .map(|ns| ns.trim().to_owned())
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let client = match Client::try_default().await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("ursula-operator: cannot reach the Kubernetes API: {error}");
            return ExitCode::FAILURE;
        }
    };
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let context = Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(client.clone(), reporter),
        nodes: {
            let nodes = args
                .voter_admin_url
                .map_or_else(Nodes::default, Nodes::with_admin_template);
            match args.voter_member_host {
                Some(template) => nodes.with_member_host(template),
                None => nodes,
            }
        },
        limits: Limits {
            ready_timeout: Duration::from_secs(args.ready_timeout),
        },
        namespace: operator_namespace(),
    });
    let clusters = Controller::new(
        Api::<UrsulaCluster>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<StatefulSet>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<Deployment>::all(client.clone()),
        watcher::Config::default(),
    )
    .shutdown_on_signal()
    .run(
        controller::reconcile,
        controller::error_policy,
        context.clone(),
    )
    .for_each(|result| async move {
        if let Err(error) = result {
            tracing::debug!(%error, "cluster reconcile");
        }
    });
    let purges = Controller::new(
        Api::<BucketPurge>::all(client.clone()),
        watcher::Config::default(),
    )
    .shutdown_on_signal()
    .run(purge::reconcile, purge::error_policy, context)
    .for_each(|result| async move {
        if let Err(error) = result {
            tracing::debug!(%error, "purge reconcile");
        }
    });
    tracing::info!("ursula-operator running");
    tokio::join!(clusters, purges);
    ExitCode::SUCCESS
}
