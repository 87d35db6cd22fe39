//! The group leader's side of subscriptions: it sends each open webhook wake, retries with
//! backoff, and proposes what it saw: a `done` answer's acknowledgement, or a new generation
//! for a wake whose lease lapsed (a webhook consumer that went quiet, a pull-wake worker that
//! stopped) or that it found open when it took the group over (whether the old leader's
//! request arrived is unknown, and the new generation fences whoever holds the old one).
//!
//! Delivery is at least once: nothing here is replicated but what it proposes. `Planner`
//! decides, without I/O; `run` carries its decisions out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::Subscriptions;
use crate::engine::{Engine, Leadership, now_ms};
use crate::machine::subscription::{Delivery, SubscriptionAction};
use crate::machine::{Command, Subscription, SubscriptionCommand};
use crate::shutdown::until_stopping;

/// How often leases are looked at without a change to wake the deliverer.
const TICK: Duration = Duration::from_millis(100);
const FIRST_RETRY_MS: u64 = 500;
const MAX_RETRY_MS: u64 = 30_000;

type Key = (String, String);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Deliver(Arc<Subscription>),
    Reissue {
        bucket: String,
        id: String,
        generation: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    Delivered {
        key: Key,
        generation: u64,
        ok: bool,
    },
    /// A reissue that could not be proposed; the next plan asks again.
    ReissueFailed {
        key: Key,
        generation: u64,
    },
}

/// What the deliverer looks at: every subscription (when it starts to lead), the ones that
/// changed since it last looked (each with its state now; `None` once deleted), or the open
/// wakes it knows of again, for their clocks (leases, retries).
pub enum Seen<'a> {
    Everything(&'a [Arc<Subscription>]),
    Changes(&'a [(Key, Option<Arc<Subscription>>)]),
    Tick,
}

#[derive(Debug)]
struct Attempt {
    sub: Arc<Subscription>,
    generation: u64,
    in_flight: bool,
    delivered: bool,
    failures: u32,
    next_at_ms: u64,
    reissue_asked: bool,
}

/// What to do next for every open wake, from the published subscriptions alone.
#[derive(Debug, Default)]
pub struct Planner {
    led: bool,
    /// Every open wake, as last seen.
    attempts: HashMap<Key, Attempt>,
}

impl Planner {
    /// Whether it has seen everything since it began to lead (else it needs `Everything`).
    pub fn leading(&self) -> bool {
        self.led
    }

    /// `leads`: this node leads the group and has applied its log.
    pub fn plan(&mut self, leads: bool, seen: Seen<'_>, now_ms: u64) -> Vec<Action> {
        if !leads {
            self.led = false;
            self.attempts.clear();
            return Vec::new();
        }
        let takeover = !self.led;
        self.led = true;
        let look_at: Vec<Key> = match seen {
            Seen::Everything(subs) => {
                self.attempts.clear();
                subs.iter()
                    .filter_map(|sub| self.see(sub.clone()))
                    .collect()
            }
            Seen::Changes(changes) => changes
                .iter()
                .filter_map(|(key, sub)| match sub {
                    Some(sub) => self.see(sub.clone()),
                    None => {
                        self.attempts.remove(key);
                        None
                    }
                })
                .collect(),
            Seen::Tick => self.attempts.keys().cloned().collect(),
        };
        let mut actions = Vec::new();
        for key in look_at {
            let Some(attempt) = self.attempts.get_mut(&key) else {
                continue;
            };
            if attempt.reissue_asked || attempt.in_flight {
                continue;
            }
            let sub = &attempt.sub;
            let Some(wake) = &sub.wake else {
                continue;
            };
            let webhook = matches!(sub.spec.delivery, Delivery::Webhook { .. });
            let lapsed = wake.lease_until_ms != 0 && now_ms >= wake.lease_until_ms;
            if lapsed || (webhook && takeover) {
                attempt.reissue_asked = true;
                actions.push(Action::Reissue {
                    bucket: sub.bucket.clone(),
                    id: sub.id.clone(),
                    generation: wake.generation,
                });
            } else if webhook && !attempt.delivered && now_ms >= attempt.next_at_ms {
                attempt.in_flight = true;
                actions.push(Action::Deliver(sub.clone()));
            }
        }
        actions
    }

    /// Takes in a subscription's state: an open wake is kept (a new generation starts
    /// afresh); answers its key when it has one.
    fn see(&mut self, sub: Arc<Subscription>) -> Option<Key> {
        let key = (sub.bucket.clone(), sub.id.clone());
        let Some(generation) = sub.wake.as_ref().map(|w| w.generation) else {
            self.attempts.remove(&key);
            return None;
        };
        match self.attempts.get_mut(&key) {
            Some(attempt) if attempt.generation == generation => attempt.sub = sub,
            _ => {
                let attempt = Attempt {
                    sub,
                    generation,
                    in_flight: false,
                    delivered: false,
                    failures: 0,
                    next_at_ms: 0,
                    reissue_asked: false,
                };
                self.attempts.insert(key.clone(), attempt);
            }
        }
        Some(key)
    }

    pub fn report(&mut self, report: Report, now_ms: u64) {
        match report {
            Report::Delivered {
                key,
                generation,
                ok,
            } => {
                let Some(attempt) = self.attempts.get_mut(&key) else {
                    return;
                };
                if attempt.generation != generation {
                    return;
                }
                attempt.in_flight = false;
                if ok {
                    attempt.delivered = true;
                } else {
                    attempt.failures += 1;
                    let backoff = FIRST_RETRY_MS
                        .saturating_mul(1 << (attempt.failures - 1).min(16))
                        .min(MAX_RETRY_MS);
                    attempt.next_at_ms = now_ms + backoff;
                }
            }
            Report::ReissueFailed { key, generation } => {
                if let Some(attempt) = self.attempts.get_mut(&key)
                    && attempt.generation == generation
                {
                    attempt.reissue_asked = false;
                }
            }
        }
    }

    /// Failed attempts so far at the wake's current generation.
    fn failures(&self, key: &Key) -> u32 {
        self.attempts.get(key).map_or(0, |a| a.failures)
    }
}

/// Delivers the wakes of `engine`'s group while this node leads it, until the node stops.
pub async fn run(
    subscriptions: Arc<Subscriptions>,
    engine: Arc<Engine>,
    mut stopping: watch::Receiver<bool>,
) {
    let (reports, mut reported) = mpsc::unbounded_channel();
    let mut planner = Planner::default();
    let mut changes = engine.watch_subscriptions();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut ticked = false;
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = tick.tick() => ticked = true,
            Some(report) = reported.recv() => planner.report(report, now_ms()),
            () = until_stopping(&mut stopping) => return,
        }
        let leads = engine.leadership() == Leadership::Here && engine.applied_its_log();
        let changed = engine.take_changed_subscriptions();
        let mut actions = Vec::new();
        if !leads {
            actions = planner.plan(false, Seen::Tick, now_ms());
        } else if !planner.leading() {
            let everything = engine.subscriptions();
            actions = planner.plan(true, Seen::Everything(&everything), now_ms());
        } else {
            if !changed.is_empty() {
                let changes: Vec<(Key, Option<Arc<Subscription>>)> = changed
                    .into_iter()
                    .map(|key| {
                        let sub = engine.subscription(&key.0, &key.1);
                        (key, sub)
                    })
                    .collect();
                actions = planner.plan(true, Seen::Changes(&changes), now_ms());
            }
            if ticked {
                actions.extend(planner.plan(true, Seen::Tick, now_ms()));
            }
        }
        for action in actions {
            let (subscriptions, engine, reports) =
                (subscriptions.clone(), engine.clone(), reports.clone());
            match action {
                Action::Deliver(sub) => {
                    let key = (sub.bucket.clone(), sub.id.clone());
                    let retry = planner.failures(&key) > 0;
                    tokio::spawn(async move {
                        let Some(wake) = sub.wake.as_ref() else {
                            return;
                        };
                        let generation = wake.generation;
                        let ok = subscriptions.deliver(&engine, &sub, retry).await;
                        let _ = reports.send(Report::Delivered {
                            key,
                            generation,
                            ok,
                        });
                    });
                }
                Action::Reissue {
                    bucket,
                    id,
                    generation,
                } => {
                    tokio::spawn(async move {
                        let command = Command::Subscription(SubscriptionCommand {
                            bucket: bucket.clone(),
                            id: id.clone(),
                            now_ms: now_ms(),
                            action: SubscriptionAction::Reissue { generation },
                        });
                        subscriptions.metrics.reissued(&bucket, &id);
                        if let Err(error) = engine.propose(command).await {
                            tracing::debug!(%error, bucket, id, "could not issue a wake again");
                            let key = (bucket, id);
                            let _ = reports.send(Report::ReissueFailed { key, generation });
                        }
                    });
                }
            }
        }
    }
}

