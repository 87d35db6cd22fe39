//! The subscription rules, driven by commands as the HTTP routes and the leader's deliverer
//! send them.

use bytes::Bytes;

use super::*;
use crate::machine::{AppendStream, Command, CreateStream, Limits, Payload};

const T0: u64 = 1_800_000_000_000;
const TTL: u64 = 1_000;

fn machine() -> Machine {
    let mut m = Machine::new(Limits::default());
    m.apply(Command::CreateBucket { bucket: "b".into() });
    m
}

fn create(m: &mut Machine, name: &str, content_type: &str, body: Option<&str>) {
    let result = m
        .apply(Command::Create(CreateStream {
            path: StreamPath::new("b", name),
            content_type: Some(content_type.into()),
            ttl_secs: None,
            expires_at: None,
            closed: false,
            initial: body.map(|b| Payload::inline(Bytes::copy_from_slice(b.as_bytes()), 1)),
            fork: None,
            now_ms: T0,
        }))
        .result;
    assert!(result.is_ok(), "{result:?}");
}

fn append(m: &mut Machine, name: &str, body: &str, now_ms: u64) {
    let result = m
        .apply(Command::Append(AppendStream {
            path: StreamPath::new("b", name),
            content_type: Some("text/plain".into()),
            payload: Some(Payload::inline(Bytes::copy_from_slice(body.as_bytes()), 1)),
            close: false,
            stream_seq: None,
            producer: None,
            now_ms,
        }))
        .result;
    assert!(result.is_ok(), "{result:?}");
}

fn act(
    m: &mut Machine,
    id: &str,
    now_ms: u64,
    action: SubscriptionAction,
) -> Result<SubscriptionOutcome, Refusal> {
    let applied = m.apply(Command::Subscription(SubscriptionCommand {
        bucket: "b".into(),
        id: id.into(),
        now_ms,
        action,
    }));
    match applied.result? {
        Outcome::Subscription(outcome) => Ok(outcome),
        other => panic!("not a subscription outcome: {other:?}"),
    }
}

fn spec(delivery: Delivery, pattern: Option<&str>, streams: &[&str]) -> SubscriptionSpec {
    SubscriptionSpec {
        delivery,
        pattern: pattern.map(str::to_owned),
        streams: streams.iter().map(|s| (*s).to_owned()).collect(),
        lease_ttl_ms: TTL,
        description: None,
    }
}

fn webhook() -> Delivery {
    Delivery::Webhook {
        url: "https://hooks.example/x".into(),
    }
}

fn put(m: &mut Machine, id: &str, spec: SubscriptionSpec) -> Result<SubscriptionOutcome, Refusal> {
    act(
        m,
        id,
        T0,
        SubscriptionAction::Put {
            spec,
            root: "http://node/v1/stream".into(),
        },
    )
}

fn sub<'a>(m: &'a Machine, id: &str) -> &'a Subscription {
    m.subscriptions()
        .find(|s| s.id == id)
        .expect("subscription")
}

fn open_wake(m: &Machine, id: &str) -> WakeRef {
    let wake = sub(m, id).wake.as_ref().expect("an open wake");
    WakeRef {
        wake_id: wake.id.clone(),
        generation: wake.generation,
    }
}

fn ack(name: &str, offset: u64) -> Vec<(String, u64)> {
    vec![(name.into(), offset)]
}

