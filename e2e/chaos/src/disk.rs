//! A disk that fills up: a voter that a `DiskFull` fault hits keeps its data on a small tmpfs
//! of its own (root only), which the fault fills with a file and empties again. Free space
//! left under the admission floor (`raft.wal.min_available_size`, 1 MiB in the test cluster's
//! config) tests that writes are refused before the disk is full; none left tests what the
//! node does when a write meets ENOSPC.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Each small disk's size: room for a run's data many times over.
const SIZE: &str = "size=256m";

/// Free space a fill "under the floor" leaves: half the test cluster's admission floor.
pub const UNDER_THE_FLOOR: u64 = 512 * 1024;

/// The small disks mounted for a run, in a directory of their own (the data directories
/// are links to them, so that the cluster's directory holds no mount point); unmounted when
/// dropped, after the voters are gone.
pub struct SmallDisks {
    dir: tempfile::TempDir,
    mounted: parking_lot::Mutex<Vec<PathBuf>>,
}

impl Default for SmallDisks {
    fn default() -> Self {
        Self {
            dir: tempfile::tempdir().expect("a directory for small disks"),
            mounted: parking_lot::Mutex::default(),
        }
    }
}

impl SmallDisks {
    /// Puts the (empty) directory `data` on a small disk: `data` becomes a link to it.
    pub fn mount(&self, data: &Path) {
        let mut mounted = self.mounted.lock();
        let point = self.dir.path().join(format!("disk-{}", mounted.len()));
        std::fs::create_dir(&point).expect("a mount point");
        assert!(mount(&point, SIZE), "mount a tmpfs on {}", point.display());
        mounted.push(point.clone());
        std::fs::remove_dir(data).expect("an empty data directory");
        std::os::unix::fs::symlink(&point, data).expect("link the data directory");
    }
}

fn mount(point: &Path, size: &str) -> bool {
    Command::new("mount")
        .args(["-t", "tmpfs", "-o", size, "tmpfs"])
        .arg(point)
        .status()
        .is_ok_and(|s| s.success())
}

impl Drop for SmallDisks {
    fn drop(&mut self) {
        for point in self.mounted.lock().drain(..) {
            let _ = Command::new("umount").arg("-l").arg(&point).status();
        }
    }
}

/// Whether this process may mount a tmpfs (root).
pub fn can_mount() -> bool {
    let disks = SmallDisks::default();
    let point = disks.dir.path().to_owned();
    let mounted = mount(&point, "size=1m");
    if mounted {
        disks.mounted.lock().push(point);
    }
    mounted
}

/// The bytes free on the file system that holds `path`.
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the struct it is given; the path is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some(stat.f_bavail as u64 * stat.f_frsize as u64)
}

/// Writes `filler` until `leave` bytes are free where it is (or the disk is full).
pub fn fill(filler: &Path, leave: u64) {
    let Some(dir) = filler.parent() else { return };
    let Ok(mut file) = std::fs::File::create(filler) else {
        return;
    };
    let chunk = vec![0x5au8; 1 << 20];
    while let Some(free) = free_bytes(dir) {
        if free <= leave {
            break;
        }
        let n = (free - leave).min(chunk.len() as u64) as usize;
        if file.write_all(&chunk[..n]).is_err() {
            break;
        }
    }
    let _ = file.sync_all();
}
