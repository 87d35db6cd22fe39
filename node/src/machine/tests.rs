//! Unit and property tests of the state machine, driven only by commands.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use proptest::prelude::*;

use super::*;

const T0: u64 = 1_800_000_000_000;

fn path(name: &str) -> StreamPath {
    StreamPath::new("demo", name)
}

fn payload(text: &str) -> Payload {
    Payload::inline(Bytes::copy_from_slice(text.as_bytes()), 1)
}

fn create(name: &str) -> CreateStream {
    CreateStream {
        path: path(name),
        content_type: Some("text/plain".into()),
        ttl_secs: None,
        expires_at: None,
        closed: false,
        initial: None,
        fork: None,
        now_ms: T0,
    }
}

fn append(name: &str, text: &str) -> AppendStream {
    AppendStream {
        path: path(name),
        content_type: Some("text/plain".into()),
        payload: Some(payload(text)),
        close: false,
        stream_seq: None,
        producer: None,
        now_ms: T0,
    }
}

fn machine() -> Machine {
    let mut machine = Machine::new(Limits {
        max_producers_per_stream: 2,
        producer_idle_ms: 60_000,
    });
    let applied = machine.apply(Command::CreateBucket {
        bucket: "demo".into(),
    });
    assert!(applied.result.is_ok());
    machine
}

fn ok(machine: &mut Machine, command: Command) -> Outcome {
    let applied = machine.apply(command);
    applied.result.expect("command should apply")
}

fn refused(machine: &mut Machine, command: Command) -> Refusal {
    let before = machine.clone();
    let applied = machine.apply(command);
    assert!(
        applied.effects.is_empty(),
        "a refusal wrote {:?}",
        applied.effects
    );
    assert_eq!(*machine, before, "a refusal changed the state");
    applied.result.expect_err("command should be refused")
}

fn tail(machine: &Machine, name: &str) -> u64 {
    let id = machine.stream_id(&path(name)).unwrap();
    machine.stream(id).unwrap().meta.tail
}

#[test]
fn buckets_are_implicit_and_a_fenced_one_refuses_creates() {
    let mut m = machine();
    let mut c = create("x");
    c.path = StreamPath::new("implicit", "x");
    assert!(matches!(
        ok(&mut m, Command::Create(c.clone())),
        Outcome::StreamCreated { created: true, .. }
    ));
    let state = |m: &Machine, name: &str| {
        m.buckets()
            .find(|(bucket, _)| bucket.as_str() == name)
            .map(|(_, state)| state.clone())
    };
    assert_eq!(state(&m, "implicit"), Some(BucketState::Active));
    // The bucket now exists: an explicit create finds it.
    assert!(matches!(
        ok(
            &mut m,
            Command::CreateBucket {
                bucket: "implicit".into()
            }
        ),
        Outcome::BucketCreated { created: false }
    ));
    // A refused create brings no bucket into being.
    let mut fork = create("f");
    fork.path = StreamPath::new("never", "f");
    fork.fork = Some(ForkSpec {
        source: StreamPath::new("never", "missing"),
        offset: None,
        sub_offset: 0,
        partial: None,
    });
    assert!(matches!(
        refused(&mut m, Command::Create(fork)),
        Refusal::ForkSourceNotFound(_)
    ));
    assert_eq!(state(&m, "never"), None);
}

#[test]
fn create_is_idempotent_and_conflicts_on_config() {
    let mut m = machine();
    let created = ok(&mut m, Command::Create(create("s")));
    assert!(matches!(
        created,
        Outcome::StreamCreated { created: true, .. }
    ));
    let again = ok(&mut m, Command::Create(create("s")));
    assert!(matches!(
        again,
        Outcome::StreamCreated { created: false, .. }
    ));
    let mut other = create("s");
    other.content_type = Some("TEXT/PLAIN; charset=utf-8".into());
    assert!(matches!(
        ok(&mut m, Command::Create(other)),
        Outcome::StreamCreated { created: false, .. }
    ));
    for change in [
        |c: &mut CreateStream| c.content_type = Some("application/json".into()),
        |c: &mut CreateStream| c.ttl_secs = Some(5),
        |c: &mut CreateStream| c.closed = true,
    ] {
        let mut different = create("s");
        change(&mut different);
        assert!(matches!(
            refused(&mut m, Command::Create(different)),
            Refusal::StreamConflict { .. }
        ));
    }
}

