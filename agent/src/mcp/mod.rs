//! Layer 2: the MCP stdio shim and the MCP tool-filter proxy, and the MCP client the daemon
//! uses to discover network servers' tools.
//!
//! [`filter`] is sans-IO (bytes in, bytes out) over [`framing`] and [`sse`]; [`shim`],
//! [`proxy`] and [`client`] are the I/O around it; [`fuzzing`] is the oracle the randomised
//! tests and the `cargo fuzz` target (`agent/fuzz`) check it with.
//!
//! # Using them
//!
//! A stdio server behind the shim, in Claude Code's `.mcp.json` or Cursor's
//! `~/.cursor/mcp.json` (both use `mcpServers`):
//!
//! ```json
//! { "mcpServers": { "everything": {
//!     "command": "toolwall",
//!     "args": ["shim", "--server-id", "everything", "--deny", "^echo$",
//!              "--", "npx", "-y", "@modelcontextprotocol/server-everything"] } } }
//! ```
//!
//! or `claude mcp add everything -- toolwall shim --deny '^echo$' -- npx -y
//! @modelcontextprotocol/server-everything`.
//!
//! A network server behind the filter proxy:
//!
//! ```text
//! toolwall mcp-proxy --upstream http://127.0.0.1:3001/mcp --deny '^delete_,^drop_' --listen 127.0.0.1:8090
//! claude mcp add --transport http everything http://127.0.0.1:8090/mcp
//! claude mcp add --transport sse everything http://127.0.0.1:8090/sse
//! ```
//!
//! and in Cursor `{ "mcpServers": { "everything": { "url": "http://127.0.0.1:8090/mcp" } } }`.
//! Or let the agent spawn it: `"command": "toolwall", "args": ["mcp-proxy", "--stdio",
//! "--upstream", "http://127.0.0.1:3001/mcp", "--deny", "^echo$"]`.
//!
//! `--deny` patterns are regular expressions searched in the tool name (anchor them for exact
//! names); a value may hold several, separated by commas outside `{}`/`[]`/`()`. The regex
//! engine runs in linear time, so no pattern can backtrack catastrophically; patterns that
//! compile to more than 1 MiB are refused at start-up.

pub mod client;
pub mod deny;
pub mod filter;
pub mod framing;
pub mod fuzzing;
pub mod proxy;
pub mod shim;
pub mod sse;

use crate::events::EventSink;

/// An event sink for the stand-alone commands until they write to the event store: events are
/// logged (as JSON, at `info` on the `toolwall::events` target) instead of dropped. Must be
/// called inside a Tokio runtime.
pub fn log_events() -> EventSink {
    let (sink, mut rx) = EventSink::channel();
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            match serde_json::to_string(&event) {
                Ok(json) => tracing::info!(target: "toolwall::events", "{json}"),
                Err(error) => tracing::warn!(%error, "cannot serialise an event"),
            }
        }
    });
    sink
}
