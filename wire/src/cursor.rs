//! Live-read cursors: the number of 20 s intervals since 2024-10-09T00:00:00Z. A client that
//! echoes a cursor at or past the current interval gets a strictly greater one, with jitter, so
//! CDN-collapsed long-polls cannot loop on one cached answer.

const EPOCH_MS: u64 = 1_728_432_000_000;
const INTERVAL_MS: u64 = 20_000;
/// Jitter of 1 s to 3600 s, in whole intervals.
const MAX_JITTER_INTERVALS: u64 = 3600 * 1000 / INTERVAL_MS;

/// The interval `now_ms` falls in: the cursor of a client that echoed none.
pub fn interval(now_ms: u64) -> u64 {
    now_ms.saturating_sub(EPOCH_MS) / INTERVAL_MS
}

/// Whether a client that echoed `client` gets the same cursor as one that echoed none.
pub fn echo_is_behind(now_ms: u64, client: Option<&str>) -> bool {
    client
        .and_then(|c| c.parse::<u64>().ok())
        .is_none_or(|echoed| echoed < interval(now_ms))
}

pub fn next(now_ms: u64, client: Option<&str>) -> String {
    let current = interval(now_ms);
    let echoed = client.and_then(|c| c.parse::<u64>().ok());
    let value = match echoed {
        Some(echoed) if echoed >= current => echoed.saturating_add(jitter(now_ms)),
        _ => current,
    };
    value.to_string()
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
        assert!(echo_is_behind(now, None));
        assert!(echo_is_behind(now, Some("1")));
        assert!(echo_is_behind(now, Some("not-a-number")));
        assert!(!echo_is_behind(now, Some("2")));
        assert!(!echo_is_behind(now, Some("500")));
    }
}