#[test]
fn a_webhook_subscription_wakes_on_new_data_and_fences_old_generations() {
    let mut m = machine();
    create(&mut m, "events/old", "text/plain", Some("before"));
    create(&mut m, "other/x", "text/plain", Some("x"));
    let created = put(&mut m, "s", spec(webhook(), Some("events/*"), &[])).unwrap();
    assert!(matches!(
        created,
        SubscriptionOutcome::Put { created: true, .. }
    ));
    // Existing streams are followed from their tail: nothing is pending, no wake.
    let s = sub(&m, "s");
    assert_eq!(s.links.len(), 1);
    assert_eq!(s.links["events/old"].acked, 6);
    assert!(s.wake.is_none());

    create(&mut m, "events/new", "text/plain", Some("hello"));
    let first = open_wake(&m, "s");
    assert_eq!(first.generation, 1);
    assert_eq!(sub(&m, "s").links["events/new"].acked, 0);
    assert_eq!(sub(&m, "s").wake.as_ref().unwrap().lease_until_ms, T0 + TTL);

    let stale = WakeRef {
        generation: 0,
        ..first.clone()
    };
    let fenced = act(
        &mut m,
        "s",
        T0,
        SubscriptionAction::Ack {
            wake: stale,
            acks: ack("events/new", 5),
            done: true,
        },
    );
    assert!(
        matches!(fenced, Err(Refusal::WakeFenced { .. })),
        "{fenced:?}"
    );

    // A heartbeat renews the lease; done at the tail ends the wake with nothing left.
    let beat = act(
        &mut m,
        "s",
        T0 + 500,
        SubscriptionAction::Ack {
            wake: first.clone(),
            acks: vec![],
            done: false,
        },
    );
    assert_eq!(beat, Ok(SubscriptionOutcome::Acked { next_wake: false }));
    assert_eq!(
        sub(&m, "s").wake.as_ref().unwrap().lease_until_ms,
        T0 + 500 + TTL
    );
    let done = act(
        &mut m,
        "s",
        T0 + 600,
        SubscriptionAction::Ack {
            wake: first.clone(),
            acks: ack("events/new", 5),
            done: true,
        },
    );
    assert_eq!(done, Ok(SubscriptionOutcome::Acked { next_wake: false }));
    assert!(sub(&m, "s").wake.is_none());
    assert_eq!(sub(&m, "s").links["events/new"].acked, 5);
    let again = act(
        &mut m,
        "s",
        T0 + 700,
        SubscriptionAction::Ack {
            wake: first,
            acks: ack("events/new", 5),
            done: true,
        },
    );
    assert!(matches!(again, Err(Refusal::WakeFenced { .. })));

    // Streams the pattern does not match wake nothing.
    append(&mut m, "other/x", "y", T0 + 800);
    assert!(sub(&m, "s").wake.is_none());
    append(&mut m, "events/old", "!", T0 + 900);
    let second = open_wake(&m, "s");
    assert_eq!(second.generation, 2);
    // Done below the tail: the next wake opens at once.
    let partial = act(
        &mut m,
        "s",
        T0 + 950,
        SubscriptionAction::Ack {
            wake: second,
            acks: ack("events/old", 6),
            done: true,
        },
    );
    assert_eq!(partial, Ok(SubscriptionOutcome::Acked { next_wake: true }));
    assert_eq!(open_wake(&m, "s").generation, 3);
}

#[test]
fn a_lapsed_or_taken_over_wake_is_issued_again_under_a_new_generation() {
    let mut m = machine();
    put(&mut m, "s", spec(webhook(), Some("**"), &[])).unwrap();
    create(&mut m, "a", "text/plain", Some("data"));
    let first = open_wake(&m, "s");
    // A reissue of another generation is a no-op (a leader acting on an old view).
    act(
        &mut m,
        "s",
        T0 + 2_000,
        SubscriptionAction::Reissue { generation: 7 },
    )
    .unwrap();
    assert_eq!(open_wake(&m, "s"), first);
    act(
        &mut m,
        "s",
        T0 + 2_000,
        SubscriptionAction::Reissue { generation: 1 },
    )
    .unwrap();
    let second = open_wake(&m, "s");
    assert_eq!(second.generation, 2);
    assert_ne!(second.wake_id, first.wake_id);
    let stale = act(
        &mut m,
        "s",
        T0 + 2_100,
        SubscriptionAction::Ack {
            wake: first,
            acks: ack("a", 4),
            done: true,
        },
    );
    assert!(matches!(stale, Err(Refusal::WakeFenced { .. })));
    // Reissued with nothing pending: the wake closes.
    act(
        &mut m,
        "s",
        T0 + 2_200,
        SubscriptionAction::Ack {
            wake: second.clone(),
            acks: ack("a", 4),
            done: false,
        },
    )
    .unwrap();
    act(
        &mut m,
        "s",
        T0 + 5_000,
        SubscriptionAction::Reissue { generation: 2 },
    )
    .unwrap();
    assert!(sub(&m, "s").wake.is_none());
}

