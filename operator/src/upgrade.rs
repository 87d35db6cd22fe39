//! The upgrade planner: from what the cluster looks like now, the one next step of a version
//! change. Pure, so that every state of a rollout and a rollback is a table row.
//!
//! Going up, gateways go first (a newer gateway understands older nodes); going down, voters go
//! first and gateways last. Voters are replaced one at a time, highest ordinal first: drain it
//! (its groups elect other leaders), delete its pod (the StatefulSet, `OnDelete`, recreates it
//! from the new template), wait until it is ready and caught up. Never more than one voter is
//! down: a replacement starts only when every voter is ready, and a voter that does not become
//! ready in time halts the upgrade.

use std::cmp::Ordering;
use std::time::Duration;

/// The gateway Deployment as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayState {
    /// The version (image tag) of its pod template.
    pub version: String,
    /// Whether the rollout of that template is complete: every replica updated and available.
    pub rolled_out: bool,
    /// Available replicas, whatever their version.
    pub available: u16,
}

/// One voter pod as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoterState {
    pub ordinal: u8,
    /// The version its pod runs; `None` when the pod does not exist (being recreated).
    pub version: Option<String>,
    /// Ready: serving, caught up, and knowing a leader for every group (`/readyz`).
    pub ready: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub desired: String,
    pub gateway: GatewayState,
    /// Ordered by ordinal.
    pub voters: Vec<VoterState>,
    /// How long the current step has been waiting (for a voter or gateway to become ready).
    pub waiting_for: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Everything runs the desired version and is ready.
    Done,
    /// Set the gateway Deployment's template to the desired version.
    RollGateway,
    /// The gateway rollout is in progress.
    WaitForGateway,
    /// Set the voters' StatefulSet template to the desired version (replaces no pod).
    UpdateVoterTemplate,
    /// Drain voter `ordinal` and delete its pod.
    ReplaceVoter(u8),
    /// Voter `ordinal` is being recreated or catching up.
    WaitForVoter(u8),
    /// A membership change is underway (`membership`); the upgrade waits for it.
    WaitForMembership,
    /// Stop and report `Degraded`.
    Halt(String),
}

/// The planner's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a replaced voter, or a gateway rollout, may take to become ready.
    pub ready_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            ready_timeout: Duration::from_secs(600),
        }
    }
}

impl Observed {
    /// Whether a version change is underway: anything that exists runs, or is templated at, a
    /// version other than the desired one. (A voter pod that is only not ready is not one.)
    pub fn version_changing(&self, voter_template: &str) -> bool {
        let desired = self.desired.as_str();
        self.gateway.version != desired
            || voter_template != desired
            || self.voters.iter().any(|v| {
                v.version
                    .as_deref()
                    .is_some_and(|version| version != desired)
            })
    }
}

/// Orders versions numerically by dot-separated parts (`0.10.0` > `0.9.1`, an optional `v`
/// prefix ignored); versions that do not parse compare as text.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let parse = |v: &str| -> Option<Vec<u64>> {
        v.trim_start_matches('v')
            .split(['.', '-', '+'])
            .take(3)
            .map(|part| part.parse().ok())
            .collect()
    };
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => x.cmp(&y).then_with(|| a.cmp(b)),
        _ => a.cmp(b),
    }
}

