//! `cargo xtask test` (every check, what CI runs) and `cargo xtask bench`.

use std::{path::Path, process::Command};

use crate::{
    peers, setup,
    step::{self, timed},
    tools,
};

/// Environment the end-to-end tests read (see `tests/src/lib.rs`).
fn e2e_env(cmd: &mut Command) -> &mut Command {
    let target = step::target_dir();
    cmd.env("TOOLWALL_BIN", target.join("debug/toolwall"))
        .env("TOOLWALL_PEERS_DIR", target.join("peers"))
}

/// Every check, in order of cost; stops at the first failure.
pub fn test() -> anyhow::Result<()> {
    setup::setup_if_possible()?;
    peers::install()?;
    let nextest = tools::nextest()?;
    eprintln!("xtask: the tests run with {}", nextest.display());
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
    privileged(&nextest)
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
    timed("privileged tests (root: real cgroups, real eBPF)", || {
        step::run(e2e_env(
            tools::nextest_command(nextest)
                .env("TOOLWALL_DEB", &deb)
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
                ]),
        ))
    })
}

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
