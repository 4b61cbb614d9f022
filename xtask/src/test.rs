//! `cargo xtask test` (every check, what CI runs) and `cargo xtask bench`.

use std::{path::Path, process::Command};

use anyhow::Context;

use crate::{
    peers, setup,
    step::{self, timed},
    tools,
};

/// Environment the end-to-end tests read (see `tests/src/lib.rs`).
fn e2e_env(cmd: &mut Command) -> &mut Command {
    let target = step::target_dir();
    cmd.env("TOOLWALL_BIN", target.join("debug/toolwall"))
        .env("TOOLWALL_PEERS_DIR", target.join("peers"));
    if step::is_root() {
        cmd.env("TMPDIR", TESTS_TMP);
    }
    cmd
}

/// Every check, in order of cost; stops at the first failure.
pub fn test() -> anyhow::Result<()> {
    setup::setup_if_possible()?;
    peers::install()?;
    let nextest = tools::nextest()?;
    eprintln!("xtask: the tests run with {}", nextest.display());
    if step::is_root() {
        tests_tmp()?;
    }
    timed("cargo fmt --check", || {
        step::cargo(&["fmt", "--all", "--check"])?;
        step::cargo(&["fmt", "--manifest-path", "agent-ebpf/Cargo.toml", "--check"])
    })?;
    // Twice: what ships (no harness code, whose use could hide dead code) and everything.
    timed(
        "cargo clippy --workspace --all-targets [--all-features] -- -D warnings",
        || {
            for features in [None, Some("--all-features")] {
                let mut args = vec!["clippy", "--workspace", "--all-targets"];
                args.extend(features);
                args.extend(["--", "-D", "warnings"]);
                step::cargo(&args)?;
            }
            Ok(())
        },
    )?;
    timed("cargo build -p agent (the binary under test)", || {
        step::cargo(&["build", "-p", "agent"])
    })?;
    timed("unit and end-to-end tests", || {
        step::run(e2e_env(tools::nextest_command(&nextest).args([
            "run",
            "--workspace",
            "--all-features",
            "--no-fail-fast",
        ])))
    })?;
    privileged(&nextest)?;
    if step::is_root() {
        run_soak(&nextest, CI_SOAK_MINUTES)?;
    }
    Ok(())
}

/// How long `cargo xtask test` (CI) soaks.
const CI_SOAK_MINUTES: f64 = 2.0;

/// `cargo xtask soak --minutes N`: what `test` needs for it (root, the peers, the debug binary),
/// then the soak alone.
pub fn soak(minutes: f64) -> anyhow::Result<()> {
    anyhow::ensure!(
        step::is_root(),
        "the soak runs agents in sessions (cgroups, eBPF): run it as root"
    );
    anyhow::ensure!(
        minutes > 0.0 && minutes.is_finite(),
        "--minutes {minutes}: give a positive number of minutes"
    );
    setup::setup_if_possible()?;
    peers::install()?;
    let nextest = tools::nextest()?;
    tests_tmp()?;
    timed("cargo build -p agent (the binary under test)", || {
        step::cargo(&["build", "-p", "agent"])
    })?;
    run_soak(&nextest, minutes)
}

/// The soak test (`tests/tests/soak.rs`), which the privileged run leaves out.
fn run_soak(nextest: &Path, minutes: f64) -> anyhow::Result<()> {
    timed(&format!("soak ({minutes} minutes, one kill -9)"), || {
        step::run(e2e_env(
            tools::nextest_command(nextest)
                .env("TOOLWALL_SOAK_MINUTES", minutes.to_string())
                .args([
                    "run",
                    "--workspace",
                    "--all-features",
                    "--run-ignored",
                    "only",
                    "-E",
                    "binary(soak)",
                    "--success-output",
                    "immediate",
                ]),
        ))
    })
}