/// The next step toward `observed.desired`. `voter_template` is the version of the
/// StatefulSet's pod template.
pub fn next_step(observed: &Observed, voter_template: &str, limits: Limits) -> Step {
    let desired = observed.desired.as_str();
    let stale_voters: Vec<&VoterState> = observed
        .voters
        .iter()
        .filter(|v| v.version.as_deref() != Some(desired))
        .collect();
    let gateway_current = observed.gateway.version == desired;
    // Going down when anything runs newer than desired: voters first, then gateways.
    let rollback = compare_versions(&observed.gateway.version, desired) == Ordering::Greater
        || observed.voters.iter().any(|v| {
            v.version
                .as_deref()
                .is_some_and(|version| compare_versions(version, desired) == Ordering::Greater)
        });
    let timed_out = observed.waiting_for > limits.ready_timeout;

    let gateway_step = || {
        if !gateway_current {
            Some(Step::RollGateway)
        } else if !observed.gateway.rolled_out {
            Some(if timed_out {
                Step::Halt(format!(
                    "the gateway rollout to {desired} did not complete in {:?}",
                    limits.ready_timeout
                ))
            } else {
                Step::WaitForGateway
            })
        } else {
            None
        }
    };
    let voter_step = || -> Option<Step> {
        // A voter that is missing or not ready is waited for: never more than one voter down.
        // Unless a rollback finds it down at the newer version (an upgrade that halted on a bad
        // version): replacing it takes nothing more down, and waiting would wait forever.
        if let Some(down) = observed.voters.iter().find(|v| !v.ready) {
            let stuck_at_newer = down
                .version
                .as_deref()
                .is_some_and(|v| compare_versions(v, desired) == Ordering::Greater);
            if stuck_at_newer {
                return Some(if voter_template != desired {
                    Step::UpdateVoterTemplate
                } else {
                    Step::ReplaceVoter(down.ordinal)
                });
            }
            return Some(if timed_out {
                Step::Halt(format!(
                    "voter {} did not become ready in {:?}",
                    down.ordinal, limits.ready_timeout
                ))
            } else {
                Step::WaitForVoter(down.ordinal)
            });
        }
        if stale_voters.is_empty() {
            return None;
        }
        if voter_template != desired {
            return Some(Step::UpdateVoterTemplate);
        }
        stale_voters
            .iter()
            .map(|v| v.ordinal)
            .max()
            .map(Step::ReplaceVoter)
    };

    let first = if rollback {
        voter_step().or_else(gateway_step)
    } else {
        gateway_step().or_else(voter_step)
    };
    first.unwrap_or(Step::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voter(ordinal: u8, version: Option<&str>, ready: bool) -> VoterState {
        VoterState {
            ordinal,
            version: version.map(str::to_owned),
            ready,
        }
    }

    fn observed(desired: &str, gateway: (&str, bool), voters: &[(Option<&str>, bool)]) -> Observed {
        Observed {
            desired: desired.into(),
            gateway: GatewayState {
                version: gateway.0.into(),
                rolled_out: gateway.1,
                available: 2,
            },
            voters: voters
                .iter()
                .enumerate()
                .map(|(i, (version, ready))| voter(i as u8, *version, *ready))
                .collect(),
            waiting_for: Duration::from_secs(1),
        }
    }

    const OLD: Option<&str> = Some("0.7.2");
    const NEW: Option<&str> = Some("0.7.3");

    #[test]
    fn only_versions_make_a_version_change_not_a_voter_that_is_down() {
        for (what, observed, template, changing) in [
            (
                "settled",
                observed("0.7.3", ("0.7.3", true), &[(NEW, true), (NEW, true)]),
                "0.7.3",
                false,
            ),
            (
                "a new pod not ready",
                observed("0.7.3", ("0.7.3", true), &[(NEW, true), (None, false)]),
                "0.7.3",
                false,
            ),
            (
                "gateway behind",
                observed("0.7.3", ("0.7.2", true), &[(NEW, true)]),
                "0.7.3",
                true,
            ),
            (
                "template behind",
                observed("0.7.3", ("0.7.3", true), &[(NEW, true)]),
                "0.7.2",
                true,
            ),
            (
                "a voter behind",
                observed("0.7.3", ("0.7.3", true), &[(NEW, true), (OLD, true)]),
                "0.7.3",
                true,
            ),
        ] {
            assert_eq!(observed.version_changing(template), changing, "{what}");
        }
    }

    #[test]
    fn upgrade_rolls_gateways_then_voters_from_the_highest_ordinal() {
        let limits = Limits::default();
        let cases: Vec<(&str, Observed, &str, Step)> = vec![
            (
                "start: gateways first",
                observed(
                    "0.7.3",
                    ("0.7.2", true),
                    &[(OLD, true), (OLD, true), (OLD, true)],
                ),
                "0.7.2",
                Step::RollGateway,
            ),
            (
                "gateway rolling out",
                observed(
                    "0.7.3",
                    ("0.7.3", false),
                    &[(OLD, true), (OLD, true), (OLD, true)],
                ),
                "0.7.2",
                Step::WaitForGateway,
            ),
            (
                "gateway done: voter template",
                observed(
                    "0.7.3",
                    ("0.7.3", true),
                    &[(OLD, true), (OLD, true), (OLD, true)],
                ),
                "0.7.2",
                Step::UpdateVoterTemplate,
            ),
            (
                "highest ordinal first",
                observed(
                    "0.7.3",
                    ("0.7.3", true),
                    &[(OLD, true), (OLD, true), (OLD, true)],
                ),
                "0.7.3",
                Step::ReplaceVoter(2),
            ),
            (
                "replaced voter's pod recreating",
                observed(
                    "0.7.3",
                    ("0.7.3", true),
                    &[(OLD, true), (OLD, true), (None, false)],
                ),
                "0.7.3",
                Step::WaitForVoter(2),
            ),
            (
                "replaced voter catching up",
                observed(
                    "0.7.3",
                    ("0.7.3", true),
                    &[(OLD, true), (OLD, true), (NEW, false)],
                ),
                "0.7.3",
                Step::WaitForVoter(2),
            ),
            (
                "next voter",
                observed(
                    "0.7.3",
                    ("0.7.3", true),
                    &[(OLD, true), (OLD, true), (NEW, true)],
                ),
                "0.7.3",
                Step::ReplaceVoter(1),
            ),
            (
                "last voter",
                observed(
                    "0.7.3",
                    ("0.7.3", true),
                    &[(OLD, true), (NEW, true), (NEW, true)],
                ),
                "0.7.3",
                Step::ReplaceVoter(0),
            ),
            (
                "done",
                observed(
                    "0.7.3",
                    ("0.7.3", true),
                    &[(NEW, true), (NEW, true), (NEW, true)],
                ),
                "0.7.3",
                Step::Done,
            ),
            (
                "a voter down for another reason blocks a replacement",
                observed(
                    "0.7.3",
                    ("0.7.3", true),
                    &[(OLD, false), (OLD, true), (OLD, true)],
                ),
                "0.7.3",
                Step::WaitForVoter(0),
            ),
        ];
        for (name, state, template, expected) in cases {
            assert_eq!(next_step(&state, template, limits), expected, "{name}");
        }
    }

    #[test]
    fn a_rollback_replaces_a_voter_stuck_at_the_bad_version() {
        let limits = Limits::default();
        let mut stuck = observed(
            "0.7.2",
            ("0.7.3", true),
            &[(OLD, true), (OLD, true), (NEW, false)],
        );
        stuck.waiting_for = Duration::from_secs(3600);
        let cases: Vec<(&str, &Observed, &str, Step)> = vec![
            (
                "voter template first",
                &stuck,
                "0.7.3",
                Step::UpdateVoterTemplate,
            ),
            (
                "then the stuck voter",
                &stuck,
                "0.7.2",
                Step::ReplaceVoter(2),
            ),
        ];
        for (name, state, template, expected) in cases {
            assert_eq!(next_step(state, template, limits), expected, "{name}");
        }
        // Going forward, a voter not ready at the desired version is still waited for.
        let mut waiting = observed(
            "0.7.3",
            ("0.7.3", true),
            &[(OLD, true), (OLD, true), (NEW, false)],
        );
        assert_eq!(next_step(&waiting, "0.7.3", limits), Step::WaitForVoter(2));
        waiting.waiting_for = Duration::from_secs(3600);
        assert!(matches!(
            next_step(&waiting, "0.7.3", limits),
            Step::Halt(_)
        ));
    }

    #[test]
    fn rollback_replaces_voters_first_and_gateways_last() {
        let limits = Limits::default();
        let cases: Vec<(&str, Observed, &str, Step)> = vec![
            (
                "voter template first",
                observed(
                    "0.7.2",
                    ("0.7.3", true),
                    &[(NEW, true), (NEW, true), (NEW, true)],
                ),
                "0.7.3",
                Step::UpdateVoterTemplate,
            ),
            (
                "highest ordinal first",
                observed(
                    "0.7.2",
                    ("0.7.3", true),
                    &[(NEW, true), (NEW, true), (NEW, true)],
                ),
                "0.7.2",
                Step::ReplaceVoter(2),
            ),
            (
                "gateways only after every voter",
                observed(
                    "0.7.2",
                    ("0.7.3", true),
                    &[(OLD, true), (OLD, true), (NEW, true)],
                ),
                "0.7.2",
                Step::ReplaceVoter(2),
            ),
            (
                "then gateways",
                observed(
                    "0.7.2",
                    ("0.7.3", true),
                    &[(OLD, true), (OLD, true), (OLD, true)],
                ),
                "0.7.2",
                Step::RollGateway,
            ),
            (
                "rolled back",
                observed(
                    "0.7.2",
                    ("0.7.2", true),
                    &[(OLD, true), (OLD, true), (OLD, true)],
                ),
                "0.7.2",
                Step::Done,
            ),
        ];
        for (name, state, template, expected) in cases {
            assert_eq!(next_step(&state, template, limits), expected, "{name}");
        }
    }

    #[test]
    fn stalls_halt_and_spec_changes_mid_upgrade_replan() {
        let limits = Limits {
            ready_timeout: Duration::from_secs(60),
        };
        let mut stuck = observed(
            "0.7.3",
            ("0.7.3", true),
            &[(OLD, true), (OLD, true), (NEW, false)],
        );
        stuck.waiting_for = Duration::from_secs(61);
        assert_eq!(
            next_step(&stuck, "0.7.3", limits),
            Step::Halt("voter 2 did not become ready in 60s".into()),
            "a voter that never becomes ready halts the upgrade"
        );
        let mut stalled = observed(
            "0.7.3",
            ("0.7.3", false),
            &[(OLD, true), (OLD, true), (OLD, true)],
        );
        stalled.waiting_for = Duration::from_secs(61);
        assert!(matches!(
            next_step(&stalled, "0.7.2", limits),
            Step::Halt(_)
        ));

        // Mid-upgrade (gateways and one voter on 0.7.3) the spec goes to 0.7.4: gateways
        // first again, and every voter, the upgraded one too, follows.
        let moved_on = observed(
            "0.7.4",
            ("0.7.3", true),
            &[(OLD, true), (OLD, true), (NEW, true)],
        );
        assert_eq!(next_step(&moved_on, "0.7.3", limits), Step::RollGateway);
        let voters_next = observed(
            "0.7.4",
            ("0.7.4", true),
            &[(OLD, true), (OLD, true), (NEW, true)],
        );
        assert_eq!(
            next_step(&voters_next, "0.7.4", limits),
            Step::ReplaceVoter(2)
        );

        // Mid-upgrade the spec goes back to 0.7.2: a rollback, voters first.
        let back = observed(
            "0.7.2",
            ("0.7.3", true),
            &[(OLD, true), (OLD, true), (NEW, true)],
        );
        assert_eq!(next_step(&back, "0.7.3", limits), Step::UpdateVoterTemplate);
        assert_eq!(next_step(&back, "0.7.2", limits), Step::ReplaceVoter(2));
    }

    #[test]
    fn versions_compare_by_number() {
        assert_eq!(compare_versions("0.10.0", "0.9.1"), Ordering::Greater);
        assert_eq!(compare_versions("0.7.3", "0.7.10"), Ordering::Less);
        assert_eq!(compare_versions("0.7.3", "0.7.3"), Ordering::Equal);
        assert_eq!(compare_versions("latest", "0.7.3"), Ordering::Greater);
    }
}
