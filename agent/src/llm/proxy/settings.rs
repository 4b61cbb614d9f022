//! How the proxy is set up (`proxy.*` and `interceptor.*` in the configuration).

use std::net::SocketAddr;
use std::sync::Arc;

use super::SessionKeys;
use crate::config::{OnMalformed, PassThrough};

/// How the proxy is set up (`proxy.*` in the config).
#[derive(Clone, Debug)]
pub struct LlmProxySettings {
    /// Where to listen (loopback: the agent on this host is the only client).
    pub listen: SocketAddr,
    /// Anthropic base URL, e.g. `https://api.anthropic.com` (no `/v1`).
    pub anthropic_upstream: String,
    /// OpenAI base URL, e.g. `https://api.openai.com` (no `/v1`).
    pub openai_upstream: String,
    /// Gemini API base URL, e.g. `https://generativelanguage.googleapis.com` (no `/v1beta`).
    pub gemini_upstream: String,
    /// What a malformed event or body does.
    pub on_malformed: OnMalformed,
    /// Most bytes held for one response's incomplete event, held-back call, or whole buffered
    /// body; past it the response is ended (streams) or refused (bodies): fail closed.
    pub max_stream_buffer: usize,
    /// The agent session the events of requests without a `/s/<key>` prefix belong to.
    pub session_id: String,
    /// The keys of open sessions (`/s/<key>`), issued by the daemon as it opens each.
    pub session_keys: Arc<SessionKeys>,
    /// How long a client may take to send a request head (each request on a kept-alive
    /// connection too): a client that never finishes one must not hold a descriptor for ever.
    pub header_read_timeout: std::time::Duration,
    /// Routes relayed uninspected (`proxy.pass_through`); every route no dialect reads and
    /// not listed here is refused (`llm/routes.rs`).
    pub pass_through: Vec<PassThrough>,
    /// Most client connections one client (a user and cgroup, `proxy/clients.rs`) may have
    /// open at once: one client must not take the global cap from the others.
    pub max_connections_per_client: usize,
    /// Most bytes held across all exchanges at once (`proxy/budget.rs`): request bodies being
    /// read, response bodies read whole, what stream interceptors hold back.
    pub memory_budget: usize,
}

impl Default for LlmProxySettings {
    fn default() -> Self {
        LlmProxySettings {
            listen: SocketAddr::from(([127, 0, 0, 1], 18080)),
            anthropic_upstream: "https://api.anthropic.com".into(),
            openai_upstream: "https://api.openai.com".into(),
            gemini_upstream: "https://generativelanguage.googleapis.com".into(),
            on_malformed: OnMalformed::FailClosed,
            // The configuration's default, whoever builds the settings.
            max_stream_buffer: usize::try_from(
                crate::config::InterceptorConfig::default().max_stream_buffer_bytes,
            )
            .unwrap_or(usize::MAX),
            session_id: String::new(),
            session_keys: Arc::default(),
            header_read_timeout: std::time::Duration::from_secs(30),
            pass_through: Vec::new(),
            max_connections_per_client: usize::try_from(
                crate::config::ProxyConfig::default().max_connections_per_client,
            )
            .unwrap_or(usize::MAX),
            memory_budget: usize::try_from(
                crate::config::ProxyConfig::default().memory_budget_bytes,
            )
            .unwrap_or(usize::MAX),
        }
    }
}