#[test]
fn appends_advance_the_tail_and_close_is_final() {
    let mut m = machine();
    ok(&mut m, Command::Create(create("s")));
    ok(&mut m, Command::Append(append("s", "hello")));
    assert_eq!(tail(&m, "s"), 5);
    let mut close = append("s", "!");
    close.close = true;
    let Outcome::Appended(closed) = ok(&mut m, Command::Append(close)) else {
        panic!()
    };
    assert!(closed.closed);
    assert_eq!(closed.next_offset, 6);
    assert_eq!(
        refused(&mut m, Command::Append(append("s", "more"))),
        Refusal::StreamClosed { next_offset: 6 }
    );
    let mut close_only = append("s", "");
    close_only.payload = None;
    close_only.close = true;
    close_only.content_type = Some("image/png".into());
    assert!(matches!(
        ok(&mut m, Command::Append(close_only)),
        Outcome::Appended(AppendOutcome {
            closed: true,
            next_offset: 6,
            ..
        })
    ));
}

#[test]
fn precedence_closed_then_content_type_then_stream_seq() {
    let mut m = machine();
    ok(&mut m, Command::Create(create("s")));
    let mut first = append("s", "a");
    first.stream_seq = Some("5".into());
    ok(&mut m, Command::Append(first));
    let mut wrong_type_and_seq = append("s", "b");
    wrong_type_and_seq.content_type = Some("application/json".into());
    wrong_type_and_seq.stream_seq = Some("1".into());
    assert!(matches!(
        refused(&mut m, Command::Append(wrong_type_and_seq)),
        Refusal::ContentTypeMismatch { .. }
    ));
    let mut seq = append("s", "b");
    seq.stream_seq = Some("10".into());
    // Byte-wise: "10" sorts before "5".
    assert!(matches!(
        refused(&mut m, Command::Append(seq)),
        Refusal::StreamSeqConflict { .. }
    ));
}

#[test]
fn producers_are_exactly_once_and_capped() {
    let mut m = machine();
    ok(&mut m, Command::Create(create("s")));
    let produce = |id: &str, epoch, seq, text: &str, now_ms| {
        let mut a = append("s", text);
        a.producer = Some(ProducerClaim {
            id: id.into(),
            epoch,
            seq,
        });
        a.now_ms = now_ms;
        Command::Append(a)
    };
    ok(&mut m, produce("a", 0, 0, "x", T0));
    let Outcome::Appended(dup) = ok(&mut m, produce("a", 0, 0, "x", T0)) else {
        panic!()
    };
    assert!(dup.duplicate);
    assert_eq!(tail(&m, "s"), 1);
    ok(&mut m, produce("b", 0, 0, "y", T0));
    // Two producers is the cap here, and neither is idle yet.
    assert_eq!(
        refused(&mut m, produce("c", 0, 0, "z", T0 + 1)),
        Refusal::TooManyProducers { limit: 2 }
    );
    // Once "a" is idle long enough, a new producer takes its place.
    ok(&mut m, produce("b", 0, 1, "y", T0 + 61_000));
    ok(&mut m, produce("c", 0, 0, "z", T0 + 61_000));
    let id = m.stream_id(&path("s")).unwrap();
    let producers: Vec<_> = m.stream(id).unwrap().producers.keys().cloned().collect();
    assert_eq!(producers.len(), 2);
    assert!(!producers.contains(&"a".to_owned()));
}

