//! Cargo tools the checks run, installed from crates.io into `target/tools` (never into the
//! user's cargo home), pinned, and called by path so whatever is (or is not) on PATH does not
//! matter.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::step::{self, timed};

/// The cargo-nextest the tests run with, and the oldest one found on PATH that is used instead
/// of installing (its `rust-version` is 1.91; this toolchain is 1.95).
const NEXTEST_VERSION: &str = "0.9.143";

/// A cargo-nextest to call by path: `target/tools/bin/cargo-nextest` when xtask installed it,
/// else one on PATH at least as new as the pin, else the pin installed into `target/tools`
/// (measured: 13 min of CPU, 20 min on a busy two-core machine; so an existing one is used).
pub fn nextest() -> anyhow::Result<PathBuf> {
    let root = step::target_dir().join("tools");
    let bin = root.join("bin/cargo-nextest");
    if version(&bin).as_deref() == Some(NEXTEST_VERSION) {
        return Ok(bin);
    }
    if let Some(found) = on_path("cargo-nextest")
        && version(&found).is_some_and(|v| at_least(&v, NEXTEST_VERSION))
    {
        return Ok(found);
    }
    timed(
        &format!(
            "cargo install cargo-nextest {NEXTEST_VERSION} into {} (none on PATH; once, 7 to 20 min on two cores)",
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
    if version(&bin).as_deref() != Some(NEXTEST_VERSION) {
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

/// The version `bin --version` reports (`cargo-nextest 0.9.143 (...)`), when it runs.
fn version(bin: &Path) -> Option<String> {
    let out = Command::new(bin).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().nth(1).map(str::to_owned)
}

/// Whether dotted version `have` is `want` or later (numerically, part by part).
fn at_least(have: &str, want: &str) -> bool {
    let parts = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parts(have) >= parts(want)
}

/// The first file called `name` in a PATH directory.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::at_least;

    #[test]
    fn versions_compare_part_by_part_as_numbers() {
        assert!(at_least("0.9.143", "0.9.143"));
        assert!(at_least("0.9.151", "0.9.143"));
        assert!(at_least("0.10.0", "0.9.143"));
        assert!(!at_least("0.9.99", "0.9.143"));
        assert!(!at_least("0.9", "0.9.143"));
    }
}
