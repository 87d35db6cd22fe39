//! Idempotent producers: exactly-once appends by (Producer-Id, Producer-Epoch, Producer-Seq).

use super::command::ProducerClaim;
use super::outcome::Refusal;
use super::stream::ProducerState;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProducerCheck {
    /// Apply the write; this producer's state becomes `next`.
    Accept {
        next: ProducerState,
    },
    /// The write already applied: answer success and append nothing.
    Duplicate {
        epoch: u64,
        last_seq: u64,
    },
    Refuse(Refusal),
}

/// Checks a claim against the producer's state. An unknown producer is a producer at a new
/// epoch: it starts at seq 0, and a higher seq (an earlier request still in flight) is a gap the
/// client waits out and retries.
pub fn check(state: Option<&ProducerState>, claim: &ProducerClaim, now_ms: u64) -> ProducerCheck {
    let accept = |seq| ProducerCheck::Accept {
        next: ProducerState {
            epoch: claim.epoch,
            last_seq: seq,
            last_write_ms: now_ms,
        },
    };
    let Some(state) = state else {
        return if claim.seq == 0 {
            accept(0)
        } else {
            ProducerCheck::Refuse(Refusal::ProducerSeqGap {
                expected: 0,
                received: claim.seq,
            })
        };
    };
    if claim.epoch < state.epoch {
        return ProducerCheck::Refuse(Refusal::ProducerFenced {
            current: state.epoch,
            received: claim.epoch,
        });
    }
    if claim.epoch > state.epoch {
        return if claim.seq == 0 {
            accept(0)
        } else {
            ProducerCheck::Refuse(Refusal::ProducerEpochSeqNotZero { seq: claim.seq })
        };
    }
    if claim.seq <= state.last_seq {
        return ProducerCheck::Duplicate {
            epoch: state.epoch,
            last_seq: state.last_seq,
        };
    }
    if claim.seq == state.last_seq + 1 {
        return accept(claim.seq);
    }
    ProducerCheck::Refuse(Refusal::ProducerSeqGap {
        expected: state.last_seq + 1,
        received: claim.seq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(epoch: u64, seq: u64) -> ProducerClaim {
        ProducerClaim {
            id: "p".into(),
            epoch,
            seq,
        }
    }

    fn state(epoch: u64, last_seq: u64) -> ProducerState {
        ProducerState {
            epoch,
            last_seq,
            last_write_ms: 0,
        }
    }

    #[test]
    fn table() {
        use ProducerCheck::*;
        let cases: Vec<(Option<ProducerState>, ProducerClaim, ProducerCheck)> = vec![
            (None, claim(0, 0), Accept { next: state(0, 0) }),
            (None, claim(7, 0), Accept { next: state(7, 0) }),
            (
                None,
                claim(0, 3),
                Refuse(Refusal::ProducerSeqGap {
                    expected: 0,
                    received: 3,
                }),
            ),
            (Some(state(1, 4)), claim(1, 5), Accept { next: state(1, 5) }),
            (
                Some(state(1, 4)),
                claim(1, 4),
                Duplicate {
                    epoch: 1,
                    last_seq: 4,
                },
            ),
            (
                Some(state(1, 4)),
                claim(1, 0),
                Duplicate {
                    epoch: 1,
                    last_seq: 4,
                },
            ),
            (
                Some(state(1, 4)),
                claim(1, 7),
                Refuse(Refusal::ProducerSeqGap {
                    expected: 5,
                    received: 7,
                }),
            ),
            (
                Some(state(2, 4)),
                claim(1, 5),
                Refuse(Refusal::ProducerFenced {
                    current: 2,
                    received: 1,
                }),
            ),
            (Some(state(2, 4)), claim(3, 0), Accept { next: state(3, 0) }),
            (
                Some(state(2, 4)),
                claim(3, 5),
                Refuse(Refusal::ProducerEpochSeqNotZero { seq: 5 }),
            ),
        ];
        for (given, claim, expected) in cases {
            assert_eq!(
                check(given.as_ref(), &claim, 0),
                expected,
                "{given:?} {claim:?}"
            );
        }
    }
}
