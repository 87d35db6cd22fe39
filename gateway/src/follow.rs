//! The redirect rule, as a pure state machine: which upstream to send to next, when to stop,
//! and whether the answer may keep (or carry) the marker `x-ursula-not-applied`.
//!
//! - Raft leader redirects are followed by the gateway itself: at most `max_hops` in a row,
//!   none started later than `window` after the first redirect, and through the upstreams not
//!   tried yet when a redirect names an address that is none of them or one already tried.
//! - The final answer keeps a node's marker only if every redirect on the way carried one.
//! - A request never delivered anywhere (every connection failed) is answered 503, marked.
//! - After redirects, a 503 for a node it could not connect to, or for giving up following, is
//!   marked only if every redirect was marked.

use std::time::{Duration, Instant};

use ursula_wire::ErrorToken;

/// What happened to one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// A Raft leader redirect; `target` is the upstream its `Location` names, if any.
    LeaderRedirect { target: Option<usize>, marked: bool },
    /// The connection to the upstream failed: the request was not sent.
    ConnectFailed,
    /// Any other answer.
    Answer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Send(usize),
    /// Return the upstream's answer; strip its marker unless `keep_marker`.
    Return {
        keep_marker: bool,
    },
    /// Answer 503 with `Retry-After: 1` and this token; with the marker iff `marked`.
    Unavailable {
        token: ErrorToken,
        marked: bool,
    },
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_hops: u32,
    pub window: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_hops: 3,
            window: Duration::from_secs(5),
        }
    }
}

#[derive(Debug)]
pub struct Follow {
    limits: Limits,
    tried: Vec<bool>,
    current: usize,
    hops: u32,
    first_redirect: Option<Instant>,
    all_redirects_marked: bool,
    /// Whether any upstream has received the request.
    delivered: bool,
}

impl Follow {
    /// Starts with `first`; the returned decision is `Send(first)`.
    pub fn new(upstreams: usize, first: usize, limits: Limits) -> (Self, Decision) {
        let mut tried = vec![false; upstreams];
        tried[first] = true;
        let follow = Self {
            limits,
            tried,
            current: first,
            hops: 0,
            first_redirect: None,
            all_redirects_marked: true,
            delivered: false,
        };
        (follow, Decision::Send(first))
    }

    pub fn observe(&mut self, observed: Observed, now: Instant) -> Decision {
        match observed {
            Observed::Answer => Decision::Return {
                keep_marker: self.all_redirects_marked,
            },
            Observed::ConnectFailed if !self.delivered => match self.untried() {
                // Nothing was sent anywhere yet: another upstream may take it.
                Some(next) => self.send(next),
                None => Decision::Unavailable {
                    token: ErrorToken::UpstreamUnavailable,
                    marked: true,
                },
            },
            Observed::ConnectFailed => Decision::Unavailable {
                token: ErrorToken::UpstreamUnavailable,
                marked: self.all_redirects_marked,
            },
            Observed::LeaderRedirect { target, marked } => {
                self.delivered = true;
                self.all_redirects_marked &= marked;
                let first = *self.first_redirect.get_or_insert(now);
                self.hops += 1;
                let give_up = Decision::Unavailable {
                    token: ErrorToken::LeaderNotFound,
                    marked: self.all_redirects_marked,
                };
                if self.hops > self.limits.max_hops
                    || now.duration_since(first) > self.limits.window
                {
                    return give_up;
                }
                let next = target
                    .filter(|t| !self.tried[*t])
                    .or_else(|| self.untried());
                match next {
                    Some(next) => self.send(next),
                    None => give_up,
                }
            }
        }
    }

    /// Whether every redirect so far carried the marker (true before any): only then may
    /// the gateway mark what it answers for the request.
    pub fn all_redirects_marked(&self) -> bool {
        self.all_redirects_marked
    }

    /// Call when a request was handed to the current upstream (its connection succeeded).
    pub fn delivered(&mut self) {
        self.delivered = true;
    }

    pub fn current(&self) -> usize {
        self.current
    }

    fn untried(&self) -> Option<usize> {
        self.tried.iter().position(|t| !*t)
    }