#[test]
fn deleting_a_forked_stream_soft_deletes_until_the_last_fork_goes() {
    let mut m = machine();
    ok(&mut m, Command::Create(create("src")));
    ok(&mut m, Command::Append(append("src", "abc")));
    let mut fork = create("fork");
    fork.fork = Some(ForkSpec {
        source: path("src"),
        offset: None,
        sub_offset: 0,
        partial: None,
    });
    ok(&mut m, Command::Create(fork));
    assert_eq!(tail(&m, "fork"), 3);
    ok(
        &mut m,
        Command::Delete {
            path: path("src"),
            now_ms: T0,
        },
    );
    assert_eq!(
        refused(&mut m, Command::Append(append("src", "x"))),
        Refusal::StreamDeleted("demo/src".into())
    );
    assert!(matches!(
        refused(&mut m, Command::Create(create("src"))),
        Refusal::StreamConflict { .. }
    ));
    ok(
        &mut m,
        Command::Delete {
            path: path("fork"),
            now_ms: T0,
        },
    );
    assert_eq!(
        m.stream_id(&path("src")),
        None,
        "the source went with its last fork"
    );
    ok(&mut m, Command::Create(create("src")));
}

#[test]
fn ttl_expires_on_access_and_reads_extend_it() {
    let mut m = machine();
    let mut c = create("t");
    c.ttl_secs = Some(10);
    ok(&mut m, Command::Create(c));
    let id = m.stream_id(&path("t")).unwrap();
    ok(
        &mut m,
        Command::Touch {
            touches: vec![(id, T0 + 9_000)],
        },
    );
    let mut late = append("t", "x");
    late.now_ms = T0 + 18_000;
    ok(&mut m, Command::Append(late));
    let mut too_late = append("t", "x");
    too_late.now_ms = T0 + 28_001;
    assert!(matches!(
        m.apply(Command::Append(too_late)).result,
        Err(Refusal::StreamNotFound(_))
    ));
}

#[test]
fn purge_deletes_and_fences() {
    let mut m = machine();
    ok(&mut m, Command::Create(create("a")));
    ok(&mut m, Command::Create(create("b")));
    assert_eq!(
        ok(
            &mut m,
            Command::PurgeBucket {
                bucket: "demo".into()
            }
        ),
        Outcome::BucketPurged { streams: 2 }
    );
    assert_eq!(
        ok(
            &mut m,
            Command::PurgeBucket {
                bucket: "demo".into()
            }
        ),
        Outcome::BucketPurged { streams: 0 }
    );
    assert_eq!(
        refused(&mut m, Command::Create(create("a"))),
        Refusal::BucketFenced("demo".into())
    );
    assert_eq!(
        refused(
            &mut m,
            Command::CreateBucket {
                bucket: "demo".into()
            }
        ),
        Refusal::BucketFenced("demo".into())
    );
}

#[test]
fn snapshots_and_retention_are_idempotent() {
    let mut m = machine();
    ok(&mut m, Command::Create(create("s")));
    ok(&mut m, Command::Append(append("s", "0123456789")));
    let snapshot = |digest: u8| {
        Command::PublishSnapshot(PublishSnapshot {
            path: path("s"),
            offset: 4,
            content_type: "application/json".into(),
            body: Bytes::from_static(b"{}"),
            digest: [digest; 32],
            now_ms: T0,
        })
    };
    assert_eq!(
        ok(&mut m, snapshot(1)),
        Outcome::SnapshotPublished { created: true }
    );
    assert_eq!(
        ok(&mut m, snapshot(1)),
        Outcome::SnapshotPublished { created: false }
    );
    assert_eq!(
        refused(&mut m, snapshot(2)),
        Refusal::SnapshotConflict { offset: 4 }
    );
    let retain = |offset| Command::AdvanceRetention {
        path: path("s"),
        offset,
        now_ms: T0,
    };
    assert_eq!(
        ok(&mut m, retain(4)),
        Outcome::RetentionAdvanced { retained_from: 4 }
    );
    assert_eq!(
        ok(&mut m, retain(4)),
        Outcome::RetentionAdvanced { retained_from: 4 }
    );
    assert_eq!(
        ok(&mut m, retain(2)),
        Outcome::RetentionAdvanced { retained_from: 4 }
    );
    assert!(matches!(
        refused(&mut m, retain(11)),
        Refusal::OffsetBeyondTail { .. }
    ));
}