#[test]
fn creating_again_is_idempotent_and_another_config_conflicts() {
    let mut m = machine();
    put(&mut m, "s", spec(webhook(), Some("a/*"), &[])).unwrap();
    let same = put(&mut m, "s", spec(webhook(), Some("a/*"), &[])).unwrap();
    assert!(matches!(
        same,
        SubscriptionOutcome::Put { created: false, .. }
    ));
    let other = put(&mut m, "s", spec(webhook(), Some("b/*"), &[]));
    assert_eq!(other, Err(Refusal::SubscriptionConflict("s".into())));
    act(&mut m, "s", T0, SubscriptionAction::Delete).unwrap();
    assert_eq!(
        act(&mut m, "s", T0, SubscriptionAction::Delete),
        Err(Refusal::SubscriptionNotFound("s".into()))
    );
    assert!(put(&mut m, "s", spec(webhook(), Some("b/*"), &[])).is_ok());
}

#[test]
fn pull_wake_announces_wakes_and_leases_claims() {
    let mut m = machine();
    let pull = Delivery::PullWake {
        wake_stream: "wake".into(),
    };
    // The wake stream must be an existing JSON stream.
    let missing = put(&mut m, "p", spec(pull.clone(), Some("events/*"), &[]));
    assert!(
        matches!(missing, Err(Refusal::InvalidSubscription(_))),
        "{missing:?}"
    );
    create(&mut m, "wake", "application/json", None);
    put(&mut m, "p", spec(pull, Some("**"), &[])).unwrap();
    // A pattern of `**` still never follows its own wake stream.
    assert!(!sub(&m, "p").links.contains_key("wake"));

    create(&mut m, "events/e", "text/plain", Some("abc"));
    let wake_stream = m.stream_id(&StreamPath::new("b", "wake")).unwrap();
    let event_len = m.stream(wake_stream).unwrap().meta.tail;
    assert!(event_len > 0, "the wake stream got its event");
    let wake = open_wake(&m, "p");

    let claimed = act(
        &mut m,
        "p",
        T0 + 10,
        SubscriptionAction::Claim {
            worker: "w1".into(),
        },
    )
    .unwrap();
    let SubscriptionOutcome::Claimed {
        subscription,
        tails,
    } = claimed
    else {
        panic!("{claimed:?}");
    };
    // The claim answers with each followed stream's tail as it applied, whichever voter
    // answers (its own state may lag the leader's).
    let events = m.stream_id(&StreamPath::new("b", "events/e")).unwrap();
    assert_eq!(
        tails.get("events/e").copied(),
        Some(m.stream(events).unwrap().meta.tail)
    );
    assert!(tails.get("events/e").is_some_and(|tail| *tail > 0));
    let held = subscription.wake.as_ref().unwrap();
    assert_eq!(
        (held.holder.as_deref(), held.generation),
        (Some("w1"), wake.generation)
    );
    assert_eq!(held.lease_until_ms, T0 + 10 + TTL);
    let busy = act(
        &mut m,
        "p",
        T0 + 20,
        SubscriptionAction::Claim {
            worker: "w2".into(),
        },
    );
    assert_eq!(
        busy,
        Err(Refusal::AlreadyClaimed {
            holder: "w1".into()
        })
    );

    // w1's lease lapses; w2 claims under a new generation and w1 is fenced.
    let taken = act(
        &mut m,
        "p",
        T0 + 10 + TTL,
        SubscriptionAction::Claim {
            worker: "w2".into(),
        },
    );
    assert!(matches!(taken, Ok(SubscriptionOutcome::Claimed { .. })));
    let w2 = open_wake(&m, "p");
    assert_eq!(w2.generation, wake.generation + 1);
    let late = act(
        &mut m,
        "p",
        T0 + 2_000,
        SubscriptionAction::Ack {
            wake,
            acks: ack("events/e", 3),
            done: true,
        },
    );
    assert!(matches!(late, Err(Refusal::WakeFenced { .. })));
    // The claim's own wake is not announced: only new data is.
    assert_eq!(m.stream(wake_stream).unwrap().meta.tail, event_len);

    let done = act(
        &mut m,
        "p",
        T0 + 2_100,
        SubscriptionAction::Ack {
            wake: w2.clone(),
            acks: ack("events/e", 3),
            done: true,
        },
    );
    assert_eq!(done, Ok(SubscriptionOutcome::Acked { next_wake: false }));
    append(&mut m, "events/e", "d", T0 + 3_000);
    let next = open_wake(&m, "p");
    assert!(m.stream(wake_stream).unwrap().meta.tail > event_len);
    act(
        &mut m,
        "p",
        T0 + 3_100,
        SubscriptionAction::Claim {
            worker: "w1".into(),
        },
    )
    .unwrap();
    act(
        &mut m,
        "p",
        T0 + 3_200,
        SubscriptionAction::Release { wake: next.clone() },
    )
    .unwrap();
    // Released with data still pending: a new, unclaimed wake, announced again.
    let after = sub(&m, "p").wake.as_ref().unwrap();
    assert_eq!(
        (after.holder.as_ref(), after.generation),
        (None, next.generation + 1)
    );
    let webhook_claim = {
        put(&mut m, "h", spec(webhook(), None, &[])).unwrap();
        act(
            &mut m,
            "h",
            T0,
            SubscriptionAction::Claim {
                worker: "w1".into(),
            },
        )
    };
    assert!(matches!(
        webhook_claim,
        Err(Refusal::InvalidSubscription(_))
    ));
}

