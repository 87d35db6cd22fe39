//! `ursula-chaos`: runs seeds of the campaign and reports each; exits 1 if any found an
//! anomaly. A failing seed is shrunk (faults dropped one at a time while it still fails).

use std::fmt::Write as _;
use std::process::ExitCode;

use clap::Parser;
use ursula_chaos::campaign::{self, Report};
use ursula_chaos::schedule::{Abilities, GENERATOR, KINDS, Schedule};

#[derive(Parser, Debug)]
#[command(name = "ursula-chaos")]
struct Args {
    /// How many new seeds to run.
    #[arg(long, default_value_t = 10)]
    runs: u64,
    /// The first of them; by default one drawn from the clock, printed, so that every campaign
    /// explores new schedules.
    #[arg(long)]
    first_seed: Option<u64>,
    /// Seeds to replay first: a file with one seed per line (`#` starts a comment).
    #[arg(long)]
    corpus: Option<std::path::PathBuf>,
    /// Writes the results table (Markdown) here.
    #[arg(long)]
    results: Option<std::path::PathBuf>,
    /// Do not shrink failing seeds.
    #[arg(long)]
    no_shrink: bool,
    /// Keep only these steps (by index, e.g. `1,2`) of every seed's schedule: replays what a
    /// shrink printed.
    #[arg(long, value_delimiter = ',')]
    keep: Vec<usize>,
    /// Print each seed's schedule and run nothing.
    #[arg(long)]
    dry_run: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let abilities = Abilities {
        partitions: ursula_testkit::netns::Network::create(1).is_ok(),
        disks: ursula_chaos::disk::can_mount(),
        clocks: ursula_chaos::clock::library().is_some(),
    };
    if !abilities.partitions {
        eprintln!("no network namespaces here (root or CAP_NET_ADMIN): no partitions");
    }
    if !abilities.disks {
        eprintln!("no tmpfs mounts here (root): no full disks");
    }
    if !abilities.clocks {
        eprintln!("no libfaketime here (Debian package faketime): no clock steps");
    }
    let first = args.first_seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
            % 1_000_000
            * 1000
    });
    // (seed, generator): a corpus line is `SEED vN`, a seed found by generator N.
    let mut seeds: Vec<(u64, u32)> = Vec::new();
    if let Some(corpus) = &args.corpus {
        let text = std::fs::read_to_string(corpus).unwrap_or_default();
        seeds.extend(text.lines().filter_map(|line| {
            let mut words = line.split('#').next()?.split_whitespace();
            let seed = words.next()?.parse().ok()?;
            let generator = words
                .next()
                .and_then(|v| v.strip_prefix('v')?.parse().ok())
                .unwrap_or(GENERATOR);
            Some((seed, generator))
        }));
    }
    seeds.extend((first..first + args.runs).map(|seed| (seed, GENERATOR)));
    println!("seeds: {seeds:?}");
    let mut reports = Vec::new();
    for (seed, generator) in seeds {
        let mut schedule = Schedule::generate_with(generator, seed, abilities);
        if !args.keep.is_empty() {
            schedule.steps = (0..schedule.steps.len())
                .filter(|i| args.keep.contains(i))
                .map(|i| schedule.steps[i].clone())
                .collect();
        }
        println!(
            "seed {seed} (v{generator}, {} voters, {} gateways): {}",
            schedule.voters,
            schedule.gateways,
            schedule.describe()
        );
        if args.dry_run {
            continue;
        }
        let report = run_one(&schedule, abilities.partitions);
        println!(
            "seed {seed}: {} operations, {} anomalies, {:.1} s",
            report.operations,
            report.anomalies.len(),
            report.seconds
        );
        for note in &report.notes {
            println!("  note: {note}");
        }
        for anomaly in &report.anomalies {
            println!("  ANOMALY {anomaly}");
        }
        if !report.anomalies.is_empty() && !args.no_shrink {
            let shrunk = shrink(&schedule, abilities.partitions);
            println!("seed {seed} shrunk to: {}", shrunk.describe());
        }
        reports.push(report);
    }
    let table = table(&reports);
    println!("{table}");
    if let Some(path) = &args.results
        && let Err(error) = std::fs::write(path, &table)
    {
        eprintln!("cannot write {}: {error}", path.display());
        return ExitCode::FAILURE;
    }
    if reports.iter().any(|r| !r.anomalies.is_empty()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// One run; a run that panics (a voter that never became ready, a read no voter answered)
/// fails its seed, and the campaign goes on.
fn run_one(schedule: &Schedule, partitions: bool) -> Report {
    let started = std::time::Instant::now();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        campaign::run(schedule, partitions)
    }))
    .unwrap_or_else(|_| Report {
        seed: schedule.seed,
        faults: schedule.steps.iter().map(|s| s.fault.kind()).collect(),
        operations: 0,
        anomalies: vec!["the run panicked (its message is above)".into()],
        seconds: started.elapsed().as_secs_f64(),
        notes: Vec::new(),
    })
}

/// Drops faults one at a time while the run still finds an anomaly.
fn shrink(schedule: &Schedule, partitions: bool) -> Schedule {
    let mut smallest = schedule.clone();
    let mut i = 0;
    while i < smallest.steps.len() {
        let candidate = smallest.without(i);
        if run_one(&candidate, partitions).anomalies.is_empty() {
            i += 1;
        } else {
            smallest = candidate;
        }
    }
    smallest
}

fn table(reports: &[Report]) -> String {
    let mut out = String::from("| seeds | runs | operations | anomalies |");
    for kind in KINDS {
        let _ = write!(out, " {kind} |");
    }
    out.push_str("\n|---|---|---|---|");
    out.push_str(&"---|".repeat(KINDS.len()));
    let (Some(low), Some(high)) = (
        reports.iter().map(|r| r.seed).min(),
        reports.iter().map(|r| r.seed).max(),
    ) else {
        return out;
    };
    let _ = write!(
        out,
        "\n| {low}..={high} | {} | {} | {} |",
        reports.len(),
        reports.iter().map(|r| r.operations).sum::<usize>(),
        reports.iter().map(|r| r.anomalies.len()).sum::<usize>()
    );
    for kind in KINDS {
        let count = reports
            .iter()
            .flat_map(|r| &r.faults)
            .filter(|k| **k == kind)
            .count();
        let _ = write!(out, " {count} |");
    }
    out.push('\n');
    out
}
