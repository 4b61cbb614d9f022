//! The command line: one binary, one subcommand per job.
//!
//! Each subcommand's arguments are a `clap::Args` struct owned by the module that does the
//! work; this file only names the subcommands and dispatches, so adding one is two lines.

mod approve;
mod config;
mod policy;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// toolwall: decide which MCP tools AI agents may call, enforce it before they run, and record
/// every call — at the LLM API, at the MCP server, and in the kernel.
#[derive(Debug, Parser)]
#[command(name = "toolwall", version, about, long_about = None)]
pub struct Cli {
    /// Log filter, e.g. `info`, `debug`, `toolwall=trace` (also from RUST_LOG).
    #[arg(long, global = true, env = "TOOLWALL_LOG", default_value = "info")]
    pub log: String,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: LLM interceptor, kernel monitor, event store, correlator and local API.
    Run(crate::daemon::RunArgs),
    /// Validate a configuration file, or print the embedded default.
    Config(config::ConfigArgs),
    /// Run an agent inside a watched session (its own cgroup, LLM traffic through the proxy).
    Exec(crate::exec::ExecArgs),
    /// Show what the layers recorded: correlated calls, events, registered tools and servers.
    Mcp(crate::views::McpArgs),
    /// Run a stdio MCP server behind the tool filter: `toolwall shim [--deny REGEX]... -- CMD ARGS...`.
    Shim(crate::mcp::shim::ShimArgs),
    /// Serve a network MCP server with denied tools removed (`mcp/proxy/`).
    McpProxy(crate::mcp::proxy::ProxyArgs),
    /// List the calls waiting for a person to approve or deny them (argument rules with `action: ask`).
    Approvals(approve::ListArgs),
    /// Let a waiting call run: `toolwall approve ID [--digest D]` (the question waiting under
    /// ID, or only if its digest is D).
    Approve(approve::AnswerArgs),
    /// Refuse a waiting call: `toolwall deny ID [--digest D] [--reason TEXT]`.
    Deny(approve::AnswerArgs),
    /// Publish one policy to many hosts: `toolwall policy keygen|sign|verify` (signed bundles).
    Policy(policy::PolicyArgs),
    /// See toolwall block a denied tool at each layer, offline, in about a minute: a daemon,
    /// a fake model, an MCP server and a scripted agent, all temporary.
    Demo(crate::demo::DemoArgs),
}

/// Runs the parsed command line and turns its outcome into the process exit code.
pub fn main(cli: Cli) -> ExitCode {
    init_tracing(&cli.log);
    let result = match cli.command {
        Command::Exec(args) => crate::exec::run(args),
        Command::Mcp(args) => crate::views::run(args),
        Command::Run(args) => crate::daemon::run(args),
        Command::Config(args) => config::run(args),
        Command::Shim(args) => crate::mcp::shim::run(args),
        Command::McpProxy(args) => crate::mcp::proxy::run(args),
        Command::Approvals(args) => approve::list(args),
        Command::Approve(args) => approve::answer(args, true),
        Command::Deny(args) => approve::answer(args, false),
        Command::Policy(args) => policy::run(args),
        Command::Demo(args) => crate::demo::run(args),
    };
    match result {
        Ok(code) => code,
        // A reader that went away (`toolwall mcp events --json | head`) is not an error.
        Err(error)
            if error.chain().any(|e| {
                e.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(error) => {
            // `{:#}` prints the whole context chain: what failed, then why.
            eprintln!("toolwall: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr, so stdout stays clean for commands whose output is data (`--json`, the
/// shim's JSON-RPC). Colour codes only when stderr is a terminal: a daemon's log file or
/// journal gets plain text.
fn init_tracing(filter: &str) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
