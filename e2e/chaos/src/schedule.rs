//! What a seed decides: the faults, one after the other, each held for a while and then healed,
//! and the shape of the workload. Pure: a seed gives the same schedule on every machine, so a
//! failing seed replays it, and `without` shrinks it.
//!
//! Generators are versioned: a new kind of fault or client changes what a seed draws, so a
//! seed kept in the corpus names the generator that found it (`104 v1`) and replays with its
//! draws.

use crate::relay::LinkFault;
use crate::rng::Rng;

/// The newest generator; what new seeds use.
pub const GENERATOR: u32 = 3;

/// Whom a fault hits: a voter by index, or whoever leads the group of stream `n` when the fault
/// starts (a busy leader).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Voter(usize),
    LeaderOf(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL; restarted when the fault ends.
    Kill(Target),
    /// SIGSTOP; SIGCONT when the fault ends.
    Freeze(Target),
    /// The voter's cluster link is cut (and its client link, with `clients_too`) by taking
    /// its network namespace's interface down: a real partition. A leader cut from its peers
    /// but not its clients is the case that tests the marker.
    Partition { target: Target, clients_too: bool },
    /// Every voter SIGKILLed at once, then all restarted: only what is on disk survives.
    KillAll,
    /// The admin drain moves the target's leaderships away; undrained when the fault ends.
    Drain(Target),
    /// A gateway SIGKILLed and restarted.
    KillGateway(usize),
    /// The relay in front of the target's cluster listener delays, stalls or resets what its
    /// peers send it, and their answers (`relay.rs`).
    FlakyLink { target: Target, link: LinkFault },
    /// The voter's data disk (a small tmpfs of its own) filled up: to no byte free, or to just
    /// under the admission floor; emptied when the fault ends, and the voter restarted if it
    /// exited meanwhile.
    DiskFull { voter: usize, to_zero: bool },
    /// Each voter in turn stopped with SIGTERM, as Kubernetes stops a pod, and started again
    /// once it is gone; the next one once every voter is ready.
    RollingRestart,
    /// The target's wall clock stepped by `seconds` (forward or back), and stepped back when
    /// the fault ends, as NTP would correct it; its monotonic clock runs on. Through
    /// libfaketime (`LD_PRELOAD`, a timestamp file per voter, read again every second).
    ClockStep { target: Target, seconds: i64 },
    /// The target loses its volume, as a pod rescheduled onto a new disk does: SIGKILL, its
    /// data directory emptied, started again to join; when the fault ends it is brought back
    /// as the README says, through membership changes: demoted to a learner, caught up (from
    /// the log, or by snapshot where the log has been purged), promoted.
    LoseVolume(Target),
}

impl Fault {
    /// The kind, as the results table counts them.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Kill(Target::LeaderOf(_)) => "kill leader",
            Fault::Kill(Target::Voter(_)) => "kill voter",
            Fault::Freeze(_) => "freeze",
            Fault::Partition {
                clients_too: false, ..
            } => "partition from peers",
            Fault::Partition {
                clients_too: true, ..
            } => "partition from all",
            Fault::KillAll => "kill all",
            Fault::Drain(_) => "drain",
            Fault::KillGateway(_) => "kill gateway",
            Fault::FlakyLink {
                link: LinkFault::Delay { .. } | LinkFault::Clean,
                ..
            } => "slow link",
            Fault::FlakyLink {
                link: LinkFault::Stall,
                ..
            } => "stalled link",
            Fault::FlakyLink {
                link: LinkFault::Reset { .. },
                ..
            } => "resetting link",
            Fault::DiskFull { .. } => "disk full",
            Fault::RollingRestart => "rolling restart",
            Fault::ClockStep { .. } => "clock step",
            Fault::LoseVolume(_) => "lost volume",
        }
    }
}

/// The kinds, in the order the results table lists them.
pub const KINDS: [&str; 15] = [
    "kill leader",
    "kill voter",
    "freeze",
    "partition from peers",
    "partition from all",
    "kill all",
    "drain",
    "kill gateway",
    "slow link",
    "stalled link",
    "resetting link",
    "disk full",
    "rolling restart",
    "clock step",
    "lost volume",
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Milliseconds between the end of the previous fault (or the start of the load) and this.
    pub pause_ms: u64,
    pub fault: Fault,
    /// How long the fault holds before it is healed.
    pub lasts_ms: u64,
}