/// Tests marked `#[ignore = "privileged: ..."]` need root and a BPF-capable kernel. As root they
/// run with their output shown (the smoke test prints what it attached and read); otherwise
/// they are listed as skipped, with the reason, and never counted as passed.
fn privileged(nextest: &Path) -> anyhow::Result<()> {
    if !step::is_root() {
        eprintln!(
            "xtask: SKIPPED privileged tests (not root: they load eBPF programs and create cgroups):"
        );
        step::run(e2e_env(tools::nextest_command(nextest).args([
            "list",
            "--workspace",
            "--run-ignored",
            "only",
        ])))?;
        return Ok(());
    }
    // The package test installs and runs what `cargo xtask package` built.
    let deb = crate::package::package()?;
    let variant = variant()?;
    timed("privileged tests (root: real cgroups, real eBPF)", || {
        step::run(e2e_env(
            tools::nextest_command(nextest)
                .env("TOOLWALL_DEB", &deb)
                .env("TOOLWALL_VARIANT_BIN", &variant)
                .args([
                    "run",
                    "--workspace",
                    "--all-features",
                    "--run-ignored",
                    "only",
                    "--no-fail-fast",
                    "--success-output",
                    "immediate",
                    "--test-threads",
                    "1",
                    // Its own step, for as long as it is given.
                    "-E",
                    "not binary(soak)",
                ]),
        ))
    })
}

/// A toolwall whose eBPF object differs from this one's by a constant (`TOOLWALL_EBPF_VARIANT`,
/// agent/build.rs): the old daemon `tests/tests/session_upgrade.rs` upgrades from. Built in
/// the same target directory and copied aside; the test run rebuilds the binary under test.
fn variant() -> anyhow::Result<std::path::PathBuf> {
    let target = step::target_dir();
    let copy = target.join("variant/toolwall");
    timed(
        "cargo build -p agent with another eBPF object (the upgrade test's old build)",
        || {
            step::run(
                Command::new(step::cargo_bin())
                    .args(["build", "-p", "agent"])
                    .env("TOOLWALL_EBPF_VARIANT", "1"),
            )?;
            std::fs::create_dir_all(target.join("variant"))?;
            std::fs::copy(target.join("debug/toolwall"), &copy)
                .with_context(|| format!("copy the variant to {}", copy.display()))?;
            Ok(())
        },
    )?;
    Ok(copy)
}

/// Where the tests run as root keep their files: not under `/tmp`, which an agent under
/// `toolwall exec` sees as a private directory of its own, and open to the users the tests run
/// agents as. Emptied first, so that a run sees nothing of the one before.
fn tests_tmp() -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = Path::new(TESTS_TMP);
    if dir.exists() {
        unmount_under(dir)?;
        std::fs::remove_dir_all(dir).with_context(|| format!("empty {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777))
        .with_context(|| format!("chmod {}", dir.display()))
}

/// Detaches what a killed run left mounted under `dir` (a test's small tmpfs), deepest first:
/// emptying the directory would fail on it ("Device or resource busy") and stop every later run.
fn unmount_under(dir: &Path) -> anyhow::Result<()> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").context("read /proc/self/mounts")?;
    let inside = format!("{}/", dir.display());
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(1))
        .filter(|point| point.starts_with(&inside))
        .collect();
    points.sort_by_key(|point| std::cmp::Reverse(point.len()));
    for point in points {
        eprintln!("xtask: {point} is still mounted from an earlier run: detaching it");
        step::run(Command::new("umount").args(["--lazy", point]))?;
    }
    Ok(())
}

/// See [`tests_tmp`]; `tests/src/lib.rs` checks that tests run as root were given it.
const TESTS_TMP: &str = "/var/lib/toolwall-tests";

/// The benchmarks: each prints its baseline and its ratio to it, measured in the same run. The
/// MCP latency group drives the release binary and the real peers, so both come first.
pub fn bench(groups: &[String]) -> anyhow::Result<()> {
    setup::setup_if_possible()?;
    setup::bench_tools()?;
    peers::install()?;
    timed(
        "cargo build --release -p agent (the binary the MCP and relay benches drive)",
        || step::cargo(&["build", "--release", "-p", "agent"]),
    )?;
    let target = step::target_dir();
    timed("cargo bench -p agent", || {
        step::run(
            Command::new(step::cargo_bin())
                .args([
                    "bench",
                    "-p",
                    "agent",
                    "--features",
                    "bench",
                    "--bench",
                    "toolwall",
                    "--",
                ])
                .args(groups)
                .env("TOOLWALL_BIN", target.join("release/toolwall"))
                .env("TOOLWALL_PEERS_DIR", target.join("peers")),
        )
    })
}
