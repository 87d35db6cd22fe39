//! The processes' logs after a run: a panic is always an anomaly; an error-level line is one
//! unless a fault of the run explains it (a full disk explains a failed write, say). Each
//! explanation names the fault kinds that may cause the lines it matches.

use crate::schedule::Schedule;

/// (fault kinds, a piece of the line): lines with that piece are explained when the run
/// injected one of those kinds.
const EXPLANATIONS: &[(&[&str], &str)] = &[
    // A write that meets ENOSPC: refused, or the node exits to recover from what is on disk
    // (redb refuses every write after one failed: "Previous I/O error occurred").
    (&["disk full"], "No space left on device"),
    (&["disk full"], "Previous I/O error occurred"),
    (&["disk full"], "the Raft log write failed"),
];

pub struct Explained {
    pieces: Vec<&'static str>,
}

impl Explained {
    pub fn by(schedule: &Schedule) -> Self {
        let kinds: Vec<&str> = schedule.steps.iter().map(|s| s.fault.kind()).collect();
        let pieces = EXPLANATIONS
            .iter()
            .filter(|(by, _)| by.iter().any(|k| kinds.contains(k)))
            .map(|(_, piece)| *piece)
            .collect();
        Self { pieces }
    }

    /// The lines of `log` that are anomalies (the first few of them).
    pub fn unexplained(&self, log: &str) -> Vec<String> {
        log.lines()
            .map(strip_ansi)
            .filter(|line| {
                let explained = || self.pieces.iter().any(|p| line.contains(p));
                line.contains("panicked") || (is_error(line) && !explained())
            })
            .take(5)
            .collect()
    }
}

/// tracing's format: a timestamp, then the level.
fn is_error(line: &str) -> bool {
    line.split_whitespace().nth(1) == Some("ERROR")
}

/// The line without terminal colour codes (`ESC [ ... m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_and_panics_are_found_through_colour_codes() {
        let schedule = Schedule::generate(
            1,
            crate::schedule::Abilities {
                partitions: false,
                disks: false,
                clocks: false,
            },
        );
        let explained = Explained::by(&schedule);
        let log = "2026-12-02T10:00:00.000001Z  INFO ursula: serving\n\
                   \u{1b}[2m2026-12-02T10:00:00.000002Z\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m ursula: boom\n\
                   thread 'main' panicked at node/src/x.rs:1:1\n";
        let found = explained.unexplained(log);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].ends_with("ursula: boom"));
        assert!(found[1].contains("panicked"));
    }
}
