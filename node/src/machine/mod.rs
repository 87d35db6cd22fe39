//! The stream state machine: pure, deterministic, free of I/O.
//!
//! `Machine::apply` takes a [`Command`] and answers an [`Outcome`] or a [`Refusal`], together with
//! the [`Effect`]s storage must persist. The single node applies commands in group-commit
//! batches; a replicated node applies the same commands in Raft log order on every voter.

mod append;
pub mod cold;
pub mod command;
mod create;
pub mod effect;
mod lifecycle;
pub mod outcome;
pub mod producer;
pub mod stream;
pub mod subscription;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};

pub use command::{
    AppendStream, ColdFlush, Command, CreateStream, ForkSpec, PartialRecord, Payload,
    ProducerClaim, PublishSnapshot, StagedBody,
};
pub use effect::{BucketState, Effect};
pub use outcome::{AppendOutcome, Outcome, ProducerAck, Refusal};
pub use stream::{ExpiresAt, ForkOrigin, ProducerState, StreamMeta, StreamPath};
pub use subscription::{
    Subscription, SubscriptionAction, SubscriptionCommand, SubscriptionOutcome, SubscriptionSpec,
};

/// Limits that shape decisions; every replica must run with the same values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_producers_per_stream: u32,
    /// A producer idle at least this long may be evicted to make room for a new one.
    pub producer_idle_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_producers_per_stream: 1024,
            producer_idle_ms: 7 * 24 * 3600 * 1000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamState {
    pub meta: StreamMeta,
    pub producers: HashMap<String, ProducerState>,
    /// Its cold segments: first offset to end offset.
    pub cold: BTreeMap<u64, u64>,
}

/// The answer to one command and the storage writes it needs.
#[derive(Debug)]
pub struct Applied {
    pub result: Result<Outcome, Refusal>,
    pub effects: Vec<Effect>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    limits: Limits,
    next_stream_id: u64,
    buckets: BTreeMap<String, BucketState>,
    streams: HashMap<u64, StreamState>,
    by_path: HashMap<StreamPath, u64>,
    /// Streams with a TTL or an expiry time, for the periodic sweep.
    expiring: BTreeSet<u64>,
    /// By bucket, then ID.
    subscriptions: BTreeMap<(String, String), Subscription>,
    /// The subscriptions that follow each stream (derived from their links; an append looks
    /// here instead of at every subscription of its bucket).
    followers: HashMap<StreamPath, BTreeSet<(String, String)>>,
    effects: Vec<Effect>,
    /// Streams whose metadata changed by a data append in the current batch and is written
    /// once at its end (`finish_batch`): most of a batch's appends hit a few streams, and a
    /// metadata copy per append was most of what storage and readers were given to do.
    deferred_meta: Vec<u64>,
}

