//! The workspace's binaries, for tests that run them as processes.
//!
//! Cargo hands an integration test the binaries of its own package only
//! (`CARGO_BIN_EXE_<name>`), so a test of another crate that needs `ursula-node` declares it by
//! calling `node()`: the binary of this build's profile, built first (a no-op when it is up to
//! date), so that it is never missing or older than the sources.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// `ursula-node`, as this test's build profile builds it.
pub fn node() -> &'static Path {
    static NODE: OnceLock<PathBuf> = OnceLock::new();
    NODE.get_or_init(|| built("ursula-node", "ursula-node"))
}

fn built(package: &str, bin: &str) -> PathBuf {
    // A test runs as target/<profile>/deps/<test>-<hash>; the binaries are in target/<profile>.
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs in target/<profile>/deps")
        .to_owned();
    let target_dir = profile_dir.parent().expect("target/<profile>").to_owned();
    let profile = profile_dir
        .file_name()
        .and_then(|name| name.to_str())
        .expect("a profile directory");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--quiet", "--locked", "-p", package, "--bin", bin])
        .arg("--profile")
        .arg(if profile == "debug" { "dev" } else { profile })
        .env("CARGO_TARGET_DIR", &target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build {bin}: {e}"));
    assert!(
        status.success(),
        "cargo build -p {package} --bin {bin} failed"
    );
    let path = profile_dir.join(bin);
    assert!(path.exists(), "{path:?} is missing after cargo built it");
    path
}
