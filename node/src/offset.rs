//! Offsets on the wire: the byte position as two groups of 16 zero-padded decimal digits,
//! `HHHHHHHHHHHHHHHH_LLLLLLLLLLLLLLLL` (position = H * 10^16 + L). The shape is the one Durable
//! Streams servers share (clients and the conformance suite write `0000000000000000_0000000000000000`
//! for the start), offsets sort lexicographically in stream order, and they never equal the
//! sentinels `-1` and `now`.

const LOW: u64 = 10_000_000_000_000_000;

pub fn format(offset: u64) -> String {
    format!("{:016}_{:016}", offset / LOW, offset % LOW)
}

/// The `offset` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetParam {
    /// `-1`, or no parameter: the first readable offset.
    Start,
    /// `now`: the tail.
    Now,
    At(u64),
}

pub fn parse_param(text: &str) -> Option<OffsetParam> {
    match text {
        "-1" => Some(OffsetParam::Start),
        "now" => Some(OffsetParam::Now),
        _ => parse(text).map(OffsetParam::At),
    }
}

/// Exactly the shape `format` writes; anything else is not an offset.
pub fn parse(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('_')?;
    let digits = |part: &str| part.len() == 16 && part.bytes().all(|b| b.is_ascii_digit());
    if !digits(high) || !digits(low) {
        return None;
    }
    let high: u64 = high.parse().ok()?;
    let low: u64 = low.parse().ok()?;
    high.checked_mul(LOW)?.checked_add(low)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_sorts() {
        for n in [0, 1, 9, 10, 12345, u64::MAX] {
            assert_eq!(parse(&format(n)), Some(n));
        }
        assert!(format(9) < format(10));
        assert!(format(99_999) < format(100_000));
    }

    #[test]
    fn rejects_everything_else() {
        assert_eq!(format(0), "0000000000000000_0000000000000000");
        assert_eq!(
            format(10_000_000_000_000_001),
            "0000000000000001_0000000000000001"
        );
        for bad in [
            "",
            "1",
            "-2",
            "0000000000000000_000000000000000a",
            "../0000000000000000_0000000000000000",
            "0000000000000000_0000000000000000,",
            "0000000000000000_00000000000000000",
            "0000000000000000-0000000000000000",
            "9999999999999999_9999999999999999",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(parse_param("-1"), Some(OffsetParam::Start));
        assert_eq!(parse_param("now"), Some(OffsetParam::Now));
    }
}
