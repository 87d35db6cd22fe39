//! Subscriptions: a consumer woken when streams of a bucket it follows have new data (the
//! protocol's reserved `__ds` APIs). They are replicated state like streams: every change is
//! a command here, so a wake, its generation, a lease and every acknowledged offset survive a
//! crash and a leader change. Only delivery (webhook requests, lease clocks) happens outside,
//! on the group's leader, which proposes what it saw as commands.
//!
//! A subscription follows a set of streams, its links: named ones, and every stream whose name
//! matches its pattern, each with the offset its consumer acknowledged. When a linked stream
//! gets data past that offset, a wake opens (a new generation). A webhook consumer is sent
//! the wake; a pull-wake consumer finds an event in the wake stream and claims the wake. The
//! consumer acknowledges offsets under the wake's ID and generation; anything older is fenced.

pub mod glob;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Effect, Machine, Outcome, Refusal, StreamPath};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Delivery {
    Webhook {
        url: String,
    },
    /// Wake events are appended to this JSON stream of the same bucket.
    PullWake {
        wake_stream: String,
    },
}

/// What a subscription was created with, normalised: a re-create with the same spec is the
/// same subscription, with another it is a conflict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionSpec {
    pub delivery: Delivery,
    pub pattern: Option<String>,
    /// Named at create, sorted, without repeats.
    pub streams: Vec<String>,
    pub lease_ttl_ms: u64,
    pub description: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkKind {
    Explicit,
    Pattern,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub kind: LinkKind,
    /// The offset the consumer acknowledged: everything below it is consumed.
    pub acked: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wake {
    pub id: String,
    pub generation: u64,
    pub opened_ms: u64,
    /// The pull-wake worker that claimed it.
    pub holder: Option<String>,
    /// A webhook wake's or a claim's lease: without an acknowledgement by then, the leader
    /// issues the wake again under a new generation. 0: no lease runs (an unclaimed pull wake).
    pub lease_until_ms: u64,
}

impl Wake {
    /// The wake as a consumer names it.
    pub fn reference(&self) -> WakeRef {
        WakeRef {
            wake_id: self.id.clone(),
            generation: self.generation,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    pub bucket: String,
    pub id: String,
    pub spec: SubscriptionSpec,
    /// The URL its callback and key URLs start with: the public URL and the family's root
    /// (`https://streams.example.com/v1/stream`), as the proposer saw them at create.
    pub root: String,
    pub links: BTreeMap<String, Link>,
    pub generation: u64,
    pub wake: Option<Wake>,
    pub created_ms: u64,
}

/// A subscription's wake, as a consumer names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeRef {
    pub wake_id: String,
    pub generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubscriptionAction {
    Put {
        spec: SubscriptionSpec,
        root: String,
    },
    Delete,
    Link {
        streams: Vec<String>,
    },
    Unlink {
        stream: String,
    },
    /// Offsets consumed under a wake; `done` ends it.
    Ack {
        wake: WakeRef,
        acks: Vec<(String, u64)>,
        done: bool,
    },
    Claim {
        worker: String,
    },
    Release {
        wake: WakeRef,
    },
    /// The leader saw this generation's lease lapse, or took the group over while it was
    /// open: the wake is issued again under a new generation (its old holder is fenced).
    Reissue {
        generation: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionCommand {
    pub bucket: String,
    pub id: String,
    pub now_ms: u64,
    pub action: SubscriptionAction,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubscriptionOutcome {
    Put {
        created: bool,
        subscription: Arc<Subscription>,
        tails: Tails,
    },
    Changed,
    Acked {
        next_wake: bool,
    },
    Claimed {
        subscription: Arc<Subscription>,
        tails: Tails,
    },
}

/// The tail of each stream a subscription follows, as the command that answers with them
/// left it. A voter that carried the command to the leader answers with these, not with its
/// own state, which may not have applied the command yet: a claim's `tail_offset` read there
/// was older than the claim, and a worker that acknowledged it was woken again.
pub type Tails = Arc<BTreeMap<String, u64>>;

/// One link as a consumer sees it, with the stream's tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkView<'a> {
    pub path: &'a str,
    pub kind: LinkKind,
    pub acked: u64,
    /// 0 for a stream that does not exist (yet).
    pub tail: u64,
}

impl LinkView<'_> {
    pub fn has_pending(&self) -> bool {
        self.tail > self.acked
    }
}

impl Subscription {
    /// Its links, with the tails `tail_of` gives for stream names.
    pub fn views(&self, tail_of: impl Fn(&str) -> Option<u64>) -> Vec<LinkView<'_>> {
        self.links
            .iter()
            .map(|(path, link)| LinkView {
                path,
                kind: link.kind,
                acked: link.acked,
                tail: tail_of(path).unwrap_or(0),
            })
            .collect()
    }

    fn wake_stream(&self) -> Option<&str> {
        match &self.spec.delivery {
            Delivery::PullWake { wake_stream } => Some(wake_stream),
            Delivery::Webhook { .. } => None,
        }
    }

    /// Whether a stream of this name belongs to the subscription's pattern.
    fn follows(&self, name: &str) -> bool {
        self.wake_stream() != Some(name)
            && self
                .spec
                .pattern
                .as_deref()
                .is_some_and(|pattern| glob::matches(pattern, name))
    }

    fn check_wake(&self, wake: &WakeRef) -> Result<(), Refusal> {
        match &self.wake {
            Some(open) if open.id == wake.wake_id && open.generation == wake.generation => Ok(()),
            _ => Err(Refusal::WakeFenced {
                subscription: self.id.clone(),
                generation: self.generation,
            }),
        }
    }
}

type Key = (String, String);

impl Machine {
    pub fn subscriptions(&self) -> impl Iterator<Item = &Subscription> {
        self.subscriptions.values()
    }

    pub(super) fn insert_subscription(&mut self, subscription: Subscription) {
        let key = (subscription.bucket.clone(), subscription.id.clone());
        for name in subscription.links.keys() {
            let path = StreamPath::new(key.0.clone(), name.clone());
            self.followers.entry(path).or_default().insert(key.clone());
        }
        self.subscriptions.insert(key, subscription);
    }

    /// Removes a subscription and its place in `followers`.
    fn remove_subscription(&mut self, key: &Key) {
        let Some(sub) = self.subscriptions.remove(key) else {
            return;
        };
        for name in sub.links.keys() {
            self.unfollow(key, name);
        }
        self.emit(Effect::DeleteSubscription {
            bucket: key.0.clone(),
            id: key.1.clone(),
        });
    }

    fn follow(&mut self, key: &Key, name: &str) {
        let path = StreamPath::new(key.0.clone(), name);
        self.followers.entry(path).or_default().insert(key.clone());
    }

    fn unfollow(&mut self, key: &Key, name: &str) {
        let path = StreamPath::new(key.0.clone(), name);
        if let Some(keys) = self.followers.get_mut(&path) {
            keys.remove(key);
            if keys.is_empty() {
                self.followers.remove(&path);
            }
        }
    }

    pub(super) fn subscription_command(
        &mut self,
        cmd: SubscriptionCommand,
    ) -> Result<Outcome, Refusal> {
        self.check_not_fenced(&cmd.bucket)?;
        let key = (cmd.bucket, cmd.id);
        let now_ms = cmd.now_ms;
        let outcome = match cmd.action {
            SubscriptionAction::Put { spec, root } => {
                return self.put_subscription(key, spec, root, now_ms);
            }
            SubscriptionAction::Delete => {
                self.subscription(&key)?;
                self.remove_subscription(&key);
                SubscriptionOutcome::Changed
            }
            SubscriptionAction::Link { streams } => {
                self.subscription(&key)?;
                for name in streams {
                    let at = self.tail_of(&key.0, &name).unwrap_or(0);
                    if self.subscription(&key)?.wake_stream() == Some(name.as_str()) {
                        return Err(Refusal::InvalidSubscription(format!(
                            "{name} is the subscription's wake stream"
                        )));
                    }
                    self.follow(&key, &name);
                    let sub = self.subscription_mut(&key)?;
                    let link = sub.links.entry(name).or_insert(Link {
                        kind: LinkKind::Explicit,
                        acked: at,
                    });
                    link.kind = LinkKind::Explicit;
                }
                self.changed(&key);
                SubscriptionOutcome::Changed
            }
            SubscriptionAction::Unlink { stream } => {
                let sub = self.subscription_mut(&key)?;
                sub.links.remove(&stream);
                self.unfollow(&key, &stream);
                self.changed(&key);
                SubscriptionOutcome::Changed
            }
            SubscriptionAction::Ack { wake, acks, done } => {
                self.subscription(&key)?.check_wake(&wake)?;
                for (name, offset) in &acks {
                    let tail = self.tail_of(&key.0, name).unwrap_or(0);
                    let sub = self.subscription(&key)?;
                    if !sub.links.contains_key(name) {
                        return Err(Refusal::InvalidAck(format!(
                            "stream {name} is not one the subscription follows"
                        )));
                    }
                    if *offset > tail {
                        return Err(Refusal::InvalidAck(format!(
                            "offset {offset} of stream {name} is beyond its tail {tail}"
                        )));
                    }
                }
                let ttl = self.subscription(&key)?.spec.lease_ttl_ms;
                let sub = self.subscription_mut(&key)?;
                for (name, offset) in acks {
                    if let Some(link) = sub.links.get_mut(&name) {
                        link.acked = link.acked.max(offset);
                    }
                }
                let mut next_wake = false;
                if done {
                    sub.wake = None;
                    next_wake = self.wake_if_pending(&key, now_ms);
                } else if let Some(open) = &mut sub.wake {
                    open.lease_until_ms = now_ms.saturating_add(ttl);
                }
                self.changed(&key);
                SubscriptionOutcome::Acked { next_wake }
            }
            SubscriptionAction::Claim { worker } => self.claim(&key, worker, now_ms)?,
            SubscriptionAction::Release { wake } => {
                self.subscription(&key)?.check_wake(&wake)?;
                self.subscription_mut(&key)?.wake = None;
                self.wake_if_pending(&key, now_ms);
                self.changed(&key);
                SubscriptionOutcome::Changed
            }
            SubscriptionAction::Reissue { generation } => {
                let sub = self.subscription_mut(&key)?;
                if sub
                    .wake
                    .as_ref()
                    .is_some_and(|w| w.generation == generation)
                {
                    sub.wake = None;
                    self.wake_if_pending(&key, now_ms);
                    self.changed(&key);
                }
                SubscriptionOutcome::Changed
            }
        };
        Ok(Outcome::Subscription(outcome))
    }

    fn put_subscription(
        &mut self,
        key: Key,
        spec: SubscriptionSpec,
        root: String,
        now_ms: u64,
    ) -> Result<Outcome, Refusal> {
        if let Some(existing) = self.subscriptions.get(&key) {
            if existing.spec != spec {
                return Err(Refusal::SubscriptionConflict(key.1));
            }
            return Ok(Outcome::Subscription(SubscriptionOutcome::Put {
                created: false,
                subscription: Arc::new(existing.clone()),
                tails: self.tails(&key),
            }));
        }
        if let Delivery::PullWake { wake_stream } = &spec.delivery {
            let path = StreamPath::new(key.0.clone(), wake_stream.clone());
            let is_json = self
                .by_path
                .get(&path)
                .and_then(|id| self.streams.get(id))
                .is_some_and(|s| !s.meta.soft_deleted && s.meta.is_json());
            if !is_json || spec.streams.contains(wake_stream) {
                return Err(Refusal::InvalidSubscription(format!(
                    "the wake stream {wake_stream} must be an existing application/json stream \
                     of the bucket, and not one the subscription follows"
                )));
            }
        }
        let mut sub = Subscription {
            bucket: key.0.clone(),
            id: key.1.clone(),
            spec,
            root,
            links: BTreeMap::new(),
            generation: 0,
            wake: None,
            created_ms: now_ms,
        };
        // Streams that exist are followed from their tail: only what comes next wakes.
        for state in self.streams.values() {
            let meta = &state.meta;
            if meta.path.bucket == key.0 && !meta.soft_deleted && sub.follows(&meta.path.name) {
                sub.links.insert(
                    meta.path.name.clone(),
                    Link {
                        kind: LinkKind::Pattern,
                        acked: meta.tail,
                    },
                );
            }
        }
        for name in sub.spec.streams.clone() {
            let acked = self.tail_of(&key.0, &name).unwrap_or(0);
            sub.links.insert(
                name,
                Link {
                    kind: LinkKind::Explicit,
                    acked,
                },
            );
        }
        self.insert_subscription(sub);
        self.changed(&key);
        Ok(Outcome::Subscription(SubscriptionOutcome::Put {
            created: true,
            subscription: Arc::new(self.subscriptions[&key].clone()),
            tails: self.tails(&key),
        }))
    }

    fn claim(
        &mut self,
        key: &Key,
        worker: String,
        now_ms: u64,
    ) -> Result<SubscriptionOutcome, Refusal> {
        let sub = self.subscription(key)?;
        if !matches!(sub.spec.delivery, Delivery::PullWake { .. }) {
            return Err(Refusal::InvalidSubscription(format!(
                "subscription {} is delivered by webhook; only pull-wake subscriptions are claimed",
                key.1
            )));
        }
        let ttl = sub.spec.lease_ttl_ms;
        let held = sub
            .wake
            .as_ref()
            .and_then(|w| w.holder.clone().map(|h| (h, w.lease_until_ms)));
        match held {
            Some((holder, until)) if until > now_ms && holder != worker => {
                return Err(Refusal::AlreadyClaimed { holder });
            }
            // A lapsed claim: its holder is fenced by a new generation.
            Some((_, until)) if until <= now_ms => self.subscription_mut(key)?.wake = None,
            // Unclaimed, or claimed again by its holder: the same wake, its lease renewed.
            _ => {}
        }
        if self.subscription(key)?.wake.is_none() {
            self.open_wake(key, now_ms, false);
        }
        let sub = self.subscription_mut(key)?;
        if let Some(wake) = &mut sub.wake {
            wake.holder = Some(worker);
            wake.lease_until_ms = now_ms.saturating_add(ttl);
        }
        self.changed(key);
        Ok(SubscriptionOutcome::Claimed {
            subscription: Arc::new(self.subscription(key)?.clone()),
            tails: self.tails(key),
        })
    }

    /// The tails of the streams subscription `key` follows (0 for one that does not exist).
    fn tails(&self, key: &Key) -> Tails {
        let names = self
            .subscriptions
            .get(key)
            .into_iter()
            .flat_map(|sub| sub.links.keys());
        Arc::new(
            names
                .map(|name| (name.clone(), self.tail_of(&key.0, name).unwrap_or(0)))
                .collect(),
        )
    }

    /// Opens a wake when a followed stream has data past its acknowledged offset. Answers
    /// whether it did.
    fn wake_if_pending(&mut self, key: &Key, now_ms: u64) -> bool {
        let Some(sub) = self.subscriptions.get(key) else {
            return false;
        };
        let pending = sub.wake.is_none()
            && sub
                .links
                .iter()
                .any(|(name, link)| self.tail_of(&key.0, name).unwrap_or(0) > link.acked);
        if pending {
            self.open_wake(key, now_ms, true);
        }
        pending
    }

    /// A new generation and its wake; a pull-wake subscription's wake stream gets its event
    /// (`announce`; a claim opens a wake for its claimant alone).
    fn open_wake(&mut self, key: &Key, now_ms: u64, announce: bool) {
        let Some(sub) = self.subscriptions.get_mut(key) else {
            return;
        };
        sub.generation += 1;
        let webhook = matches!(sub.spec.delivery, Delivery::Webhook { .. });
        sub.wake = Some(Wake {
            id: format!("{:x}-{}", sub.created_ms, sub.generation),
            generation: sub.generation,
            opened_ms: now_ms,
            holder: None,
            lease_until_ms: if webhook {
                now_ms.saturating_add(sub.spec.lease_ttl_ms)
            } else {
                0
            },
        });
        if announce && let Some(wake_stream) = sub.wake_stream() {
            let path = StreamPath::new(key.0.clone(), wake_stream);
            let event = self.wake_event(key);
            self.append_event(&path, event);
        }
    }

    /// The wake stream's event for the subscription's open wake.
    fn wake_event(&self, key: &Key) -> Vec<u8> {
        let Some(sub) = self.subscriptions.get(key) else {
            return Vec::new();
        };
        let streams: Vec<serde_json::Value> = sub
            .views(|name| self.tail_of(&key.0, name))
            .into_iter()
            .filter(|view| view.has_pending())
            .map(|view| {
                serde_json::json!({
                    "path": view.path,
                    "offset": crate::offset::format(view.acked),
                    "tail_offset": crate::offset::format(view.tail),
                })
            })
            .collect();
        let (wake_id, generation) = sub
            .wake
            .as_ref()
            .map_or((String::new(), 0), |w| (w.id.clone(), w.generation));
        serde_json::json!({
            "type": "wake",
            "subscription_id": sub.id,
            "wake_id": wake_id,
            "generation": generation,
            "streams": streams,
        })
        .to_string()
        .into_bytes()
    }

    /// A stream got data: every subscription following it without an open wake opens one.
    pub(super) fn subscriptions_see_data(&mut self, path: &StreamPath, now_ms: u64) {
        if self.subscriptions.is_empty() {
            return;
        }
        let Some(followers) = self.followers.get(path) else {
            return;
        };
        let woken: Vec<Key> = followers
            .iter()
            .filter(|key| {
                self.subscriptions
                    .get(*key)
                    .is_some_and(|sub| sub.wake.is_none())
            })
            .cloned()
            .collect();
        for key in woken {
            if self.wake_if_pending(&key, now_ms) {
                self.changed(&key);
            }
        }
    }

    /// A stream was created: subscriptions whose pattern matches follow it, and every link to
    /// its name starts at its beginning (a new incarnation is all new data).
    pub(super) fn subscriptions_see_create(&mut self, path: &StreamPath, now_ms: u64) {
        if self.subscriptions.is_empty() {
            return;
        }
        let keys: Vec<Key> = self
            .bucket_subscriptions(&path.bucket)
            .filter(|sub| sub.links.contains_key(&path.name) || sub.follows(&path.name))
            .map(|sub| (sub.bucket.clone(), sub.id.clone()))
            .collect();
        for key in keys {
            self.follow(&key, &path.name);
            if let Some(sub) = self.subscriptions.get_mut(&key) {
                sub.links
                    .entry(path.name.clone())
                    .and_modify(|link| link.acked = 0)
                    .or_insert(Link {
                        kind: LinkKind::Pattern,
                        acked: 0,
                    });
            }
            self.wake_if_pending(&key, now_ms);
            self.changed(&key);
        }
    }

    /// A stream is gone: pattern links to it go, named ones wait for a new incarnation.
    pub(super) fn subscriptions_see_removal(&mut self, path: &StreamPath) {
        if self.subscriptions.is_empty() {
            return;
        }
        let Some(followers) = self.followers.get(path) else {
            return;
        };
        let keys: Vec<Key> = followers.iter().cloned().collect();
        for key in keys {
            let Some(sub) = self.subscriptions.get_mut(&key) else {
                continue;
            };
            match sub.links.get(&path.name).map(|link| link.kind) {
                Some(LinkKind::Pattern) => {
                    sub.links.remove(&path.name);
                    self.unfollow(&key, &path.name);
                }
                Some(LinkKind::Explicit) => {
                    if let Some(link) = sub.links.get_mut(&path.name) {
                        link.acked = 0;
                    }
                }
                None => {}
            }
            self.changed(&key);
        }
    }

    /// A purged bucket takes its subscriptions with it.
    pub(super) fn purge_subscriptions(&mut self, bucket: &str) {
        let keys: Vec<Key> = self
            .bucket_subscriptions(bucket)
            .map(|sub| (sub.bucket.clone(), sub.id.clone()))
            .collect();
        for key in keys {
            self.remove_subscription(&key);
        }
    }

    fn bucket_subscriptions<'a>(&'a self, bucket: &str) -> impl Iterator<Item = &'a Subscription> {
        let from = (bucket.to_owned(), String::new());
        self.subscriptions
            .range(from..)
            .take_while(move |((b, _), _)| b == bucket)
            .map(|(_, sub)| sub)
    }

    fn subscription(&self, key: &Key) -> Result<&Subscription, Refusal> {
        self.subscriptions
            .get(key)
            .ok_or_else(|| Refusal::SubscriptionNotFound(key.1.clone()))
    }

    fn subscription_mut(&mut self, key: &Key) -> Result<&mut Subscription, Refusal> {
        self.subscriptions
            .get_mut(key)
            .ok_or_else(|| Refusal::SubscriptionNotFound(key.1.clone()))
    }

    fn changed(&mut self, key: &Key) {
        if let Some(sub) = self.subscriptions.get(key) {
            let sub = Arc::new(sub.clone());
            self.emit(Effect::PutSubscription(sub));
        }
    }

    /// The tail of the live stream `name` of `bucket`.
    fn tail_of(&self, bucket: &str, name: &str) -> Option<u64> {
        let path = StreamPath::new(bucket, name);
        let state = self.streams.get(self.by_path.get(&path)?)?;
        (!state.meta.soft_deleted).then_some(state.meta.tail)
    }
}

#[cfg(test)]
mod tests;
