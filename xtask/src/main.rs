//! `cargo xtask`: the project's developer tasks, so the README's commands are the whole set-up.
//!
//! - `setup`      install the eBPF toolchain (Debian packages + bpf-linker), only what is missing
//! - `peers`      install the real test peers (Python SDKs in a venv, reference MCP servers)
//! - `build-ebpf` build the kernel programs and say where the object is
//! - `run`        setup, build the release profile, and start `toolwall run` in the foreground
//!   (embedded default)
//! - `demo`       the same release build, then `toolwall demo`
//! - `install`    the same release build, copied to a directory on PATH
//! - `test`       setup, peers, and every check: fmt, clippy, unit, end-to-end, privileged
//! - `bench`      build release, install peers, and run the benchmarks, as ratios against a
//!   baseline measured in the same run
//! - `soak`       every layer under load for N minutes, the daemon killed halfway, every call
//!   accounted for (root; `test` runs it for two minutes)
//! - `fuzz`       run the `cargo fuzz` targets of `agent/fuzz` (nightly), each for a fixed time

mod fuzz;
mod node;
mod package;
mod peers;
mod release;
mod setup;
mod step;
mod test;
mod tools;

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
    /// Build the release binary (like `run`) and start `toolwall demo`; extra args go to it.
    Demo {
        /// Arguments for `toolwall demo`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build the release binary and install `toolwall` on PATH (/usr/local/bin as root, else
    /// ~/.local/bin or ~/.cargo/bin, whichever is on PATH).
    Install,
    /// Build the release `.deb` (binary, systemd unit, default config) under target/package.
    Package,
    /// Set up and run every check (what CI runs).
    Test,
    /// Build the release binary, install the peers, and run the benchmarks.
    Bench {
        /// Only these groups: connect, store, correlate, export, policy (policy-results: its result inspection
        /// alone), interceptor, llm-throughput, llm-latency, mcp-latency, views.
        groups: Vec<String>,
    },
    /// Run the soak test: three clients through every layer for N minutes, the daemon killed
    /// (`kill -9`) halfway, then every call they made accounted for in the record (root).
    Soak {
        /// How long the clients run.
        #[arg(long, default_value_t = 10.0)]
        minutes: f64,
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
        Task::Run { args } => release::run(&args),
        Task::Demo { args } => release::demo(&args),
        Task::Install => release::install(),
        Task::Package => package::package().map(drop),
        Task::Test => test::test(),
        Task::Bench { groups } => test::bench(&groups),
        Task::Soak { minutes } => test::soak(minutes),
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
