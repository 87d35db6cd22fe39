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

/// `ursula-gateway`, the same way.
pub fn gateway() -> &'static Path {
    static GATEWAY: OnceLock<PathBuf> = OnceLock::new();
    GATEWAY.get_or_init(|| built("ursula-gateway", "ursula-gateway"))
}

fn built(package: &str, bin: &str) -> PathBuf {
    // A test runs as target/<profile>/deps/<test>-<hash>, a binary (the chaos campaign) as
    // target/<profile>/<bin>; the binaries are in target/<profile>.
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe.parent().expect("the executable's directory");
    let profile_dir = if dir.file_name().is_some_and(|name| name == "deps") {
        dir.parent().expect("target/<profile>/deps").to_owned()
    } else {
        dir.to_owned()
    };
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