/// The workload's shape: how many of each client, and where each one enters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub streams: usize,
    /// Idempotent producers: (stream, entry, requests in flight at once).
    pub producers: Vec<(usize, Entry, usize)>,
    /// Writers of plain appends, not retried when their fate is unknown: (stream, entry).
    pub plain_writers: Vec<(usize, Entry)>,
    /// Catch-up readers and SSE followers: (stream, entry).
    pub readers: Vec<(usize, Entry)>,
    pub followers: Vec<(usize, Entry)>,
    /// Long-poll followers: (stream, entry).
    pub pollers: Vec<(usize, Entry)>,
    /// Clients that create, append to, fork, close and delete streams of their own bucket:
    /// their entries.
    pub lifecycles: Vec<Entry>,
}

/// Where a client sends its requests: a voter (following redirects, as the official clients
/// do) or the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Voter(usize),
    Gateway(usize),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub generator: u32,
    pub voters: usize,
    pub gateways: usize,
    pub steps: Vec<Step>,
    pub workload: Workload,
}

/// What the machine can do: real partitions need network namespaces.
#[derive(Clone, Copy, Debug)]
pub struct Abilities {
    pub partitions: bool,
    /// Small disks of their own for voters (tmpfs mounts: root).
    pub disks: bool,
    /// Fake wall clocks (libfaketime installed).
    pub clocks: bool,
}

impl Schedule {
    /// What `seed` draws under the newest generator.
    pub fn generate(seed: u64, abilities: Abilities) -> Self {
        Self::generate_with(GENERATOR, seed, abilities)
    }

    /// What `seed` draws under `generator` (1: session 16's, 3 voters, 1 gateway, the first
    /// eight kinds of fault, one request in flight per producer, no lifecycle clients; 2:
    /// session 20's, every kind but a lost volume; 3: a lost volume too).
    pub fn generate_with(generator: u32, seed: u64, abilities: Abilities) -> Self {
        let v1 = generator == 1;
        let mut rng = Rng::new(seed);
        let voters = if v1 || !rng.percent(25) { 3 } else { 5 };
        let gateways = if v1 { 1 } else { rng.between(1, 2) as usize };
        let streams = rng.between(2, 4) as usize;
        let entry = |rng: &mut Rng| {
            if rng.percent(30) {
                Entry::Gateway(if v1 {
                    0
                } else {
                    rng.below(gateways as u64) as usize
                })
            } else {
                Entry::Voter(rng.below(voters as u64) as usize)
            }
        };
        let clients = |count: u64, rng: &mut Rng| {
            (0..count)
                .map(|_| (rng.below(streams as u64) as usize, entry(rng)))
                .collect::<Vec<_>>()
        };
        let producers = {
            let n = rng.between(3, 6);
            clients(n, &mut rng)
        };
        let producers = producers
            .into_iter()
            .map(|(stream, entry)| {
                let in_flight = if v1 { 1 } else { rng.between(1, 3) as usize };
                (stream, entry, in_flight)
            })
            .collect();
        let plain_writers = {
            let n = rng.between(1, 2);
            clients(n, &mut rng)
        };
        let readers = {
            let n = rng.between(1, 3);
            clients(n, &mut rng)
        };
        let followers = {
            let n = rng.between(1, 3);
            clients(n, &mut rng)
        };
        let mut steps = Vec::new();
        for _ in 0..rng.between(3, 5) {
            let target = |rng: &mut Rng| {
                if rng.percent(60) {
                    Target::LeaderOf(rng.below(streams as u64) as usize)
                } else {
                    Target::Voter(rng.below(voters as u64) as usize)
                }
            };
            let fault = loop {
                let fault = if v1 {
                    match rng.below(100) {
                        0..30 => Fault::Kill(target(&mut rng)),
                        30..45 => Fault::Freeze(target(&mut rng)),
                        45..65 => Fault::Partition {
                            target: target(&mut rng),
                            clients_too: rng.percent(50),
                        },
                        65..73 => Fault::KillAll,
                        73..88 => Fault::Drain(target(&mut rng)),
                        _ => Fault::KillGateway(0),
                    }
                } else {
                    // Generator 3 draws from a wider range; 2's draws stay what they were.
                    match rng.below(if generator >= 3 { 108 } else { 100 }) {
                        0..18 => Fault::Kill(target(&mut rng)),
                        18..27 => Fault::Freeze(target(&mut rng)),
                        27..40 => Fault::Partition {
                            target: target(&mut rng),
                            clients_too: rng.percent(50),
                        },
                        40..45 => Fault::KillAll,
                        45..52 => Fault::Drain(target(&mut rng)),
                        52..58 => Fault::KillGateway(rng.below(gateways as u64) as usize),
                        58..75 => Fault::FlakyLink {
                            target: target(&mut rng),
                            link: match rng.below(3) {
                                0 => LinkFault::Delay {
                                    ms: rng.between(5, 60),
                                    jitter_ms: rng.between(0, 40),
                                },
                                1 => LinkFault::Stall,
                                _ => LinkFault::Reset {
                                    percent: rng.between(2, 20),
                                },
                            },
                        },
                        75..84 => Fault::DiskFull {
                            voter: rng.below(voters as u64) as usize,
                            to_zero: rng.percent(50),
                        },
                        84..92 => Fault::RollingRestart,
                        // Forward up to 6 hours, or back up to 30 minutes (the test
                        // certificates are valid from an hour before they were made).
                        100.. => Fault::LoseVolume(target(&mut rng)),
                        _ => Fault::ClockStep {
                            target: target(&mut rng),
                            seconds: if rng.percent(50) {
                                rng.between(10, 6 * 3600) as i64
                            } else {
                                -(rng.between(10, 1800) as i64)
                            },
                        },
                    }
                };
                let possible = match fault {
                    Fault::Partition { .. } => abilities.partitions,
                    Fault::DiskFull { .. } => abilities.disks,
                    Fault::ClockStep { .. } => abilities.clocks,
                    _ => true,
                };
                if possible {
                    break fault;
                }
            };
            steps.push(Step {
                pause_ms: rng.between(100, 1200),
                fault,
                lasts_ms: rng.between(200, 2500),
            });
        }
        let (lifecycles, pollers) = if v1 {
            (Vec::new(), Vec::new())
        } else {
            let lifecycles = (0..rng.between(1, 2)).map(|_| entry(&mut rng)).collect();
            let n = rng.between(1, 2);
            (lifecycles, clients(n, &mut rng))
        };
        Self {
            seed,
            generator,
            voters,
            gateways,
            steps,
            workload: Workload {
                streams,
                producers,
                plain_writers,
                readers,
                followers,
                pollers,
                lifecycles,
            },
        }
    }