#[test]
fn a_cold_flush_applies_only_from_the_first_local_offset() {
    let mut m = machine();
    ok(&mut m, Command::Create(create("s")));
    for text in ["abc", "def", "gh"] {
        ok(&mut m, Command::Append(append("s", text)));
    }
    let id = m.stream_id(&path("s")).unwrap();
    let flush = |first, until| {
        Command::ColdFlush(ColdFlush {
            stream_id: id,
            first,
            until,
            key: format!("g0/s{id}/{first}-{until}"),
        })
    };
    let accepted = |m: &mut Machine, first, until| {
        let applied = m.apply(flush(first, until));
        match applied.result {
            Ok(Outcome::ColdFlushed { accepted }) => (accepted, applied.effects),
            other => panic!("{other:?}"),
        }
    };
    // Local records start at 0: a flush from past that would leave a hole.
    assert_eq!(accepted(&mut m, 3, 6), (false, vec![]));
    let (yes, effects) = accepted(&mut m, 0, 6);
    assert!(yes);
    assert_eq!(
        effects,
        vec![
            Effect::PutColdSegment {
                stream_id: id,
                from: 0,
                until: 6,
                first: 0,
                key: format!("g0/s{id}/0-6").into(),
            },
            Effect::DropLocalBelow {
                stream_id: id,
                offset: 6,
            },
        ]
    );
    assert_eq!(m.stream(id).unwrap().cold, [(0, 6)].into());
    // The same flush again (a leader retrying after a lost answer) changes nothing.
    assert_eq!(accepted(&mut m, 0, 6), (false, vec![]));
    // Past the tail: refused. An object read before the last flush applied, overlapping the
    // cold part and ending past it, is taken from where local records start: segments never
    // overlap.
    assert_eq!(accepted(&mut m, 6, 9), (false, vec![]));
    let (yes, effects) = accepted(&mut m, 3, 8);
    assert!(yes);
    assert!(matches!(
        effects[0],
        Effect::PutColdSegment {
            from: 6,
            until: 8,
            first: 3,
            ..
        }
    ));
    // Behind retention, nothing is local any more.
    let mut m2 = machine();
    ok(&mut m2, Command::Create(create("r")));
    ok(&mut m2, Command::Append(append("r", "abcdef")));
    let id2 = m2.stream_id(&path("r")).unwrap();
    ok(
        &mut m2,
        Command::AdvanceRetention {
            path: path("r"),
            offset: 6,
            now_ms: T0,
        },
    );
    let applied = m2.apply(Command::ColdFlush(ColdFlush {
        stream_id: id2,
        first: 0,
        until: 6,
        key: "k".into(),
    }));
    assert_eq!(applied.result, Ok(Outcome::ColdFlushed { accepted: false }));
}

// ---- Property tests -------------------------------------------------------------------------

/// What storage would hold after writing every effect: the machine must be rebuildable from it
/// alone, or a restart (or the WAL's skipping of effect-free batches) would lose state.
#[derive(Default)]
struct StoreModel {
    next_id: u64,
    buckets: BTreeMap<String, BucketState>,
    streams: HashMap<u64, StreamMeta>,
    producers: HashMap<(u64, String), ProducerState>,
    records: BTreeMap<(u64, u64), Bytes>,
    /// Cold segments: (stream, from) to until.
    cold: BTreeMap<(u64, u64), u64>,
    subscriptions: BTreeMap<(String, String), Subscription>,
}

impl StoreModel {
    fn write(&mut self, effects: &[Effect]) {
        for effect in effects {
            match effect.clone() {
                Effect::PutBucket { bucket, state } => {
                    self.buckets.insert(bucket, state);
                }
                Effect::SetNextStreamId(id) => self.next_id = id,
                Effect::PutStream(meta) => {
                    self.streams.insert(meta.id, (*meta).clone());
                }
                Effect::DeleteStream { id, .. } => {
                    self.streams.remove(&id);
                    self.producers.retain(|(s, _), _| *s != id);
                    self.records.retain(|(s, _), _| *s != id);
                    self.cold.retain(|(s, _), _| *s != id);
                }
                Effect::PutRecord {
                    stream_id,
                    offset,
                    bytes,
                } => {
                    self.records.insert((stream_id, offset), bytes);
                }
                Effect::DeleteRecordsBelow { stream_id, offset } => {
                    self.records.retain(|(s, start), bytes| {
                        *s != stream_id || start + bytes.len() as u64 > offset
                    });
                    self.cold
                        .retain(|(s, _), until| *s != stream_id || *until > offset);
                }
                Effect::PutColdSegment {
                    stream_id,
                    from,
                    until,
                    ..
                } => {
                    self.cold.insert((stream_id, from), until);
                }
                Effect::DropLocalBelow { stream_id, offset } => {
                    self.records.retain(|(s, start), bytes| {
                        *s != stream_id || start + bytes.len() as u64 > offset
                    });
                }
                Effect::PutProducer {
                    stream_id,
                    producer_id,
                    state,
                } => {
                    self.producers.insert((stream_id, producer_id), state);
                }
                Effect::DeleteProducer {
                    stream_id,
                    producer_id,
                } => {
                    self.producers.remove(&(stream_id, producer_id));
                }
                Effect::PutSnapshot { .. } | Effect::DeleteSnapshot { .. } => {}
                Effect::PutSubscription(sub) => {
                    let key = (sub.bucket.clone(), sub.id.clone());
                    self.subscriptions.insert(key, (*sub).clone());
                }
                Effect::DeleteSubscription { bucket, id } => {
                    self.subscriptions.remove(&(bucket, id));
                }
            }
        }
    }

