//! Bucket IDs, stream names and URL paths.
//!
//! A bucket ID is 3 to 63 characters of `a-z`, `0-9` and `-`, starting and ending with a letter
//! or digit (the S3 rule without dots), and not `admin`, which is reserved so that no client
//! route starts with `/admin/` (a gateway refuses those paths without forwarding them). A stream name is 1 to 1024 bytes of UTF-8 after
//! percent-decoding, made of `/`-separated segments that are neither empty, `.` nor `..`, with
//! no control characters.

use crate::machine::StreamPath;

pub const MAX_STREAM_NAME: usize = 1024;

pub fn is_valid_bucket(id: &str) -> bool {
    let bytes = id.as_bytes();
    id != "admin"
        && (3..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

pub fn is_valid_stream_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_STREAM_NAME
        && !name.chars().any(char::is_control)
        && name
            .split('/')
            .all(|segment| !segment.is_empty() && segment != "." && segment != "..")
}

/// Decodes `%XX` escapes; `None` if an escape is malformed or the result is not UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_owned());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The request path of a stream, percent-encoded where needed, for `Location` headers.
pub fn encode_path_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The canonical bucket-family path of a stream.
pub fn stream_url_path(path: &StreamPath) -> String {
    format!("/{}/{}", path.bucket, encode_path_segment(&path.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_rule() {
        for ok in ["abc", "demo", "a-b", "0x0", &"a".repeat(63)] {
            assert!(is_valid_bucket(ok), "{ok}");
        }
        for bad in [
            "",
            "ab",
            "-ab",
            "ab-",
            "Abc",
            "a_b",
            "a.b",
            "v1",
            &"a".repeat(64),
            "ünï",
        ] {
            assert!(!is_valid_bucket(bad), "{bad}");
        }
    }

    #[test]
    fn stream_name_rule() {
        for ok in ["x", "a/b", "with space", "ünïcode", &"n".repeat(1024)] {
            assert!(is_valid_stream_name(ok), "{ok}");
        }
        for bad in [
            "",
            "a//b",
            "/a",
            "a/",
            ".",
            "..",
            "a/../b",
            "nul\0",
            "line\n",
            &"n".repeat(1025),
        ] {
            assert!(!is_valid_stream_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(percent_decode("%E2%9C%93").as_deref(), Some("✓"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%C3"), None);
        assert_eq!(percent_decode("%4"), None);
    }
}
