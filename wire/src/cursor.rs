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

/// A cursor. Clients may echo any digits, and the reply to one at or past the current
/// interval must exceed it, however large it is: an echo beyond `u64` is kept as its digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    Number(u64),
    Beyond(Digits),
}

/// Decimal digits without leading zeros, greater than `u64::MAX`; only this module makes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digits(String);

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Beyond(Digits(digits)) => f.write_str(digits),
        }
    }
}

impl Cursor {
    /// A client's echo: decimal digits, or nothing (anything else counts as no echo).
    pub fn parse_echo(text: &str) -> Option<Self> {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = text.trim_start_matches('0');
        Some(match digits.parse() {
            Ok(n) => Self::Number(n),
            Err(_) if digits.is_empty() => Self::Number(0),
            Err(_) => Self::Beyond(Digits(digits.to_owned())),
        })
    }

    fn at_or_past(&self, interval: u64) -> bool {
        match self {
            Self::Number(n) => *n >= interval,
            Self::Beyond(_) => true,
        }
    }

    fn plus(&self, n: u64) -> Self {
        match self {
            Self::Number(m) => m.checked_add(n).map_or_else(
                || Self::Beyond(Digits(add_decimal(&m.to_string(), n))),
                Self::Number,
            ),
            Self::Beyond(Digits(digits)) => Self::Beyond(Digits(add_decimal(digits, n))),
        }
    }
}

/// `digits + n`, in decimal.
fn add_decimal(digits: &str, n: u64) -> String {
    let mut out: Vec<u8> = Vec::with_capacity(digits.len() + 1);
    let mut carry = u128::from(n);
    for digit in digits.bytes().rev() {
        let sum = u128::from(digit - b'0') + carry;
        out.push(b'0' + (sum % 10) as u8);
        carry = sum / 10;
    }
    while carry > 0 {
        out.push(b'0' + (carry % 10) as u8);
        carry /= 10;
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// The cursor for a response to a client that echoed `client` (a cursor that is not a number
/// counts as none).
pub fn next(now_ms: u64, client: Option<&str>) -> String {
    value(now_ms, client.and_then(Cursor::parse_echo)).to_string()
}

fn value(now_ms: u64, echoed: Option<Cursor>) -> Cursor {
    let current = interval(now_ms);
    match echoed {
        Some(echoed) if echoed.at_or_past(current) => echoed.plus(jitter(now_ms)),
        _ => Cursor::Number(current),
    }
}

/// The cursors of one SSE session: the first as `next` gives it (jitter included, once), each
/// later one the current interval or the last one sent, whichever is greater.
#[derive(Debug, Clone)]
pub struct Session {
    last: Cursor,
}

impl Session {
    pub fn new(now_ms: u64, echoed: Option<Cursor>) -> Self {
        Self {
            last: value(now_ms, echoed),
        }
    }

    /// The cursor for an event sent at `now_ms`.
    pub fn at(&mut self, now_ms: u64) -> Cursor {
        let current = interval(now_ms);
        if !self.last.at_or_past(current) {
            self.last = Cursor::Number(current);
        }
        self.last.clone()
    }

    /// Whether this session's cursors are still its own, ahead of the current interval that
    /// a client without an echo gets.
    pub fn is_ahead(&self, now_ms: u64) -> bool {
        match &self.last {
            Cursor::Number(n) => *n > interval(now_ms),
            Cursor::Beyond(_) => true,
        }
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
        assert_eq!(plain.at(start), Cursor::Number(2));
        assert!(!plain.is_ahead(start));
        assert_eq!(plain.at(start + INTERVAL_MS), Cursor::Number(3));
        for _ in 0..100 {
            let mut echoed = Session::new(start, Some(Cursor::Number(2)));
            let Cursor::Number(first) = echoed.at(start) else {
                panic!("a small echo gives a small cursor")
            };
            assert!(first > 2 && echoed.is_ahead(start));
            let mut last = first;
            for step in 0..400 {
                let Cursor::Number(cursor) = echoed.at(start + step * INTERVAL_MS) else {
                    panic!("a small echo gives a small cursor")
                };
                assert!(cursor >= last);
                last = cursor;
            }
            // Past its jitter, the session follows the clock.
            assert_eq!(last, 2 + 399);
            assert!(!echoed.is_ahead(start + 399 * INTERVAL_MS));
        }
    }

    /// Compares two cursors' digits as numbers.
    fn greater(a: &str, b: &str) -> bool {
        (a.len(), a) > (b.len(), b)
    }

    #[test]
    fn an_echo_of_any_size_gets_a_greater_cursor() {
        let now = EPOCH_MS + 45_000;
        for echo in [
            "18446744073709551615",
            "18446744073709551610",
            "99999999999999999999999999999999999999999999",
            "000000000000000000000000000000000000000000123456789012345678901234567890",
        ] {
            for _ in 0..50 {
                let reply = next(now, Some(echo));
                assert!(reply.bytes().all(|b| b.is_ascii_digit()), "{reply}");
                assert!(
                    greater(&reply, echo.trim_start_matches('0')),
                    "{reply} > {echo}"
                );
            }
        }
        assert_eq!(add_decimal("999", 1), "1000");
        assert_eq!(
            add_decimal("18446744073709551615", 5),
            "18446744073709551620"
        );
        assert_eq!(Cursor::parse_echo("000"), Some(Cursor::Number(0)));
        assert_eq!(Cursor::parse_echo("+5"), None);
        assert_eq!(Cursor::parse_echo(""), None);
    }

    #[test]
    fn a_session_from_a_huge_echo_stays_ahead_and_never_goes_down() {
        let start = EPOCH_MS + 45_000;
        let echo = Cursor::parse_echo("123456789012345678901234567890");
        let mut session = Session::new(start, echo);
        let first = session.at(start).to_string();
        assert!(greater(&first, "123456789012345678901234567890"));
        for step in 0..100 {
            assert_eq!(session.at(start + step * INTERVAL_MS).to_string(), first);
            assert!(session.is_ahead(start + step * INTERVAL_MS));
        }
    }

    #[test]
    fn decimal_addition_agrees_with_u128() {
        let mut samples = vec![0, 1, 9, 10, 99, u64::MAX - 1, u64::MAX];
        // A fixed pseudo-random walk over the rest of the range.
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            samples.push(x);
            samples.push(x >> (x % 64));
        }
        for (i, &m) in samples.iter().enumerate() {
            let n = samples[(i * 7 + 3) % samples.len()];
            let expected = (u128::from(m) + u128::from(n)).to_string();
            assert_eq!(add_decimal(&m.to_string(), n), expected, "{m} + {n}");
        }
    }
}
