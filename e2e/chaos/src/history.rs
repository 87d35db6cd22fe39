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
    /// When each seq's append was acknowledged (ms since the run started), by seq.
    pub acked_at: Vec<u64>,
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

/// An SSE follower from the stream's start: what it read, across its reconnections.
#[derive(Clone, Debug)]
pub struct FollowLog {
    pub stream: usize,
    pub data: String,
    pub reconnects: u32,
}

#[derive(Clone, Debug, Default)]
pub struct History {
    pub producers: Vec<ProducerLog>,
    pub plain: Vec<PlainLog>,
    pub reads: Vec<ReadLog>,
    pub follows: Vec<FollowLog>,
    /// Each stream's bytes after everything healed.
    pub finals: Vec<String>,
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
    }
}