    fn restore(&self, limits: Limits) -> Machine {
        let mut streams: HashMap<u64, StreamState> = self
            .streams
            .values()
            .map(|meta| {
                (
                    meta.id,
                    StreamState {
                        meta: meta.clone(),
                        producers: HashMap::new(),
                        cold: self
                            .cold
                            .range((meta.id, 0)..=(meta.id, u64::MAX))
                            .map(|((_, from), until)| (*from, *until))
                            .collect(),
                    },
                )
            })
            .collect();
        for ((id, producer), state) in &self.producers {
            if let Some(stream) = streams.get_mut(id) {
                stream.producers.insert(producer.clone(), *state);
            }
        }
        Machine::restore(
            limits,
            self.next_id,
            self.buckets.clone(),
            streams.into_values(),
            self.subscriptions.values().cloned(),
        )
    }
}

fn arb_command() -> impl Strategy<Value = Command> {
    let name = prop::sample::select(vec!["a", "b", "c"]);
    let text = prop::sample::select(vec!["x", "yz", "hello"]);
    let content_type = prop::sample::select(vec!["text/plain", "application/json"]);
    let producer = prop::option::of((prop::sample::select(vec!["p", "q", "r"]), 0u64..3, 0u64..4));
    let at = 0u64..40_000;
    prop_oneof![
        (
            name.clone(),
            content_type.clone(),
            prop::option::of(1u64..20),
            any::<bool>(),
            prop::option::of(name.clone()),
            at.clone()
        )
            .prop_map(
                |(n, ct, ttl, closed, fork, dt)| Command::Create(CreateStream {
                    path: path(n),
                    content_type: Some(ct.into()),
                    ttl_secs: ttl,
                    expires_at: None,
                    closed,
                    initial: None,
                    fork: fork.filter(|f| *f != n).map(|f| ForkSpec {
                        source: path(f),
                        offset: None,
                        sub_offset: 0,
                        partial: None,
                    }),
                    now_ms: T0 + dt,
                })
            ),
        (
            name.clone(),
            content_type,
            prop::option::of(text),
            any::<bool>(),
            producer,
            at.clone()
        )
            .prop_map(
                |(n, ct, body, close, producer, dt)| Command::Append(AppendStream {
                    path: path(n),
                    content_type: Some(ct.into()),
                    payload: body.map(payload),
                    close: close || body.is_none(),
                    stream_seq: None,
                    producer: producer.map(|(id, epoch, seq)| ProducerClaim {
                        id: id.into(),
                        epoch,
                        seq
                    }),
                    now_ms: T0 + dt,
                })
            ),
        (name.clone(), at.clone()).prop_map(|(n, dt)| Command::Delete {
            path: path(n),
            now_ms: T0 + dt
        }),
        (1u64..8, at.clone()).prop_map(|(id, dt)| Command::Touch {
            touches: vec![(id, T0 + dt)]
        }),
        at.clone()
            .prop_map(|dt| Command::ExpireDue { now_ms: T0 + dt }),
        (name.clone(), 0u64..12, at.clone()).prop_map(|(n, offset, dt)| {
            Command::AdvanceRetention {
                path: path(n),
                offset,
                now_ms: T0 + dt,
            }
        }),
        (name.clone(), 1u64..9, at.clone()).prop_map(|(n, len, dt)| Command::Append(
            AppendStream {
                path: path(n),
                content_type: Some("text/plain".into()),
                payload: Some(Payload {
                    bytes: Bytes::new(),
                    messages: 1,
                    staged: Some(StagedBody {
                        key: format!("staged/{n}/{len}/{dt}"),
                        len,
                    }),
                }),
                close: false,
                stream_seq: None,
                producer: None,
                now_ms: T0 + dt,
            }
        )),
        (1u64..8, 0u64..12, 1u64..14).prop_map(|(stream_id, first, len)| Command::ColdFlush(
            ColdFlush {
                stream_id,
                first,
                until: first + len,
                key: format!("g0/s{stream_id}/{first}"),
            }
        )),
        arb_subscription_command(),
    ]
}

