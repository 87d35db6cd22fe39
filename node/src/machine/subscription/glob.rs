//! Subscription patterns over stream names: `/` separates segments, `*` matches any text
//! within one segment (alone it is the whole segment), `**` matches any number of segments,
//! none included.

/// Whether `pattern` is one a subscription may use: not empty, no empty segment, and `**`
/// only as a whole segment.
pub fn is_valid(pattern: &str) -> bool {
    !pattern.is_empty()
        && pattern
            .split('/')
            .all(|segment| !segment.is_empty() && (segment == "**" || !segment.contains("**")))
}

pub fn matches(pattern: &str, name: &str) -> bool {
    let pattern: Vec<&str> = pattern.split('/').collect();
    let name: Vec<&str> = name.split('/').collect();
    segments_match(&pattern, &name)
}

fn segments_match(pattern: &[&str], name: &[&str]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((&"**", rest)) => (0..=name.len()).any(|skip| segments_match(rest, &name[skip..])),
        Some((segment, rest)) => match name.split_first() {
            Some((first, others)) => {
                segment_matches(segment, first) && segments_match(rest, others)
            }
            None => false,
        },
    }
}

/// One segment, where each `*` matches any run of characters.
fn segment_matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole segment must match.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_the_protocol_says() {
        let cases = [
            ("events/*", "events/a", true),
            ("events/*", "events/a/b", false),
            ("events/*", "events", false),
            ("events/**", "events/a/b", true),
            ("events/**", "events", true),
            ("**", "anything/at/all", true),
            ("a/**/z", "a/z", true),
            ("a/**/z", "a/b/c/z", true),
            ("a/**/z", "a/b/c/y", false),
            ("orders-*", "orders-42", true),
            ("orders-*", "order-42", false),
            ("*-eu/*", "orders-eu/1", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("ab*ba", "aba", false),
            ("exact/name", "exact/name", true),
            ("exact/name", "exact/names", false),
        ];
        for (pattern, name, expected) in cases {
            assert_eq!(matches(pattern, name), expected, "{pattern} ~ {name}");
        }
    }

    #[test]
    fn validity() {
        for good in ["events/*", "**", "a/**/b", "x-*"] {
            assert!(is_valid(good), "{good}");
        }
        for bad in ["", "a//b", "/a", "a/", "a**", "a/**b"] {
            assert!(!is_valid(bad), "{bad}");
        }
    }
}