    fn send(&mut self, next: usize) -> Decision {
        self.tried[next] = true;
        self.current = next;
        Decision::Send(next)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn redirect(target: Option<usize>, marked: bool) -> Observed {
        Observed::LeaderRedirect { target, marked }
    }

    #[test]
    fn follows_three_hops_then_gives_up() {
        let t0 = Instant::now();
        let (mut f, first) = Follow::new(5, 0, Limits::default());
        assert_eq!(first, Decision::Send(0));
        f.delivered();
        assert_eq!(f.observe(redirect(Some(1), true), t0), Decision::Send(1));
        assert_eq!(f.observe(redirect(Some(2), true), t0), Decision::Send(2));
        assert_eq!(f.observe(redirect(Some(3), true), t0), Decision::Send(3));
        assert_eq!(
            f.observe(redirect(Some(4), true), t0),
            Decision::Unavailable {
                token: ErrorToken::LeaderNotFound,
                marked: true
            }
        );
    }

    #[test]
    fn unknown_or_visited_targets_go_to_untried_upstreams() {
        let t0 = Instant::now();
        let (mut f, _) = Follow::new(3, 1, Limits::default());
        assert_eq!(f.observe(redirect(None, true), t0), Decision::Send(0));
        assert_eq!(f.observe(redirect(Some(1), true), t0), Decision::Send(2));
        assert_eq!(
            f.observe(redirect(Some(0), false), t0),
            Decision::Unavailable {
                token: ErrorToken::LeaderNotFound,
                marked: false
            }
        );
    }

    #[test]
    fn no_hop_starts_after_the_window() {
        let t0 = Instant::now();
        let (mut f, _) = Follow::new(3, 0, Limits::default());
        assert_eq!(f.observe(redirect(Some(1), true), t0), Decision::Send(1));
        let late = t0 + Duration::from_millis(5001);
        assert!(matches!(
            f.observe(redirect(Some(2), true), late),
            Decision::Unavailable { .. }
        ));
    }

    #[test]
    fn markers_survive_only_fully_marked_chains() {
        let t0 = Instant::now();
        let (mut f, _) = Follow::new(3, 0, Limits::default());
        f.observe(redirect(Some(1), true), t0);
        assert_eq!(
            f.observe(Observed::Answer, t0),
            Decision::Return { keep_marker: true }
        );
        assert!(f.all_redirects_marked());
        let (mut f, _) = Follow::new(3, 0, Limits::default());
        f.observe(redirect(Some(1), false), t0);
        // A refusal the gateway makes on this hop must go unmarked too.
        assert!(!f.all_redirects_marked());
        assert_eq!(
            f.observe(Observed::Answer, t0),
            Decision::Return { keep_marker: false }
        );
        assert_eq!(
            f.observe(Observed::ConnectFailed, t0),
            Decision::Unavailable {
                token: ErrorToken::UpstreamUnavailable,
                marked: false
            }
        );
    }

    #[test]
    fn connection_failures_before_delivery_try_the_others_then_mark() {
        let t0 = Instant::now();
        let (mut f, _) = Follow::new(2, 0, Limits::default());
        assert_eq!(f.observe(Observed::ConnectFailed, t0), Decision::Send(1));
        assert_eq!(
            f.observe(Observed::ConnectFailed, t0),
            Decision::Unavailable {
                token: ErrorToken::UpstreamUnavailable,
                marked: true
            }
        );
    }

    fn arb_observed(n: usize) -> impl Strategy<Value = Observed> {
        prop_oneof![
            (prop::option::of(0..n), any::<bool>())
                .prop_map(|(target, marked)| Observed::LeaderRedirect { target, marked }),
            Just(Observed::ConnectFailed),
            Just(Observed::Answer),
        ]
    }

    proptest! {
        /// A marked answer from the gateway implies that no upstream that might have proposed
        /// the write (one that received it and answered without a marker) was contacted.
        #[test]
        fn marked_answers_never_hide_an_unmarked_attempt(
            n in 1usize..5,
            first in 0usize..5,
            steps in prop::collection::vec((arb_observed(5), any::<bool>(), 0u64..3000), 1..12),
        ) {
            let first = first % n;
            let t0 = Instant::now();
            let (mut follow, mut decision) = Follow::new(n, first, Limits::default());
            let mut unmarked_contact = false;
            let mut elapsed = 0;
            for (observed, final_marked, dt) in steps {
                let Decision::Send(_) = decision else { break };
                elapsed += dt;
                let observed = match observed {
                    Observed::LeaderRedirect { target, marked } => Observed::LeaderRedirect {
                        target: target.map(|t| t % n),
                        marked,
                    },
                    other => other,
                };
                match observed {
                    Observed::LeaderRedirect { marked: false, .. } => unmarked_contact = true,
                    Observed::ConnectFailed => {}
                    _ => follow.delivered(),
                }
                decision = follow.observe(observed, t0 + Duration::from_millis(elapsed));
                if let Decision::Return { keep_marker: true } = decision
                    && final_marked
                {
                    prop_assert!(!unmarked_contact);
                }
                if let Decision::Unavailable { marked: true, .. } = decision {
                    prop_assert!(!unmarked_contact);
                }
            }
        }
    }
}
