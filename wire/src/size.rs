//! Sizes in config files: an integer of bytes, or a number with a binary unit (`"512KiB"`,
//! `"64MiB"`, `"1GiB"`, `"1TiB"`, `"100B"`). Node and gateway configs read every size key this
//! way, so that a size means the same everywhere.

use serde::{Deserialize, Deserializer};

const UNITS: [(&str, u64); 5] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("B", 1),
];

/// What an error says a size may be.
pub const ACCEPTED: &str =
    "an integer of bytes, or a whole number with B, KiB, MiB, GiB or TiB (e.g. \"64MiB\")";

/// `"64MiB"` and friends, or a plain number of bytes written as a string (`"4096"`).
pub fn parse(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let invalid = || format!("{text:?} is not a size: expected {ACCEPTED}");
    let (number, unit) = UNITS
        .iter()
        .find_map(|(suffix, unit)| Some((text.strip_suffix(suffix)?, *unit)))
        .unwrap_or((text, 1));
    let number: u64 = number.trim().parse().map_err(|_| invalid())?;
    number.checked_mul(unit).ok_or_else(invalid)
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Written {
    Bytes(u64),
    Text(String),
}

/// A size key (`#[serde(deserialize_with = "ursula_wire::size::bytes")]`).
pub fn bytes<'de, D: Deserializer<'de>, T: TryFrom<u64>>(deserializer: D) -> Result<T, D::Error> {
    let written = Written::deserialize(deserializer)
        .map_err(|_| serde::de::Error::custom(format!("expected {ACCEPTED}")))?;
    let bytes = match written {
        Written::Bytes(bytes) => bytes,
        Written::Text(text) => parse(&text).map_err(serde::de::Error::custom)?,
    };
    T::try_from(bytes).map_err(|_| serde::de::Error::custom(format!("{bytes} bytes is too large")))
}

/// An optional size key.
pub fn optional_bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    bytes(deserializer).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_and_without_units() {
        for (text, bytes) in [
            ("4096", Some(4096)),
            ("100B", Some(100)),
            ("512KiB", Some(512 * 1024)),
            ("64MiB", Some(64 * 1024 * 1024)),
            ("64 MiB", Some(64 * 1024 * 1024)),
            ("1GiB", Some(1 << 30)),
            ("1TiB", Some(1 << 40)),
            ("1.5GiB", None),
            ("64MB", None),
            ("-1", None),
            ("lots", None),
            ("", None),
            ("99999999999TiB", None),
        ] {
            assert_eq!(parse(text).ok(), bytes, "{text:?}");
        }
        assert!(parse("ten").unwrap_err().contains("KiB, MiB, GiB or TiB"));
    }
}
