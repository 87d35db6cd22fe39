use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ursula_gateway::config::Config;

/// Ursula gateway: one front door for an Ursula cluster. It follows the nodes' leader
/// redirects itself and vouches for refusals that applied nothing.
#[derive(Parser, Debug)]
#[command(name = "ursula-gateway", version)]
struct Args {
    /// Where clients connect [config: listen; default 127.0.0.1:4437].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Health, readiness and metrics [config: admin_listen; default 127.0.0.1:4438].
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<SocketAddr>,
    /// A node's client listener, e.g. http://ursula-0.ursula-headless:4437; repeat for each
    /// node [config: upstreams].
    #[arg(long = "upstream", value_name = "URL")]
    upstreams: Vec<String>,
    /// TOML config file (listen, admin_listen, upstreams, max_buffered_body_size,
    /// max_buffered_snapshot_size,
    /// max_redirect_hops, redirect_window, connect_timeout, request_timeout, access_keys_file,
    /// compat_bucket,
    /// upstream_link, shared_tails, collapse_long_polls). Flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Largest write body buffered, in bytes [config: max_buffered_body_size; default 64 MiB].
    #[arg(long, value_name = "BYTES")]
    max_buffered_body_size: Option<u64>,
    /// Largest snapshot publish buffered, in bytes [config: max_buffered_snapshot_size;
    /// default 256 MiB].
    #[arg(long, value_name = "BYTES")]
    max_buffered_snapshot_size: Option<u64>,
    /// How long a request that is not a live read may wait for the nodes, e.g. 15s
    /// [config: request_timeout; default 15s].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    request_timeout: Option<std::time::Duration>,
    /// Access control and tenant limits: the keys file (see README) [config: access_keys_file].
    #[arg(long, value_name = "FILE")]
    access_keys_file: Option<PathBuf>,
    /// TLS on the client listener: its certificate chain, PEM [config: tls_cert_file].
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The key of --tls-cert, PEM [config: tls_key_file].
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// The CA that https:// upstreams' certificates chain to, PEM [config: upstream_ca_file].
    #[arg(long, value_name = "FILE")]
    upstream_ca: Option<PathBuf>,
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let mut config = match &args.config {
        Some(path) => match Config::from_file(path) {
            Ok(config) => config,
            Err(error) => {
                eprintln!("ursula-gateway: {error}");
                return ExitCode::from(2);
            }
        },
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(admin) = args.admin_listen {
        config.admin_listen = admin;
    }
    if !args.upstreams.is_empty() {
        config.upstreams = args.upstreams;
    }
    if let Some(size) = args.max_buffered_body_size {
        config.max_buffered_body_size = size;
    }
    if let Some(size) = args.max_buffered_snapshot_size {
        config.max_buffered_snapshot_size = size;
    }
    if let Some(timeout) = args.request_timeout {
        config.request_timeout = timeout;
    }
    if let Some(file) = args.access_keys_file {
        config.access_keys_file = Some(file);
    }
    if let Some(file) = args.tls_cert {
        config.tls_cert_file = Some(file);
    }
    if let Some(file) = args.tls_key {
        config.tls_key_file = Some(file);
    }
    if let Some(file) = args.upstream_ca {
        config.upstream_ca_file = Some(file);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("ursula-gateway: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let running = match ursula_gateway::start(config).await {
            Ok(running) => running,
            Err(error) => {
                eprintln!("ursula-gateway: {error}");
                return ExitCode::from(2);
            }
        };
        tracing::info!(client = %running.addr, admin = %running.admin_addr, "ursula-gateway serving");
        let _ = tokio::signal::ctrl_c().await;
        ExitCode::SUCCESS
    })
}