impl Machine {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            next_stream_id: 1,
            buckets: BTreeMap::new(),
            streams: HashMap::new(),
            by_path: HashMap::new(),
            expiring: BTreeSet::new(),
            subscriptions: BTreeMap::new(),
            followers: HashMap::new(),
            effects: Vec::new(),
            deferred_meta: Vec::new(),
        }
    }

    /// Rebuilds the machine from what storage holds.
    pub fn restore(
        limits: Limits,
        next_stream_id: u64,
        buckets: impl IntoIterator<Item = (String, BucketState)>,
        streams: impl IntoIterator<Item = StreamState>,
        subscriptions: impl IntoIterator<Item = Subscription>,
    ) -> Self {
        let mut machine = Self::new(limits);
        machine.next_stream_id = next_stream_id.max(1);
        machine.buckets = buckets.into_iter().collect();
        for state in streams {
            machine.insert_stream(state);
        }
        for subscription in subscriptions {
            machine.insert_subscription(subscription);
        }
        machine
    }

    /// Applies one command as a batch of its own: its effects are complete.
    pub fn apply(&mut self, command: Command) -> Applied {
        let mut effects = Vec::new();
        let result = self.apply_in_batch(command, &mut effects);
        self.finish_batch(&mut effects);
        Applied { result, effects }
    }

    /// Applies a command that is part of a batch, adding its effects to the batch's. The
    /// metadata writes of its data appends are left to `finish_batch`, which the batch's
    /// applier must call before it stores or publishes the batch's effects.
    pub fn apply_in_batch(
        &mut self,
        command: Command,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        let result = match command {
            Command::CreateBucket { bucket } => self.create_bucket(bucket),
            Command::Create(create) => self.create(create),
            Command::Append(append) => self.append(append),
            Command::Delete { path, now_ms } => self.delete(&path, now_ms),
            Command::Touch { touches } => Ok(self.touch(&touches)),
            Command::ExpireDue { now_ms } => Ok(self.expire_due(now_ms)),
            Command::PublishSnapshot(publish) => self.publish_snapshot(publish),
            Command::AdvanceRetention {
                path,
                offset,
                now_ms,
            } => self.advance_retention(&path, offset, now_ms),
            Command::PurgeBucket { bucket } => Ok(self.purge_bucket(bucket)),
            Command::ColdFlush(flush) => Ok(self.cold_flush(flush)),
            Command::Subscription(command) => self.subscription_command(command),
        };
        // `append` moves the effects and keeps this buffer's capacity for the next command.
        effects.append(&mut self.effects);
        result
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn stream(&self, id: u64) -> Option<&StreamState> {
        self.streams.get(&id)
    }

    pub fn stream_id(&self, path: &StreamPath) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    pub fn streams(&self) -> impl Iterator<Item = &StreamState> {
        self.streams.values()
    }

    pub fn buckets(&self) -> impl Iterator<Item = (&String, &BucketState)> {
        self.buckets.iter()
    }

    pub fn next_stream_id(&self) -> u64 {
        self.next_stream_id
    }

    fn emit(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    /// The metadata writes left from the batch's data appends, one per stream, each with the
    /// stream's metadata as it is now. A stream deleted since is not written back.
    pub fn finish_batch(&mut self, effects: &mut Vec<Effect>) {
        let mut deferred = std::mem::take(&mut self.deferred_meta);
        deferred.sort_unstable();
        deferred.dedup();
        for &id in &deferred {
            self.emit_meta(id);
        }
        deferred.clear();
        self.deferred_meta = deferred;
        effects.append(&mut self.effects);
    }

    fn defer_meta(&mut self, id: u64) {
        if self.deferred_meta.last() != Some(&id) {
            self.deferred_meta.push(id);
        }
    }

    fn emit_meta(&mut self, id: u64) {
        if let Some(state) = self.streams.get(&id) {
            let meta = std::sync::Arc::new(state.meta.clone());
            self.emit(Effect::PutStream(meta));
        }
    }

    fn insert_stream(&mut self, state: StreamState) {
        let id = state.meta.id;
        if state.meta.expires() && !state.meta.soft_deleted {
            self.expiring.insert(id);
        }
        self.by_path.insert(state.meta.path.clone(), id);
        self.streams.insert(id, state);
    }

    /// Buckets are implicit (a stream create brings its bucket into being); only a purged
    /// bucket refuses everything, for good.
    fn check_not_fenced(&self, bucket: &str) -> Result<(), Refusal> {
        match self.buckets.get(bucket) {
            Some(BucketState::Fenced) => Err(Refusal::BucketFenced(bucket.to_owned())),
            Some(BucketState::Active) | None => Ok(()),
        }
    }

    /// The ID of the live stream at `path`, after expiring it if its time has come.
    fn live_stream(&mut self, path: &StreamPath, now_ms: u64) -> Result<u64, Refusal> {
        self.check_not_fenced(&path.bucket)?;
        let id = self.existing_stream(path, now_ms)?;
        if self.streams[&id].meta.soft_deleted {
            return Err(Refusal::StreamDeleted(path.to_string()));
        }
        Ok(id)
    }

    /// Like `live_stream`, but a soft-deleted stream is returned too.
    fn existing_stream(&mut self, path: &StreamPath, now_ms: u64) -> Result<u64, Refusal> {
        let missing = || Refusal::StreamNotFound(path.to_string());
        let id = self.by_path.get(path).copied().ok_or_else(missing)?;
        self.expire_if_due(id, now_ms);
        self.by_path.get(path).copied().ok_or_else(missing)
    }

    fn create_bucket(&mut self, bucket: String) -> Result<Outcome, Refusal> {
        match self.buckets.get(&bucket) {
            Some(BucketState::Fenced) => Err(Refusal::BucketFenced(bucket)),
            Some(BucketState::Active) => Ok(Outcome::BucketCreated { created: false }),
            None => {
                self.buckets.insert(bucket.clone(), BucketState::Active);
                self.emit(Effect::PutBucket {
                    bucket,
                    state: BucketState::Active,
                });
                Ok(Outcome::BucketCreated { created: true })
            }
        }
    }
}
