//! What the clients saw, recorded as they saw it: every attempt of every write with its
//! answer, every read with when it started, and the stream's bytes at the end. The checker
//! reads nothing else.

/// How a write attempt was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 200 (or 201/204 for a plain append): it applied.
    Applied,
    /// 204 to a producer: a duplicate of a seq that already applied.
    Duplicate,
    /// A refusal marked `x-ursula-not-applied`: it says nothing applied.
    MarkedRefusal,
    /// No answer, or a refusal without the marker: it may or may not have applied.
    Unknown,
}

#[derive(Clone, Debug, Default)]
pub struct ProducerLog {
    pub stream: usize,
    /// Its records are `p{id}:{seq}`.
    pub id: usize,
    /// Every attempt, in order: (seq, outcome).
    pub attempts: Vec<(u64, Outcome)>,
    /// Each acknowledged seq and when (ms since the run started), by seq.
    pub acked: Vec<(u64, u64)>,
}

#[derive(Clone, Debug, Default)]
pub struct PlainLog {
    pub stream: usize,
    /// Its records are `q{id}:{n}`; each is sent once: (n, outcome, answered at ms).
    pub id: usize,
    pub writes: Vec<(u64, Outcome, u64)>,
}

/// A catch-up read of a whole stream, from its start to the tail it reported.
#[derive(Clone, Debug)]
pub struct ReadLog {
    pub stream: usize,
    pub started_at: u64,
    pub bytes: String,
    /// Who answered its pages.
    pub via: String,
}

/// An SSE or long-poll follower from the stream's start: what it read, across its
/// reconnections.
#[derive(Clone, Debug)]
pub struct FollowLog {
    pub stream: usize,
    pub data: String,
    pub reconnects: u32,
}

impl FollowLog {
    pub fn new(stream: usize) -> Self {
        Self {
            stream,
            data: String::new(),
            reconnects: 0,
        }
    }
}

/// The steps of a lifecycle round (`lifecycle.rs`), in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Create,
    Append,
    Fork,
    AppendToFork,
    CreateRetained,
    AppendRetained,
    Snapshot,
    Retain,
    Close,
    DeleteSource,
    DeleteFork,
}

/// One round of a lifecycle client.
#[derive(Clone, Debug, Default)]
pub struct Round {
    pub n: u64,
    /// The steps answered as done, and those sent at all, in order.
    pub done: Vec<Step>,
    pub attempted: Vec<Step>,
    /// The answer of an append to the closed source that applied, if one did.
    pub appended_after_close: Option<String>,
    /// Answers that are neither done nor a refusal a fault explains.
    pub odd: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct LifecycleLog {
    pub client: usize,
    pub rounds: Vec<Round>,
}

/// A stream of a round after everything healed: its bytes and whether it is closed, or `None`
/// when it is not there.
pub type Remains = Option<(String, bool)>;

/// A round's streams after everything healed.
#[derive(Clone, Debug, Default)]
pub struct RoundRemains {
    pub source: Remains,
    pub fork: Remains,
    /// The third stream: read from the retention point, read from its start (the status and
    /// `Stream-Retained-Offset` of the answer), and its snapshot (status, body).
    pub retained_from: Option<String>,
    pub below_retention: (u16, Option<String>),
    pub snapshot: (u16, String),
}

#[derive(Clone, Debug, Default)]
pub struct History {
    pub producers: Vec<ProducerLog>,
    pub plain: Vec<PlainLog>,
    pub reads: Vec<ReadLog>,
    pub follows: Vec<FollowLog>,
    pub lifecycles: Vec<LifecycleLog>,
    /// Each stream's bytes after everything healed.
    pub finals: Vec<String>,
    /// Each lifecycle round's source and fork after everything healed, by client and round.
    pub lifecycle_finals: Vec<Vec<RoundRemains>>,
}

impl History {
    pub fn operations(&self) -> usize {
        self.producers
            .iter()
            .map(|p| p.attempts.len())
            .chain(self.plain.iter().map(|p| p.writes.len()))
            .sum::<usize>()
            + self.reads.len()
            + self.follows.len()
            + self
                .lifecycles
                .iter()
                .flat_map(|l| &l.rounds)
                .map(|r| r.attempted.len())
                .sum::<usize>()
    }
}
