//! Live-read cursors: the number of 20 s intervals since 2024-10-09T00:00:00Z. A client that
//! echoes a cursor at or past the current interval gets a strictly greater one, with jitter, so
//! CDN-collapsed long-polls cannot loop on one cached answer. An SSE session sends many
//! cursors; `Session` keeps them from ever going down.

const EPOCH_MS: u64 = 1_728_432_000_000;
const INTERVAL_MS: u64 = 20_000;
/// Jitter of 1 s to 3600 s, in whole intervals.
const MAX_JITTER_INTERVALS: u64 = 3600 * 1000 / INTERVAL_MS;

/// The interval `now_ms` falls in: the cursor of a client that echoed none.
pub fn interval(now_ms: u64) -> u64 {
    now_ms.saturating_sub(EPOCH_MS) / INTERVAL_MS
}

/// The cursor for a response to a client that echoed `client` (a cursor that is not a number
/// counts as none).
pub fn next(now_ms: u64, client: Option<&str>) -> String {
    value(now_ms, client.and_then(|c| c.parse().ok())).to_string()
}

fn value(now_ms: u64, echoed: Option<u64>) -> u64 {
    let current = interval(now_ms);
    match echoed {
        Some(echoed) if echoed >= current => echoed.saturating_add(jitter(now_ms)),
        _ => current,
    }
}

/// The cursors of one SSE session: the first as `next` gives it (jitter included, once), each
/// later one the current interval or the last one sent, whichever is greater.
#[derive(Debug, Clone)]
pub struct Session {
    last: u64,
}

impl Session {
    pub fn new(now_ms: u64, echoed: Option<u64>) -> Self {
        Self {
            last: value(now_ms, echoed),
        }
    }

    /// The cursor for an event sent at `now_ms`.
    pub fn at(&mut self, now_ms: u64) -> u64 {
        self.last = self.last.max(interval(now_ms));
        self.last
    }

    /// Whether this session's cursors are still its own, ahead of the current interval that
    /// a client without an echo gets.
    pub fn is_ahead(&self, now_ms: u64) -> bool {
        self.last > interval(now_ms)
    }
}

fn jitter(seed: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    // splitmix64: cheap and well spread; this needs no cryptographic strength.
    let mut z = seed ^ nanos.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    1 + z % MAX_JITTER_INTERVALS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_is_the_interval_number_and_moves_past_an_echo() {
        let now = EPOCH_MS + 45_000;
        assert_eq!(next(now, None), "2");
        assert_eq!(next(now, Some("1")), "2");
        for _ in 0..100 {
            let bumped: u64 = next(now, Some("2")).parse().unwrap();
            assert!((3..=2 + MAX_JITTER_INTERVALS).contains(&bumped));
            let far: u64 = next(now, Some("500")).parse().unwrap();
            assert!(far > 500);
        }
        assert_eq!(next(now, Some("not-a-number")), "2");
    }

    #[test]
    fn a_session_never_sends_a_smaller_cursor() {
        let start = EPOCH_MS + 45_000;
        let mut plain = Session::new(start, None);
        assert_eq!(plain.at(start), 2);
        assert!(!plain.is_ahead(start));
        assert_eq!(plain.at(start + INTERVAL_MS), 3);
        for _ in 0..100 {
            let mut echoed = Session::new(start, Some(2));
            let first = echoed.at(start);
            assert!(first > 2 && echoed.is_ahead(start));
            let mut last = first;
            for step in 0..400 {
                let cursor = echoed.at(start + step * INTERVAL_MS);
                assert!(cursor >= last);
                last = cursor;
            }
            // Past its jitter, the session follows the clock.
            assert_eq!(last, 2 + 399);
            assert!(!echoed.is_ahead(start + 399 * INTERVAL_MS));
        }
    }
}