#[test]
fn named_links_outlive_their_streams_and_pattern_links_do_not() {
    let mut m = machine();
    put(&mut m, "s", spec(webhook(), Some("p/*"), &["manual/a"])).unwrap();
    assert_eq!(sub(&m, "s").links["manual/a"].kind, LinkKind::Explicit);
    act(
        &mut m,
        "s",
        T0,
        SubscriptionAction::Link {
            streams: vec!["manual/b".into()],
        },
    )
    .unwrap();
    act(
        &mut m,
        "s",
        T0,
        SubscriptionAction::Unlink {
            stream: "manual/b".into(),
        },
    )
    .unwrap();
    assert!(!sub(&m, "s").links.contains_key("manual/b"));

    create(&mut m, "manual/a", "text/plain", Some("x"));
    create(&mut m, "p/1", "text/plain", Some("y"));
    let wake = open_wake(&m, "s");
    let unlinked = act(
        &mut m,
        "s",
        T0,
        SubscriptionAction::Ack {
            wake: wake.clone(),
            acks: ack("nope", 0),
            done: false,
        },
    );
    assert!(matches!(unlinked, Err(Refusal::InvalidAck(_))));
    let beyond = act(
        &mut m,
        "s",
        T0,
        SubscriptionAction::Ack {
            wake: wake.clone(),
            acks: ack("p/1", 2),
            done: false,
        },
    );
    assert!(matches!(beyond, Err(Refusal::InvalidAck(_))));
    act(
        &mut m,
        "s",
        T0,
        SubscriptionAction::Ack {
            wake,
            acks: vec![("manual/a".into(), 1), ("p/1".into(), 1)],
            done: true,
        },
    )
    .unwrap();

    for name in ["manual/a", "p/1"] {
        let deleted = m
            .apply(Command::Delete {
                path: StreamPath::new("b", name),
                now_ms: T0,
            })
            .result;
        assert!(deleted.is_ok());
    }
    let s = sub(&m, "s");
    assert_eq!(s.links.keys().collect::<Vec<_>>(), ["manual/a"]);
    assert_eq!(s.links["manual/a"].acked, 0);

    m.apply(Command::PurgeBucket { bucket: "b".into() });
    assert_eq!(m.subscriptions().count(), 0);
}
