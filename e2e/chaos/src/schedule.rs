//! What a seed decides: the faults, one after the other, each held for a while and then healed,
//! and the shape of the workload. Pure: a seed gives the same schedule on every machine, so a
//! failing seed replays it, and `without` shrinks it.

use crate::rng::Rng;

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
    /// The gateway SIGKILLed and restarted.
    KillGateway,
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
            Fault::KillGateway => "kill gateway",
        }
    }
}

/// The kinds, in the order the results table lists them.
pub const KINDS: [&str; 8] = [
    "kill leader",
    "kill voter",
    "freeze",
    "partition from peers",
    "partition from all",
    "kill all",
    "drain",
    "kill gateway",
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
    /// Idempotent producers: (stream, entry).
    pub producers: Vec<(usize, Entry)>,
    /// Writers of plain appends, not retried when their fate is unknown: (stream, entry).
    pub plain_writers: Vec<(usize, Entry)>,
    /// Catch-up readers and SSE followers: (stream, entry).
    pub readers: Vec<(usize, Entry)>,
    pub followers: Vec<(usize, Entry)>,
}

/// Where a client sends its requests: a voter (following redirects, as the official clients
/// do) or the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Voter(usize),
    Gateway,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub voters: usize,
    pub steps: Vec<Step>,
    pub workload: Workload,
}

/// What the machine can do: real partitions need network namespaces.
#[derive(Clone, Copy, Debug)]
pub struct Abilities {
    pub partitions: bool,
}

impl Schedule {
    pub fn generate(seed: u64, abilities: Abilities) -> Self {
        let mut rng = Rng::new(seed);
        let voters = 3;
        let streams = rng.between(2, 4) as usize;
        let entry = |rng: &mut Rng| {
            if rng.percent(30) {
                Entry::Gateway
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
                let fault = match rng.below(100) {
                    0..30 => Fault::Kill(target(&mut rng)),
                    30..45 => Fault::Freeze(target(&mut rng)),
                    45..65 => Fault::Partition {
                        target: target(&mut rng),
                        clients_too: rng.percent(50),
                    },
                    65..73 => Fault::KillAll,
                    73..88 => Fault::Drain(target(&mut rng)),
                    _ => Fault::KillGateway,
                };
                if abilities.partitions || !matches!(fault, Fault::Partition { .. }) {
                    break fault;
                }
            };
            steps.push(Step {
                pause_ms: rng.between(100, 1200),
                fault,
                lasts_ms: rng.between(200, 2500),
            });
        }
        Self {
            seed,
            voters,
            steps,
            workload: Workload {
                streams,
                producers,
                plain_writers,
                readers,
                followers,
            },
        }
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

    const ALL: Abilities = Abilities { partitions: true };

    #[test]
    fn a_seed_is_one_schedule() {
        assert_eq!(Schedule::generate(42, ALL), Schedule::generate(42, ALL));
        assert_ne!(Schedule::generate(42, ALL), Schedule::generate(43, ALL));
    }

    #[test]
    fn schedules_stay_within_the_cluster_and_the_machine() {
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..500 {
            let schedule = Schedule::generate(seed, ALL);
            let streams = schedule.workload.streams;
            assert!((3..=5).contains(&schedule.steps.len()), "seed {seed}");
            for step in &schedule.steps {
                kinds.insert(step.fault.kind());
                let target = match step.fault {
                    Fault::Kill(t) | Fault::Freeze(t) | Fault::Drain(t) => Some(t),
                    Fault::Partition { target, .. } => Some(target),
                    Fault::KillAll | Fault::KillGateway => None,
                };
                match target {
                    Some(Target::Voter(v)) => assert!(v < schedule.voters),
                    Some(Target::LeaderOf(s)) => assert!(s < streams),
                    None => {}
                }
            }
            let workload = &schedule.workload;
            for (stream, entry) in workload
                .producers
                .iter()
                .chain(&workload.plain_writers)
                .chain(&workload.readers)
                .chain(&workload.followers)
            {
                assert!(*stream < streams);
                if let Entry::Voter(v) = entry {
                    assert!(*v < schedule.voters);
                }
            }
            let without = Schedule::generate(seed, Abilities { partitions: false });
            assert!(
                without
                    .steps
                    .iter()
                    .all(|s| !matches!(s.fault, Fault::Partition { .. })),
                "no partitions where the machine cannot make them"
            );
        }
        assert_eq!(kinds.len(), KINDS.len(), "every kind is drawn: {kinds:?}");
        assert!(kinds.iter().all(|k| KINDS.contains(k)));
    }

    #[test]
    fn shrinking_drops_one_step() {
        let schedule = Schedule::generate(7, ALL);
        let shrunk = schedule.without(0);
        assert_eq!(shrunk.steps, schedule.steps[1..]);
        assert_eq!(shrunk.workload, schedule.workload);
    }
}
