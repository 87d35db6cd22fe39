//! Fake wall clocks, for clock steps: libfaketime (Debian's `faketime` package) preloaded into
//! every voter of a run that steps clocks. Each voter reads its offset from a file of its own
//! at most a second old (`FAKETIME_CACHE_DURATION`), so a step takes effect within a second;
//! its monotonic clock is left alone (`FAKETIME_DONT_FAKE_MONOTONIC`), as a real clock step
//! leaves it: timers, leases and Raft's timeouts run on the monotonic clock.

use std::path::PathBuf;

/// Where Debian installs the library, on any architecture.
pub fn library() -> Option<PathBuf> {
    let dirs = std::fs::read_dir("/usr/lib").ok()?;
    std::iter::once(PathBuf::from("/usr/lib"))
        .chain(dirs.flatten().map(|entry| entry.path()))
        .map(|dir| dir.join("faketime/libfaketime.so.1"))
        .find(|path| path.exists())
}

pub struct Clocks {
    library: PathBuf,
    dir: tempfile::TempDir,
}

impl Clocks {
    pub fn new(library: PathBuf) -> Self {
        Self {
            library,
            dir: tempfile::tempdir().expect("a directory for clock files"),
        }
    }

    fn file(&self, voter: usize) -> PathBuf {
        self.dir.path().join(format!("clock-{voter}"))
    }

    /// The environment voter `voter` runs with: its clock true to start with.
    pub fn environment(&self, voter: usize) -> Vec<(String, String)> {
        self.step(voter, 0);
        [
            ("LD_PRELOAD", self.library.display().to_string()),
            (
                "FAKETIME_TIMESTAMP_FILE",
                self.file(voter).display().to_string(),
            ),
            ("FAKETIME_CACHE_DURATION", "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
            ("FAKETIME_DISABLE_SHM", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// Sets voter `voter`'s wall clock `seconds` away from the true time.
    pub fn step(&self, voter: usize, seconds: i64) {
        std::fs::write(self.file(voter), format!("{seconds:+}\n")).expect("write a clock file");
    }
}
