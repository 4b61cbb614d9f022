//! What can go wrong talking to an MCP server.

use std::time::Duration;

use http::StatusCode;

/// What went wrong talking to an MCP server; every message names the server and the step.
#[derive(Debug, thiserror::Error)]
pub(crate) enum McpClientError {
    /// The URL is not an `http://` URL we can use.
    #[error("MCP server {url}: bad URL: {reason}")]
    BadUrl {
        /// The server.
        url: String,
        /// Why.
        reason: String,
    },
    /// No connection, or it broke.
    #[error("MCP server {url}: {step}: {}: {reason}", if *sent { "the connection failed once the request was sent" } else { "cannot connect" })]
    Connect {
        /// The server.
        url: String,
        /// What we were doing.
        step: String,
        /// The transport's error chain.
        reason: String,
        /// Whether the request may have reached the server (the connection failed after it
        /// was written), so what it asked may have run.
        sent: bool,
    },
    /// An HTTP status that is not what the transport allows.
    #[error("MCP server {url}: {step}: HTTP {status}{}", if body.is_empty() { String::new() } else { format!(": {body}") })]
    Status {
        /// The server.
        url: String,
        /// What we were doing.
        step: String,
        /// The status.
        status: StatusCode,
        /// The start of the body, for the reader.
        body: String,
    },
    /// The server asks for credentials (401, or 403 with a challenge): it is protected, and
    /// its challenge says where a client gets them.
    #[error("MCP server {url}: {step}: HTTP {status}: the server asks for authorization{}", challenge.as_deref().map(|c| format!(" ({c})")).unwrap_or_default())]
    Unauthorized {
        /// The server.
        url: String,
        /// What we were doing.
        step: String,
        /// 401 or 403.
        status: StatusCode,
        /// Its `WWW-Authenticate` challenge, when it gave one.
        challenge: Option<String>,
    },
    /// Nothing arrived in time.
    #[error("MCP server {url}: {step}: timed out after {timeout:?}")]
    Timeout {
        /// The server.
        url: String,
        /// What we were doing.
        step: String,
        /// The limit.
        timeout: Duration,
    },
    /// The server broke the protocol or answered a request with an error.
    #[error("MCP server {url}: {step}: {message}")]
    Protocol {
        /// The server.
        url: String,
        /// What we were doing.
        step: String,
        /// What was wrong.
        message: String,
    },
    /// No usable TLS set-up (no system trust store, no TLS versions in common).
    #[error("TLS set-up for MCP servers failed: {0}")]
    Tls(String),
    /// The server's stream ended.
    #[error("MCP server {url}: connection lost: {reason}")]
    Closed {
        /// The server.
        url: String,
        /// How.
        reason: String,
    },
}

impl McpClientError {
    /// The error for a refused request: [`McpClientError::Unauthorized`] for a challenge,
    /// else [`McpClientError::Status`] with the start of its body.
    pub(crate) async fn refused(
        url: String,
        step: String,
        response: http::Response<hyper::body::Incoming>,
    ) -> Self {
        let status = response.status();
        let challenge = response
            .headers()
            .get(http::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if is_challenge(status, response.headers()) {
            return McpClientError::Unauthorized {
                url,
                step,
                status,
                challenge,
            };
        }
        McpClientError::Status {
            url,
            step,
            status,
            body: super::transport::error_body(response).await,
        }
    }

    /// Whether a request that failed so may still have run on the server: it was sent and no
    /// answer came (the connection failed after it was written, the time ran out), or the
    /// answer was a server error (5xx: a gateway in front may have passed it on, a handler
    /// may have failed after its work). A refusal (4xx) or no connection ran nothing.
    pub(crate) fn may_have_run(&self) -> bool {
        match self {
            McpClientError::Connect { sent, .. } => *sent,
            McpClientError::Timeout { .. } => true,
            McpClientError::Status { status, .. } => status.is_server_error(),
            _ => false,
        }
    }

    /// Whether this is an HTTP 4xx (how `auto` recognises a legacy SSE server).
    pub(crate) fn is_client_error_status(&self) -> bool {
        matches!(self, McpClientError::Status { status, .. } if status.is_client_error())
    }
}

/// Whether a refusal asks for credentials: 401, or 403 with a challenge (insufficient scope).
pub(crate) fn is_challenge(status: StatusCode, headers: &http::HeaderMap) -> bool {
    status == StatusCode::UNAUTHORIZED
        || (status == StatusCode::FORBIDDEN && headers.contains_key(http::header::WWW_AUTHENTICATE))
}
