//! The cluster's status conditions and step clocks: pure functions of what the reconciler
//! found and what the status said before.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::crd::{UrsulaCluster, UrsulaClusterStatus};
use crate::upgrade::Step;

/// How long ago an RFC 3339 time was (zero when there is none).
pub fn since(started: Option<&str>) -> Duration {
    started
        .and_then(|t| t.parse::<Timestamp>().ok())
        .map_or(Duration::ZERO, |started| {
            Duration::try_from(Timestamp::now().duration_since(started)).unwrap_or_default()
        })
}

/// A condition's last transition is when its status last changed: one that keeps its status
/// keeps its time. (A status written again unchanged would also wake this controller for
/// nothing, several times a second.)
pub fn keep_transition_times(conditions: &mut [Condition], previous: &[Condition]) {
    for condition in conditions {
        if let Some(before) = previous
            .iter()
            .find(|p| p.type_ == condition.type_ && p.status == condition.status)
        {
            condition.last_transition_time = before.last_transition_time.clone();
        }
    }
}

pub fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time: Time(Timestamp::now()),
    }
}

/// When the current step started, for the planner's ready timeout. A spec change restarts the
/// clock; a halt keeps the clock of the step that timed out, so that the halt stays until the
/// spec changes or the voter recovers.
pub fn step_started(
    previous: &UrsulaClusterStatus,
    generation: Option<i64>,
    step: &Step,
    step_text: &str,
) -> Option<String> {
    started_at(
        previous,
        generation,
        previous.upgrade_step.as_deref(),
        previous.step_started.as_deref(),
        Some(step_text),
        matches!(step, Step::Halt(_)),
    )
}

/// When a step that is now `step` started: kept while the spec and the step stay the same (a
/// halt keeps the clock of the step that timed out), now for a new one, none without a step.
pub fn started_at(
    previous: &UrsulaClusterStatus,
    generation: Option<i64>,
    previous_step: Option<&str>,
    previous_started: Option<&str>,
    step: Option<&str>,
    halted: bool,
) -> Option<String> {
    let step = step?;
    let same =
        previous.observed_generation == generation && (previous_step == Some(step) || halted);
    match previous_started {
        Some(started) if same => Some(started.to_owned()),
        _ => Some(Timestamp::now().to_string()),
    }
}

/// Whether every voter has its certificate, and where they come from.
pub fn certificates_condition(
    cluster: &UrsulaCluster,
    waiting_for: &[String],
    generation: Option<i64>,
) -> Condition {
    let (reason, message) = match (&cluster.spec.tls, waiting_for) {
        (None, _) => (
            "OperatorCA",
            format!(
                "issued by the operator's CA (Secret {})",
                crate::mounts::ca_secret(cluster)
            ),
        ),
        (Some(tls), []) => (
            "Issued",
            format!(
                "issued by cert-manager's {} {}",
                tls.issuer_ref.kind, tls.issuer_ref.name
            ),
        ),
        (Some(_), waiting) => (
            "WaitingForCertManager",
            format!(
                "the voters wait for cert-manager to write {}",
                waiting.join(", ")
            ),
        ),
    };
    condition(
        "CertificatesReady",
        waiting_for.is_empty(),
        reason,
        message,
        generation,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_keeps_its_clock_while_the_spec_and_the_step_stay() {
        let before = UrsulaClusterStatus {
            observed_generation: Some(3),
            ..UrsulaClusterStatus::default()
        };
        let t = "2026-12-02T04:00:00Z";
        for (what, generation, previous_step, step, halted, kept) in [
            (
                "same step",
                Some(3),
                Some("promote voter 4"),
                Some("promote voter 4"),
                false,
                Some(true),
            ),
            (
                "a new step",
                Some(3),
                Some("promote voter 4"),
                Some("add voter 5 as a learner"),
                false,
                Some(false),
            ),
            (
                "halted",
                Some(3),
                Some("wait for learner 4 to catch up"),
                Some("halted"),
                true,
                Some(true),
            ),
            (
                "a new spec",
                Some(4),
                Some("promote voter 4"),
                Some("promote voter 4"),
                false,
                Some(false),
            ),
            (
                "no step",
                Some(3),
                Some("promote voter 4"),
                None,
                false,
                None,
            ),
        ] {
            let started = started_at(&before, generation, previous_step, Some(t), step, halted);
            assert_eq!(started.as_deref().map(|s| s == t), kept, "{what}");
        }
    }
}
