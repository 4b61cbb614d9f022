//! `toolwall demo`: toolwall doing its job in about a minute, offline, with no API key.
//!
//! The stage ([`stage`]) starts a daemon with its own temporary store, socket and ports, a fake
//! model ([`model`]) that always asks for an allowed and a denied tool, a built-in MCP server
//! ([`server`]) with those two tools, and a listener standing in for a network MCP server the
//! policy denies. A scripted agent ([`agent`]) then runs under `toolwall exec` and tries the
//! denied tool through each layer: as the model's call (LLM proxy), as a direct `tools/call`
//! through `toolwall shim` (MCP layer), and by connecting straight to the denied server (kernel
//! layer). The stage prints each layer's verdict and the joined record, checks that each
//! verdict is the one the policy asks for (exit 1 otherwise), and removes everything it made.
//!
//! The server and the agent are hidden subcommands of the same binary, so the demo needs
//! nothing but `toolwall` itself. `tests/tests/demo.rs` runs it through the real binary.

mod agent;
mod daemon;
mod leftovers;
mod model;
mod server;
mod stage;
mod verdicts;

use std::process::ExitCode;

/// The MCP server's id in the demo's configuration.
const SERVER_ID: &str = "demo";
/// The tool the policy allows.
const ALLOWED_TOOL: &str = "echo";
/// The tool the policy denies.
const DENIED_TOOL: &str = "delete_files";
/// The denied network server's id.
const NET_SERVER_ID: &str = "files-net";

/// Arguments of `toolwall demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Clean up as soon as the demo has shown its record, instead of waiting for Enter (the
    /// wait happens only when standard input and output are a terminal).
    #[arg(long)]
    pub no_wait: bool,
    /// The demo's parts, run by the demo itself.
    #[command(subcommand)]
    pub part: Option<Part>,
}

/// The demo's own actors (hidden: the stage starts them).
#[derive(Debug, clap::Subcommand)]
pub enum Part {
    /// The built-in MCP server (stdio): `echo` and `delete_files`.
    #[command(hide = true)]
    McpServer,
    /// The scripted agent, run under `toolwall exec`.
    #[command(hide = true)]
    Agent(agent::AgentArgs),
}

/// Runs the demo, or one of its parts.
pub(crate) fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    match args.part {
        Some(Part::McpServer) => server::run(),
        Some(Part::Agent(agent)) => agent::run(agent),
        None => stage::run(args.no_wait),
    }
}

/// The name under which agents in the demo see an MCP tool (Claude Code's form).
fn mcp_name(tool: &str) -> String {
    format!("mcp__{SERVER_ID}__{tool}")
}
