//! `toolwall shim` inside a session: a pipe to a stdio server the daemon runs (issue 15.7).
//!
//! A shim runs as the agent, inside the agent's session, so whatever it records the agent
//! could forge. Inside a session it therefore judges and records nothing: it asks the daemon
//! (its Unix socket, `POST /api/stdio` upgraded to a raw byte stream) to start the server, and
//! moves bytes between its stdin/stdout and that stream. The daemon starts the server outside
//! the session and filters and records the JSON-RPC itself (`daemon/stdio.rs`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

/// The protocol name of the upgraded stream.
pub(crate) const UPGRADE_PROTOCOL: &str = "toolwall-stdio";
/// The route a shim asks on.
pub(crate) const ROUTE: &str = "/api/stdio";
/// Most bytes of a [`RunRequest`] (its environment included).
pub(crate) const MAX_REQUEST_BYTES: usize = 1 << 20;

/// What a shim asks the daemon to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunRequest {
    /// The server id (`--server-id`, or derived from the command).
    pub server_id: String,
    /// The command the shim was given (a declared server's own command is run instead).
    pub command: Vec<String>,
    /// The shim's environment: the agent's MCP configuration sets the server's there.
    pub env: Vec<(String, String)>,
    /// The shim's working directory.
    pub cwd: PathBuf,
    /// The shim's `--deny` patterns, judged on top of the daemon's policy.
    pub deny: Vec<String>,
    /// The shim's `--max-message-bytes`.
    pub max_message_bytes: usize,
}

/// Asks the daemon on `socket` to run the server and relays stdin/stdout to it until the
/// server's side ends. Exit 0 then; an error when the daemon refuses or cannot be reached.
pub(crate) async fn run(socket: &Path, request: &RunRequest) -> anyhow::Result<ExitCode> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| crate::client::no_daemon_hint(socket))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP handshake with the daemon")?;
    tokio::spawn(async move {
        if let Err(error) = conn.with_upgrades().await {
            tracing::debug!(%error, "relay connection to the daemon ended");
        }
    });
    let body = serde_json::to_vec(request).context("encoding the request to the daemon")?;
    let req = Request::builder()
        .method(Method::POST)
        .uri(ROUTE)
        .header(header::HOST, "toolwall")
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, UPGRADE_PROTOCOL)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .context("building the request to the daemon")?;
    let response = sender
        .send_request(req)
        .await
        .context("asking the daemon to start the MCP server")?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let why = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        anyhow::bail!(
            "the daemon did not start MCP server {:?} ({status}): {why}",
            request.server_id
        );
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .context("switching the daemon connection to the server's stream")?;
    let (mut from_daemon, mut to_daemon) = tokio::io::split(TokioIo::new(upgraded));
    // Stdin may block in read(2) on a thread of its own: it is never waited for.
    tokio::spawn(async move {
        let mut stdin = super::async_stdin();
        let _ = tokio::io::copy(&mut stdin, &mut to_daemon).await;
        // The client closed its stdin: the server sees EOF (the MCP shutdown sequence).
        let _ = to_daemon.shutdown().await;
    });
    let mut stdout = super::async_stdout();
    let copied = tokio::io::copy(&mut from_daemon, &mut stdout).await;
    let _ = stdout.flush().await;
    copied.context("relaying the server's output")?;
    Ok(ExitCode::SUCCESS)
}
