//! A message-level MCP client over the two HTTP transports, for the filter proxy's upstream
//! sessions and the daemon's start-up discovery.
//!
//! An [`UpstreamSession`] sends JSON-RPC messages with [`UpstreamSession::send`] and delivers
//! everything the server sends (responses, its own requests and notifications) on one
//! channel, whatever the transport: Streamable HTTP (POST answered with JSON or an SSE
//! stream, plus the optional GET stream) or legacy HTTP+SSE (one GET stream whose first event
//! names the URL to POST to).
//!
//! The files go one way: [`discover`] (`discovery.rs`, including the 2026-07-28 stateless
//! revision) over [`UpstreamSession`] (`session.rs`) over the HTTP plumbing (`transport.rs`),
//! all sharing [`McpClientError`] (`error.rs`).

mod discovery;
mod error;
mod session;
mod transport;

pub use discovery::{Discovered, discover, discover_tools, list_all_tools};
pub use error::McpClientError;
pub use session::{Inbox, PROTOCOL_VERSION, UpstreamSession, call, connect_and_initialize};
pub use transport::{
    CONNECT_TIMEOUT, Connector, HttpClient, PROTOCOL_VERSION_HEADER, SESSION_HEADER, Transport,
    connector, http_client, resolve_endpoint,
};

#[cfg(test)]
mod tests;