    /// Whether the voters run on fake clocks: a `ClockStep` is drawn.
    pub fn steps_clocks(&self) -> bool {
        self.steps
            .iter()
            .any(|step| matches!(step.fault, Fault::ClockStep { .. }))
    }

    /// The voters whose data directory is a small disk of its own: those a `DiskFull` hits.
    pub fn small_disks(&self) -> Vec<usize> {
        let mut voters: Vec<usize> = self
            .steps
            .iter()
            .filter_map(|step| match step.fault {
                Fault::DiskFull { voter, .. } => Some(voter),
                _ => None,
            })
            .collect();
        voters.sort_unstable();
        voters.dedup();
        voters
    }

    /// The same schedule without step `i`: one shrinking move.
    pub fn without(&self, i: usize) -> Self {
        let mut shrunk = self.clone();
        shrunk.steps.remove(i);
        shrunk
    }

    pub fn describe(&self) -> String {
        self.steps
            .iter()
            .map(|step| {
                format!(
                    "+{}ms {:?} for {}ms",
                    step.pause_ms, step.fault, step.lasts_ms
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Abilities = Abilities {
        partitions: true,
        disks: true,
        clocks: true,
    };
    const NONE: Abilities = Abilities {
        partitions: false,
        disks: false,
        clocks: false,
    };

    #[test]
    fn a_seed_is_one_schedule() {
        assert_eq!(Schedule::generate(42, ALL), Schedule::generate(42, ALL));
        assert_ne!(Schedule::generate(42, ALL), Schedule::generate(43, ALL));
    }

    #[test]
    fn schedules_stay_within_the_cluster_and_the_machine() {
        let mut kinds = std::collections::BTreeSet::new();
        let mut sizes = std::collections::BTreeSet::new();
        for seed in 0..500 {
            let schedule = Schedule::generate(seed, ALL);
            sizes.insert((schedule.voters, schedule.gateways));
            let streams = schedule.workload.streams;
            assert!((3..=5).contains(&schedule.steps.len()), "seed {seed}");
            for step in &schedule.steps {
                kinds.insert(step.fault.kind());
                let target = match step.fault {
                    Fault::Kill(t) | Fault::Freeze(t) | Fault::Drain(t) | Fault::LoseVolume(t) => {
                        Some(t)
                    }
                    Fault::Partition { target, .. }
                    | Fault::FlakyLink { target, .. }
                    | Fault::ClockStep { target, .. } => Some(target),
                    Fault::DiskFull { voter, .. } => Some(Target::Voter(voter)),
                    Fault::KillGateway(g) => {
                        assert!(g < schedule.gateways);
                        None
                    }
                    Fault::KillAll | Fault::RollingRestart => None,
                };
                match target {
                    Some(Target::Voter(v)) => assert!(v < schedule.voters),
                    Some(Target::LeaderOf(s)) => assert!(s < streams),
                    None => {}
                }
            }
            let workload = &schedule.workload;
            let entries = workload
                .producers
                .iter()
                .map(|&(stream, entry, in_flight)| {
                    assert!((1..=3).contains(&in_flight));
                    (stream, entry)
                })
                .chain(workload.plain_writers.iter().copied())
                .chain(workload.readers.iter().copied())
                .chain(workload.followers.iter().copied())
                .chain(workload.pollers.iter().copied());
            for (stream, entry) in entries {
                assert!(stream < streams);
                match entry {
                    Entry::Voter(v) => assert!(v < schedule.voters),
                    Entry::Gateway(g) => assert!(g < schedule.gateways),
                }
            }
            assert!((1..=2).contains(&workload.lifecycles.len()));
            let without = Schedule::generate(seed, NONE);
            assert!(
                without.steps.iter().all(|s| !matches!(
                    s.fault,
                    Fault::Partition { .. } | Fault::DiskFull { .. } | Fault::ClockStep { .. }
                )),
                "no partitions, small disks or fake clocks where the machine cannot make them"
            );
        }
        assert_eq!(kinds.len(), KINDS.len(), "every kind is drawn: {kinds:?}");
        assert!(kinds.iter().all(|k| KINDS.contains(k)));
        assert_eq!(
            sizes.len(),
            4,
            "3 and 5 voters, 1 and 2 gateways: {sizes:?}"
        );
    }

    #[test]
    fn the_first_generator_draws_what_it_drew() {
        // Seed 104 of the corpus, as session 16 shrank it: a partition from peers, then a
        // kill of every voter.
        let schedule = Schedule::generate_with(1, 104, ALL);
        assert_eq!((schedule.voters, schedule.gateways), (3, 1));
        assert!(schedule.workload.lifecycles.is_empty());
        assert!(schedule.workload.producers.iter().all(|p| p.2 == 1));
        let faults: Vec<Fault> = schedule.steps.iter().map(|s| s.fault).collect();
        assert!(
            faults.windows(2).any(|w| matches!(
                w,
                [
                    Fault::Partition {
                        clients_too: false,
                        ..
                    },
                    Fault::KillAll
                ]
            )),
            "{faults:?}"
        );
        for seed in 0..200 {
            let kinds: Vec<_> = Schedule::generate_with(1, seed, ALL)
                .steps
                .iter()
                .map(|s| s.fault.kind())
                .collect();
            assert!(kinds.iter().all(|k| KINDS[..8].contains(k)), "{kinds:?}");
        }
    }

    #[test]
    fn the_second_generator_draws_no_lost_volume() {
        for seed in 0..500 {
            let schedule = Schedule::generate_with(2, seed, ALL);
            assert!(
                schedule
                    .steps
                    .iter()
                    .all(|s| !matches!(s.fault, Fault::LoseVolume(_))),
                "seed {seed} v2: {}",
                schedule.describe()
            );
        }
    }

    #[test]
    fn shrinking_drops_one_step() {
        let schedule = Schedule::generate(7, ALL);
        let shrunk = schedule.without(0);
        assert_eq!(shrunk.steps, schedule.steps[1..]);
        assert_eq!(shrunk.workload, schedule.workload);
    }
}