impl Subscriptions {
    /// Sends the subscription's open wake to its webhook; answers whether the receiver took
    /// it. A `{"done": true}` answer acknowledges every stream at the tail it was sent.
    async fn deliver(&self, engine: &Engine, sub: &Subscription, retry: bool) -> bool {
        let (Some(wake), Delivery::Webhook { url }) = (&sub.wake, &sub.spec.delivery) else {
            return false;
        };
        let wake = wake.reference();
        let views = engine.link_views(sub);
        let body = super::view::webhook(sub, &wake, &views, &self.key).to_string();
        let acks: Vec<(String, u64)> = views
            .iter()
            .map(|view| (view.path.to_owned(), view.tail))
            .collect();
        if retry {
            self.metrics.retried(&sub.bucket, &sub.id);
        }
        let sent = match self.post(url, body).await {
            Ok(done) => done,
            Err(error) => {
                tracing::info!(bucket = sub.bucket, subscription = sub.id, %error, "a webhook delivery failed");
                self.metrics.failed(&sub.bucket, &sub.id);
                return false;
            }
        };
        let opened = sub.wake.as_ref().map_or(0, |w| w.opened_ms);
        let lag = Duration::from_millis(now_ms().saturating_sub(opened));
        self.metrics.delivered(&sub.bucket, &sub.id, lag);
        if sent {
            let command = Command::Subscription(SubscriptionCommand {
                bucket: sub.bucket.clone(),
                id: sub.id.clone(),
                now_ms: now_ms(),
                action: SubscriptionAction::Ack {
                    wake,
                    acks,
                    done: true,
                },
            });
            if let Err(error) = engine.propose(command).await {
                tracing::debug!(%error, subscription = sub.id, "a webhook's done was not acknowledged");
            }
        }
        true
    }

    /// One signed request; `Ok(done)` when the receiver answered 2xx.
    async fn post(&self, url: &str, body: String) -> Result<bool, String> {
        // The URL was checked at create; its literal address is checked again, and the
        // client's resolver checks every name it resolves.
        let url = self.policy.check_url(url)?;
        let unix_secs = now_ms() / 1000;
        let signature = self.key.webhook_signature(unix_secs, body.as_bytes());
        let response = self
            .client
            .post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("the receiver answered {status}"));
        }
        let answer = response.bytes().await.map_err(|e| e.to_string())?;
        let done = answer.len() <= 64 * 1024
            && serde_json::from_slice::<serde_json::Value>(&answer)
                .is_ok_and(|value| value.get("done") == Some(&serde_json::Value::Bool(true)));
        Ok(done)
    }
}

#[cfg(test)]
mod tests;
