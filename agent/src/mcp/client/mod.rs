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

pub(crate) use discovery::{Discovered, discover};
pub(crate) use error::{McpClientError, is_challenge};
pub(crate) use session::UpstreamSession;
pub(crate) use transport::{
    CONNECT_TIMEOUT, Connector, HttpClient, SESSION_HEADER, Transport, connector, http_client,
};

#[cfg(test)]
mod tests;