/// Subscription changes over the same streams. Every subscription is created at `T0`, so that
/// wake IDs (`{created_ms:x}-{generation}`) can be named and some acknowledgements land.
fn arb_subscription_command() -> BoxedStrategy<Command> {
    use subscription::{Delivery, WakeRef};
    let id = prop::sample::select(vec!["s1", "s2"]);
    let name = prop::sample::select(vec!["a", "b", "c"]);
    let wake = (1u64..4).prop_map(|generation| WakeRef {
        wake_id: format!("{T0:x}-{generation}"),
        generation,
    });
    let put = (
        any::<bool>(),
        prop::option::of(prop::sample::select(vec!["a", "*", "**", "b*"])),
        prop::collection::btree_set(name.clone(), 0..2),
    )
        .prop_map(|(webhook, pattern, streams)| SubscriptionAction::Put {
            spec: SubscriptionSpec {
                delivery: if webhook {
                    Delivery::Webhook {
                        url: "https://hooks.example/x".into(),
                    }
                } else {
                    Delivery::PullWake {
                        wake_stream: "c".into(),
                    }
                },
                pattern: pattern.map(str::to_owned),
                streams: streams.into_iter().map(str::to_owned).collect(),
                lease_ttl_ms: 1_000,
                description: None,
            },
            root: "http://node/v1/stream".into(),
        });
    let action = prop_oneof![
        put,
        Just(SubscriptionAction::Delete),
        name.clone().prop_map(|n| SubscriptionAction::Link {
            streams: vec![n.into()]
        }),
        name.clone()
            .prop_map(|n| SubscriptionAction::Unlink { stream: n.into() }),
        (wake.clone(), name, 0u64..12, any::<bool>()).prop_map(|(wake, n, offset, done)| {
            SubscriptionAction::Ack {
                wake,
                acks: vec![(n.into(), offset)],
                done,
            }
        }),
        prop::sample::select(vec!["w1", "w2"])
            .prop_map(|w| SubscriptionAction::Claim { worker: w.into() }),
        wake.prop_map(|wake| SubscriptionAction::Release { wake }),
        (1u64..4).prop_map(|generation| SubscriptionAction::Reissue { generation }),
    ];
    (id, action, 0u64..40_000)
        .prop_map(|(id, action, dt)| {
            let now_ms = match action {
                SubscriptionAction::Put { .. } => T0,
                _ => T0 + dt,
            };
            Command::Subscription(SubscriptionCommand {
                bucket: "demo".into(),
                id: id.into(),
                now_ms,
                action,
            })
        })
        .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Effects describe every change: storage rebuilt from them equals the live machine, and
    /// a command without effects leaves the machine exactly as it was.
    #[test]
    fn effects_capture_every_change(commands in prop::collection::vec(arb_command(), 1..60)) {
        let limits = Limits { max_producers_per_stream: 2, producer_idle_ms: 10_000 };
        let mut m = Machine::new(limits);
        let mut store = StoreModel::default();
        store.write(&m.apply(Command::CreateBucket { bucket: "demo".into() }).effects);
        for command in commands {
            let before = m.clone();
            let applied = m.apply(command);
            if applied.effects.is_empty() {
                prop_assert_eq!(&m, &before);
            }
            store.write(&applied.effects);
            prop_assert_eq!(&store.restore(limits), &m);
        }
        // Every live stream's own records and cold segments tile its range up to the tail,
        // without gaps (a record a flush cut through stays local, overlapping its segment).
        for state in m.streams() {
            let meta = &state.meta;
            let mut pieces: Vec<(u64, u64)> = store
                .records
                .range((meta.id, 0)..=(meta.id, u64::MAX))
                .map(|((_, start), bytes)| (*start, start + bytes.len() as u64))
                .chain(
                    store
                        .cold
                        .range((meta.id, 0)..=(meta.id, u64::MAX))
                        .map(|((_, from), until)| (*from, *until)),
                )
                .collect();
            pieces.sort_unstable();
            let mut end = None;
            for (start, until) in pieces {
                if let Some(end) = end {
                    prop_assert!(start <= end, "a gap from {} to {}", end, start);
                }
                end = Some(end.map_or(until, |e: u64| e.max(until)));
            }
            if let Some(end) = end {
                prop_assert_eq!(end, meta.tail);
            }
            // Cold segments never overlap, and end where local records begin.
            let mut cold_end = None;
            for ((_, from), until) in store.cold.range((meta.id, 0)..=(meta.id, u64::MAX)) {
                if let Some(end) = cold_end {
                    prop_assert!(*from >= end, "segment from {} overlaps one ending at {}", from, end);
                }
                prop_assert!(until > from);
                cold_end = Some(*until);
            }
            prop_assert!(cold_end.unwrap_or(0) <= meta.tail);
        }
    }

    /// Batches defer their appends' metadata writes to `finish_batch`: storage rebuilt from a
    /// batch's effects equals the machine after the batch, and the answers are those of the
    /// same commands applied one by one.
    #[test]
    fn batch_effects_capture_every_change(
        commands in prop::collection::vec(arb_command(), 1..60),
        cuts in prop::collection::vec(1usize..8, 1..20),
    ) {
        let limits = Limits { max_producers_per_stream: 2, producer_idle_ms: 10_000 };
        let mut batched = Machine::new(limits);
        let mut single = Machine::new(limits);
        let mut store = StoreModel::default();
        let bucket = Command::CreateBucket { bucket: "demo".into() };
        store.write(&batched.apply(bucket.clone()).effects);
        single.apply(bucket);
        let mut commands = commands.into_iter().peekable();
        let mut cuts = cuts.into_iter().cycle();
        while commands.peek().is_some() {
            let size = cuts.next().unwrap_or(1);
            let mut effects = Vec::new();
            for command in commands.by_ref().take(size) {
                let one = single.apply(command.clone());
                let result = batched.apply_in_batch(command, &mut effects);
                prop_assert_eq!(result, one.result);
            }
            batched.finish_batch(&mut effects);
            store.write(&effects);
            prop_assert_eq!(&store.restore(limits), &batched);
            prop_assert_eq!(&batched, &single);
        }
    }

    /// Replaying the same commands gives the same machine: what the WAL relies on.
    #[test]
    fn apply_is_deterministic(commands in prop::collection::vec(arb_command(), 1..60)) {
        let mut one = machine();
        let mut two = machine();
        for command in commands {
            let a = one.apply(command.clone());
            let b = two.apply(command);
            prop_assert_eq!(a.result, b.result);
            prop_assert_eq!(a.effects, b.effects);
        }
        prop_assert_eq!(one, two);
    }

    /// A closed stream never reopens and never grows; tails never move backwards.
    #[test]
    fn closure_is_final_and_tails_are_monotonic(commands in prop::collection::vec(arb_command(), 1..60)) {
        let mut m = machine();
        let mut seen: HashMap<u64, (u64, bool)> = HashMap::new();
        for command in commands {
            m.apply(command);
            for state in m.streams() {
                let meta = &state.meta;
                if let Some((tail, closed)) = seen.get(&meta.id) {
                    prop_assert!(meta.tail >= *tail);
                    if *closed {
                        prop_assert!(meta.closed);
                        prop_assert_eq!(meta.tail, *tail);
                    }
                }
                seen.insert(meta.id, (meta.tail, meta.closed));
            }
        }
    }
}
