//! `cargo xtask`: the project's developer tasks, so the README's commands are the whole set-up.
//!
//! - `setup`      install the eBPF toolchain (Debian packages + bpf-linker), only what is missing
//! - `peers`      install the real test peers (Python SDKs in a venv, reference MCP servers)
//! - `build-ebpf` build the kernel programs and say where the object is
//! - `run`        setup, build the release profile, and start `toolwall run` in the foreground
//!   (embedded default)
//! - `test`       setup, peers, and every check: fmt, clippy, unit, end-to-end, privileged
//! - `bench`      build release, install peers, and run the benchmarks, as ratios against a
//!   baseline measured in the same run
//! - `fuzz`       run the `cargo fuzz` targets of `agent/fuzz` (nightly), each for a fixed time

mod fuzz;
mod package;
mod peers;
mod setup;
mod step;
mod test;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "toolwall's developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the eBPF build needs (idempotent; Debian 12, root).
    Setup,
    /// Install the real peers the end-to-end tests drive, under target/peers.
    Peers,
    /// Build the eBPF programs (through agent/build.rs) and report the object.
    BuildEbpf,
    /// Set up, build (release) and run the daemon in the foreground; extra args go to
    /// `toolwall run`.
    Run {
        /// Arguments for `toolwall run`, e.g. `-- --config my.yaml`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build the release `.deb` (binary, systemd unit, default config) under target/package.
    Package,
    /// Set up and run every check (what CI runs).
    Test,
    /// Build the release binary, install the peers, and run the benchmarks.
    Bench {
        /// Only these groups: connect, store, correlate, export, policy (policy-results: its result inspection
        /// alone), interceptor, llm-throughput, llm-latency, mcp-latency.
        groups: Vec<String>,
    },
    /// Run the fuzz targets (cargo-fuzz, nightly), each for a fixed time.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u32,
        /// One target (default: all of them).
        target: Option<String>,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::Setup => setup::setup(),
        Task::Peers => peers::install(),
        Task::BuildEbpf => setup::build_ebpf(),
        Task::Run { args } => run(&args),
        Task::Package => package::package().map(drop),
        Task::Test => test::test(),
        Task::Bench { groups } => test::bench(&groups),
        Task::Fuzz { seconds, target } => fuzz::fuzz(seconds, target.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask run`: the daemon replaces this process, so Ctrl-C and SIGTERM reach it directly.
/// It is the release build (a user's first proxy must not be an unoptimised one).
fn run(args: &[String]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    setup::setup_if_possible()?;
    step::cargo(&["build", "--release", "-p", "agent"])?;
    let bin = step::target_dir().join("release/toolwall");
    eprintln!("xtask: starting {} run {}", bin.display(), args.join(" "));
    let error = std::process::Command::new(&bin)
        .arg("run")
        .args(args)
        .exec();
    Err(anyhow::anyhow!("exec {}: {error}", bin.display()))
}
