//! Cargo tools the checks run, installed from crates.io into `target/tools` (never into the
//! user's cargo home), pinned, and called by path so whatever is (or is not) on PATH does not
//! matter.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::step::{self, timed};

/// The cargo-nextest the tests run with (its `rust-version` is 1.91; this toolchain is 1.95).
const NEXTEST_VERSION: &str = "0.9.143";

/// `target/tools/bin/cargo-nextest`, installed first when missing or not the pinned version.
pub fn nextest() -> anyhow::Result<PathBuf> {
    let root = step::target_dir().join("tools");
    let bin = root.join("bin/cargo-nextest");
    if reports_version(&bin, NEXTEST_VERSION) {
        return Ok(bin);
    }
    timed(
        &format!(
            "cargo install cargo-nextest {NEXTEST_VERSION} into {} (once; a few minutes on two cores)",
            root.display()
        ),
        || {
            step::run(
                Command::new(step::cargo_bin())
                    .args(["install", "cargo-nextest", "--locked", "--force"])
                    .args(["--version", NEXTEST_VERSION])
                    // Without `self-update`, which would build an HTTP client and an
                    // archive reader that a pinned copy never uses.
                    .args(["--no-default-features", "--features", "default-no-update"])
                    .arg("--root")
                    .arg(&root)
                    // A temporary build directory of its own, removed afterwards, rather
                    // than the workspace's target (its dependencies' features differ).
                    .env_remove("CARGO_TARGET_DIR"),
            )
        },
    )?;
    if !reports_version(&bin, NEXTEST_VERSION) {
        anyhow::bail!(
            "{} does not report version {NEXTEST_VERSION} after installing it",
            bin.display()
        );
    }
    Ok(bin)
}

/// `cargo-nextest nextest ARGS`: the binary called the way cargo calls a subcommand, with the
/// cargo that runs xtask (nextest reads `CARGO`, which `cargo run` sets for xtask).
pub fn nextest_command(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("nextest");
    cmd
}

/// Whether `bin --version` runs and names `version`.
fn reports_version(bin: &Path, version: &str) -> bool {
    Command::new(bin).arg("--version").output().is_ok_and(|o| {
        o.status.success()
            && String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .any(|word| word == version)
    })
}
