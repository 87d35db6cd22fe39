//! The deliverer's decisions, step by step, as a leader sees wakes open, lapse and move.

use super::*;
use crate::machine::SubscriptionSpec;
use crate::machine::subscription::Wake;

const NOW: u64 = 1_800_000_000_000;

fn sub(id: &str, webhook: bool, wake: Option<(u64, u64, Option<&str>)>) -> Arc<Subscription> {
    Arc::new(Subscription {
        bucket: "b".into(),
        id: id.into(),
        spec: SubscriptionSpec {
            delivery: if webhook {
                Delivery::Webhook {
                    url: "https://hooks.example/x".into(),
                }
            } else {
                Delivery::PullWake {
                    wake_stream: "w".into(),
                }
            },
            pattern: Some("**".into()),
            streams: vec![],
            lease_ttl_ms: 1_000,
            description: None,
        },
        root: "http://node/v1/stream".into(),
        links: Default::default(),
        generation: wake.map_or(0, |w| w.0),
        wake: wake.map(|(generation, lease_until_ms, holder)| Wake {
            id: format!("x-{generation}"),
            generation,
            opened_ms: NOW,
            holder: holder.map(str::to_owned),
            lease_until_ms,
        }),
        created_ms: 1,
    })
}

fn names(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|action| match action {
            Action::Deliver(sub) => format!("deliver {} g{}", sub.id, sub.generation),
            Action::Reissue { id, generation, .. } => format!("reissue {id} g{generation}"),
        })
        .collect()
}

/// One turn of the deliverer's loop, as `run` takes it: everything when it begins to lead,
/// else what changed (here: `subs`) and then the clocks of every open wake.
fn step(planner: &mut Planner, leads: bool, subs: &[Arc<Subscription>], now: u64) -> Vec<Action> {
    if !leads {
        return planner.plan(false, Seen::Tick, now);
    }
    if !planner.leading() {
        return planner.plan(true, Seen::Everything(subs), now);
    }
    let changes: Vec<(Key, Option<Arc<Subscription>>)> = subs
        .iter()
        .map(|sub| ((sub.bucket.clone(), sub.id.clone()), Some(sub.clone())))
        .collect();
    let mut actions = planner.plan(true, Seen::Changes(&changes), now);
    actions.extend(planner.plan(true, Seen::Tick, now));
    actions
}

fn just(sub: &Arc<Subscription>) -> [Arc<Subscription>; 1] {
    [sub.clone()]
}

fn key(id: &str) -> Key {
    ("b".into(), id.into())
}

#[test]
fn a_new_leader_reissues_open_webhook_wakes_then_delivers_each_generation_once() {
    let mut planner = Planner::default();
    let open = sub("s", true, Some((1, NOW + 1_000, None)));
    let idle = sub("idle", true, None);
    assert!(step(&mut planner, false, &just(&open), NOW).is_empty());
    // Taking over: the open wake goes out again under a new generation, once.
    let first = step(&mut planner, true, &[open.clone(), idle.clone()], NOW);
    assert_eq!(names(&first), ["reissue s g1"]);
    assert!(step(&mut planner, true, &just(&open), NOW + 10).is_empty());
    let reissued = sub("s", true, Some((2, NOW + 1_100, None)));
    assert_eq!(
        names(&step(&mut planner, true, &just(&reissued), NOW + 100)),
        ["deliver s g2"]
    );
    // In flight, then taken: nothing more until the lease lapses.
    assert!(step(&mut planner, true, &just(&reissued), NOW + 150).is_empty());
    planner.report(
        Report::Delivered {
            key: key("s"),
            generation: 2,
            ok: true,
        },
        NOW + 200,
    );
    assert!(step(&mut planner, true, &just(&reissued), NOW + 500).is_empty());
    assert_eq!(
        names(&step(&mut planner, true, &[reissued], NOW + 1_100)),
        ["reissue s g2"]
    );
}

#[test]
fn failures_back_off_and_a_late_report_of_an_old_generation_is_ignored() {
    let mut planner = Planner::default();
    let open = sub("s", true, Some((3, NOW + 60_000, None)));
    step(&mut planner, true, &[], NOW);
    assert_eq!(
        names(&step(&mut planner, true, &just(&open), NOW)),
        ["deliver s g3"]
    );
    planner.report(
        Report::Delivered {
            key: key("s"),
            generation: 3,
            ok: false,
        },
        NOW,
    );
    assert!(step(&mut planner, true, &just(&open), NOW + 499).is_empty());
    assert_eq!(
        names(&step(&mut planner, true, &just(&open), NOW + 500)),
        ["deliver s g3"]
    );
    assert_eq!(planner.failures(&key("s")), 1);
    planner.report(
        Report::Delivered {
            key: key("s"),
            generation: 3,
            ok: false,
        },
        NOW + 500,
    );
    // The second failure waits twice as long.
    assert!(step(&mut planner, true, &just(&open), NOW + 1_499).is_empty());
    assert_eq!(
        names(&step(&mut planner, true, &just(&open), NOW + 1_500)),
        ["deliver s g3"]
    );
    planner.report(
        Report::Delivered {
            key: key("s"),
            generation: 2,
            ok: true,
        },
        NOW + 1_600,
    );
    assert!(
        step(&mut planner, true, &[open], NOW + 1_700).is_empty(),
        "still in flight"
    );
}

#[test]
fn pull_wakes_are_only_reissued_when_a_claim_lapses_and_leadership_loss_forgets_everything() {
    let mut planner = Planner::default();
    step(&mut planner, true, &[], NOW);
    let unclaimed = sub("p", false, Some((1, 0, None)));
    assert!(step(&mut planner, true, &[unclaimed], NOW + 5_000).is_empty());
    let claimed = sub("p", false, Some((1, NOW + 1_000, Some("w1"))));
    assert!(step(&mut planner, true, &just(&claimed), NOW + 999).is_empty());
    assert_eq!(
        names(&step(&mut planner, true, &just(&claimed), NOW + 1_000)),
        ["reissue p g1"]
    );
    planner.report(
        Report::ReissueFailed {
            key: key("p"),
            generation: 1,
        },
        NOW + 1_001,
    );
    assert_eq!(
        names(&step(&mut planner, true, &just(&claimed), NOW + 1_100)),
        ["reissue p g1"]
    );
    // Losing the group, then leading it again: a takeover once more.
    assert!(step(&mut planner, false, &[claimed], NOW + 1_200).is_empty());
    let webhook = sub("s", true, Some((4, NOW + 9_000, None)));
    assert_eq!(
        names(&step(&mut planner, true, &[webhook], NOW + 1_300)),
        ["reissue s g4"]
    );
}
