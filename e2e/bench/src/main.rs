//! `ursula-bench`: measures a Durable Streams server over real HTTP on loopback.
//!
//! - `append`: N streams, W concurrent writers in a closed loop, fixed-size bodies; reports
//!   appends/s and latency percentiles.
//! - `sse`: S subscribers on one stream with `live=sse`, a writer at a fixed rate stamping each
//!   message with its send time; reports delivery latency percentiles and checks that every
//!   subscriber got every message.
//! - `long-poll`: the same with subscribers that follow the stream with long-polls.
//! - `catch-up`: one stream filled, then read from the start by R clients; reports MiB/s and
//!   page latency (with a cold tier, after it has moved the records to object storage).
//! - `wake`: subscriptions over the streams woken by appends at a fixed rate; reports the wake
//!   latency (append acknowledged to webhook received) of every subscriber.
//! - `relay`: not a measurement but a baseline: a byte-copying TCP relay, the cheapest proxy
//!   there is, to measure what any front door costs (`relay.rs`).
//!
//! The measurements print one JSON line on stdout (for scripts) after a human summary on stderr.

mod append;
mod catchup;
mod client;
mod cpu;
mod lean;
mod relay;
mod sse;
mod stats;
mod wake;

use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "ursula-bench")]
struct Args {
    /// Base URL of the server, e.g. http://127.0.0.1:4437.
    #[arg(long, default_value = "http://127.0.0.1:4437")]
    url: String,
    /// Path prefix for stream names; the compat family works on every Durable Streams server.
    #[arg(long, default_value = "/v1/stream/bench")]
    prefix: String,
    /// A label for the JSON output.
    #[arg(long, default_value = "server")]
    label: String,
    /// For an `https://` URL: the CA the server's certificate chains to (PEM).
    #[arg(long, value_name = "FILE")]
    ca: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// Subscribers on one stream and a writer at a fixed rate.
#[derive(clap::Args)]
struct FanOut {
    #[arg(long, default_value_t = 100)]
    subscribers: usize,
    /// Messages per second.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Bytes per message (at least the send-time stamp, ~12 bytes).
    #[arg(long, default_value_t = 0)]
    size: usize,
    /// Process IDs of the server (every voter of a cluster): reports their CPU time per
    /// delivery over the measurement.
    #[arg(long, value_delimiter = ',')]
    server_pids: Vec<u32>,
}

#[derive(Subcommand)]
enum Command {
    /// Append throughput and latency.
    Append {
        #[arg(long, default_value_t = 100)]
        streams: usize,
        #[arg(long, default_value_t = 32)]
        writers: usize,
        #[arg(long, default_value_t = 256)]
        size: usize,
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        warmup: Duration,
        /// Spread the streams over this many buckets named `{prefix}-{run}-{b}` (the prefix
        /// must then be a bucket-like `/name`); a cluster places buckets in its Raft groups.
        #[arg(long, default_value_t = 0)]
        buckets: usize,
        /// Process IDs of the server (every voter of a cluster): reports their CPU time per
        /// append over the measurement.
        #[arg(long, value_delimiter = ',')]
        server_pids: Vec<u32>,
        /// Webhook subscriptions over the streams (each follows one by name), answered by a
        /// receiver in this process, while the appends run: what having them costs.
        #[arg(long, default_value_t = 0)]
        subscriptions: usize,
        /// How their consumer answers a webhook: `done` (handled at once: every append wakes
        /// them again) or `busy` (`{}`: each wake stays open for its lease).
        #[arg(long, default_value = "done", value_parser = ["done", "busy"])]
        consumers: String,
    },
    /// Wake latency of subscriptions.
    Wake {
        #[arg(long, default_value_t = 100)]
        streams: usize,
        #[arg(long, default_value_t = 1000)]
        subscriptions: usize,
        /// Appends per second.
        #[arg(long, default_value_t = 200)]
        rate: u64,
        #[arg(long, default_value_t = 256)]
        size: usize,
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
    },
    /// Catch-up read throughput: fill a stream, wait, read it from the start.
    CatchUp {
        /// Bytes the stream is filled with.
        #[arg(long, default_value_t = 64 * 1024 * 1024)]
        bytes: usize,
        /// Bytes per append.
        #[arg(long, default_value_t = 64 * 1024)]
        size: usize,
        /// Clients reading the stream at once, each from the start.
        #[arg(long, default_value_t = 1)]
        readers: usize,
        /// Wait between filling and reading (for a cold tier to flush).
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        settle: Duration,
    },
    /// SSE fan-out delivery latency.
    Sse(FanOut),
    /// Long-poll fan-out delivery latency: each subscriber polls from the last offset with
    /// the last cursor, as the Durable Streams client does.
    LongPoll(FanOut),
    /// Relays connections to an upstream byte for byte until killed (a proxy baseline).
    Relay {
        #[arg(long)]
        listen: String,
        /// host:port of the upstream.
        #[arg(long)]
        upstream: String,
    },
}

impl FanOut {
    fn options(&self, live: sse::Live) -> sse::Options {
        sse::Options {
            subscribers: self.subscribers,
            rate: self.rate,
            duration: self.duration,
            size: self.size,
            live,
            server_pids: self.server_pids.clone(),
        }
    }
}

fn main() {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("ursula-bench: {error}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(async move {
        let client = client::Client::new(&args.url, args.ca.as_deref())?;
        match args.command {
            Command::Append {
                streams,
                writers,
                size,
                duration,
                warmup,
                buckets,
                server_pids,
                subscriptions,
                consumers,
            } => {
                let options = append::Options {
                    streams,
                    writers,
                    size,
                    duration,
                    warmup,
                    buckets,
                    server_pids,
                    subscriptions,
                    consumers_done: consumers == "done",
                };
                append::run(client, &args.prefix, &args.label, options).await
            }
            Command::CatchUp {
                bytes,
                size,
                readers,
                settle,
            } => {
                let options = catchup::Options {
                    bytes,
                    size,
                    readers,
                    settle,
                };
                catchup::run(client, &args.prefix, &args.label, options).await
            }
            Command::Sse(fan_out) => {
                sse::run(
                    client,
                    &args.prefix,
                    &args.label,
                    fan_out.options(sse::Live::Sse),
                )
                .await
            }
            Command::LongPoll(fan_out) => {
                let options = fan_out.options(sse::Live::LongPoll);
                sse::run(client, &args.prefix, &args.label, options).await
            }
            Command::Wake {
                streams,
                subscriptions,
                rate,
                size,
                duration,
            } => {
                let options = wake::Options {
                    streams,
                    subscriptions,
                    rate,
                    size,
                    duration,
                };
                wake::run(client, &args.prefix, &args.label, options).await
            }
            Command::Relay { listen, upstream } => relay::run(&listen, &upstream).await,
        }
    });
    match result {
        Ok(line) => println!("{line}"),
        Err(error) => {
            eprintln!("ursula-bench: {error}");
            std::process::exit(1);
        }
    }
}
