use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod dev_cluster;
use ursula_node::config::{Config, parse_duration};

/// Ursula node: durable append-only streams over HTTP (the Durable Streams Protocol).
///
/// With no arguments it runs the embedded single-node default: clients on 127.0.0.1:4437,
/// admin (health, readiness, metrics) on 127.0.0.1:4438, data in ./ursula-data.
#[derive(Parser, Debug)]
#[command(name = "ursula-node", version)]
struct Args {
    /// TOML config file (keys `node_id`, `data_dir`, `server.*`, `storage.*`, `raft.*`,
    /// `runtime.*`; see README).
    /// Flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Client listener address [config: server.listen; default 127.0.0.1:4437].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Admin listener address [config: server.admin_listen; default 127.0.0.1:4438].
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<SocketAddr>,
    /// Data directory [config: data_dir; default ./ursula-data].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// How long a long-poll waits for data, e.g. 500ms or 20s
    /// [config: server.long_poll_timeout; default 20s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    long_poll_timeout: Option<std::time::Duration>,
    #[command(subcommand)]
    command: Option<Tool>,
}

#[derive(Subcommand, Debug)]
enum Tool {
    /// Runs a local cluster on loopback: voters (client ports BASE, BASE+10, ...) and, when
    /// `ursula-gateway` is next to this binary, a gateway on BASE-10. Prints the client URL.
    DevCluster {
        /// Number of voters (3 or 5 for a real quorum).
        #[arg(long, default_value_t = 3)]
        voters: u64,
        /// Where the voters keep their data and config files.
        #[arg(long, value_name = "DIR", default_value = "./ursula-dev-cluster")]
        data_dir: PathBuf,
        /// Client port of the first voter.
        #[arg(long, value_name = "PORT", default_value_t = 4447)]
        base_port: u16,
    },
    /// Writes a new cluster CA and a certificate for each voter into DIR: `ca.pem`, `ca.key`,
    /// `node-{id}.pem`, `node-{id}.key` (keys readable by their owner only), for
    /// `server.cluster_tls` on voters run without the operator. Prints each voter's key.
    IssueCerts {
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// Node IDs, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
        nodes: Vec<u64>,
        /// How long the certificates are valid, e.g. 90d.
        #[arg(long, value_name = "DURATION", default_value = "365d", value_parser = parse_duration)]
        valid_for: std::time::Duration,
        /// More names (or IP addresses) every certificate carries, comma-separated, so that
        /// it serves the client listener's TLS (`server.tls`) too.
        #[arg(long, value_delimiter = ',')]
        names: Vec<String>,
    },
    /// Writes a new Ed25519 key (PKCS#8 PEM, readable by its owner only) to FILE, for
    /// `subscriptions.signing_key_file`: every voter of a cluster signs webhooks and wake tokens
    /// with the same one.
    SigningKey {
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

/// openraft logs every failed RPC, at ERROR, several times a second per peer while one is
/// down or slow; the node reports those failures itself, once per peer per interval
/// (`cluster::link_health`). `RUST_LOG` replaces this filter (and `is_per_rpc_failure`).
const DEFAULT_LOG_FILTER: &str = "info,openraft=warn,openraft::replication=off,\
    openraft::engine::handler::replication_handler=off";

/// openraft's lines for one failed vote request or read-index heartbeat ("while requesting
/// vote", "timeout", "timeout while confirming leadership"): RaftCore's ERROR events with
/// exactly the fields `error` and `target`. Its other ERROR events (a fatal error, a storage
/// error) have other fields and are kept.
fn is_per_rpc_failure(metadata: &tracing::Metadata<'_>) -> bool {
    if metadata.target() != "openraft::core::raft_core"
        || *metadata.level() != tracing::Level::ERROR
    {
        return false;
    }
    let mut fields: Vec<&str> = metadata.fields().iter().map(|f| f.name()).collect();
    fields.sort_unstable();
    fields == ["error", "message", "target"]
}

/// Global filters only (as `fmt().with_env_filter()` has): a per-layer filter makes the
/// registry create and format every span, openraft's debug spans included, whether or not it
/// is logged, which cost a 3-voter cluster over a third of its CPU per append.
fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let custom = tracing_subscriber::EnvFilter::try_from_default_env().ok();
    let quiet = custom.is_none();
    let filter = custom.unwrap_or_else(|| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    // Decided per callsite (its metadata), so it is cached like the level filter's decisions.
    let mut per_rpc = tracing_subscriber::filter::filter_fn(move |metadata| {
        !(quiet && is_per_rpc_failure(metadata))
    });
    if let Some(hint) =
        tracing_subscriber::Layer::<tracing_subscriber::Registry>::max_level_hint(&filter)
    {
        per_rpc = per_rpc.with_max_level_hint(hint);
    }
    tracing_subscriber::registry()
        .with(filter)
        .with(per_rpc)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .init();
}

fn issue_certs(
    dir: PathBuf,
    nodes: &[u64],
    valid_for: std::time::Duration,
    names: &[String],
) -> ExitCode {
    let files = ursula_wire::issue::ClusterFiles { dir };
    if let Err(error) = files.write("ursula cluster", nodes, names, valid_for) {
        eprintln!(
            "ursula-node issue-certs: cannot write {}: {error}",
            files.dir.display()
        );
        return ExitCode::FAILURE;
    }
    for id in nodes {
        println!("node {id}: [server] {}", files.toml(*id).trim_end());
    }
    ExitCode::SUCCESS
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    init_logging();
    let args = Args::parse();
    match args.command {
        Some(Tool::DevCluster {
            voters,
            data_dir,
            base_port,
        }) => {
            return dev_cluster::run(dev_cluster::DevCluster {
                voters,
                data_dir,
                base_port,
            });
        }
        Some(Tool::IssueCerts {
            dir,
            nodes,
            valid_for,
            names,
        }) => return issue_certs(dir, &nodes, valid_for, &names),
        Some(Tool::SigningKey { out }) => {
            return match ursula_node::subscriptions::signing::SigningKey::load(&out, true) {
                Ok(key) if out.exists() => {
                    println!(
                        "[subscriptions] signing_key_file = {:?}  # kid {}",
                        out,
                        key.kid()
                    );
                    ExitCode::SUCCESS
                }
                Ok(_) => ExitCode::FAILURE,
                Err(error) => {
                    eprintln!("ursula-node signing-key: {error}");
                    ExitCode::FAILURE
                }
            };
        }
        None => {}
    }
    let mut config = match &args.config {
        Some(path) => match Config::from_file(path) {
            Ok(config) => config,
            Err(error) => {
                eprintln!("ursula-node: {error}");
                return ExitCode::from(2);
            }
        },
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if let Some(admin) = args.admin_listen {
        config.server.admin_listen = admin;
    }
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if let Some(timeout) = args.long_poll_timeout {
        config.server.long_poll_timeout = timeout;
    }

    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(threads) = config.runtime.worker_threads {
        runtime.worker_threads(threads);
    }
    let runtime = match runtime.build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("ursula-node: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let node = match ursula_node::start(config).await {
            Ok(node) => node,
            Err(error) => {
                eprintln!("ursula-node: {error}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(client = %node.client_addr, admin = %node.admin_addr, "ursula-node serving");
        let _ = shutdown_signal().await;
        tracing::info!("ursula-node stopping");
        // Every acknowledged write is already durable: stopping only lets requests finish.
        node.shutdown().await;
        tracing::info!("ursula-node stopped");
        ExitCode::SUCCESS
    })
}

async fn shutdown_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => Ok(()),
        result = tokio::signal::ctrl_c() => result,
    }
}
