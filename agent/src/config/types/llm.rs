//! `proxy:` and `interceptor:`: the LLM interceptor proxy, its upstreams, and what it does
//! with a response it cannot parse.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// `proxy:` — the LLM interceptor proxy.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProxyConfig {
    /// What the proxy does.
    #[serde(default)]
    pub mode: ProxyMode,
    /// Where agents send their LLM API traffic.
    #[serde(default = "default_proxy_listen")]
    pub listen: SocketAddr,
    /// Upstream base URLs.
    #[serde(default)]
    pub providers: ProvidersConfig,
    /// Provider routes relayed uninspected (and recorded): every other route no dialect reads
    /// is refused.
    #[serde(default)]
    pub pass_through: Vec<crate::config::PassThroughEntry>,

    // Bounds that keep one client from stalling or bloating the proxy for the others.
    /// Most connections one client (a user and cgroup) may have open at once.
    #[serde(default = "default_max_connections_per_client")]
    pub max_connections_per_client: u64,
    /// Most bytes held across all exchanges at once (request bodies being read, response
    /// bodies read whole, what stream interceptors hold back).
    #[serde(default = "default_memory_budget")]
    pub memory_budget_bytes: u64,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            mode: ProxyMode::Embedded,
            listen: default_proxy_listen(),
            providers: ProvidersConfig::default(),
            pass_through: Vec::new(),
            max_connections_per_client: default_max_connections_per_client(),
            memory_budget_bytes: default_memory_budget(),
        }
    }
}

fn default_max_connections_per_client() -> u64 {
    512
}

fn default_memory_budget() -> u64 {
    256 * 1024 * 1024
}

/// `proxy.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ProxyMode {
    /// The daemon runs the proxy and enforces MCP policy in it.
    #[default]
    Embedded,
    /// The proxy only captures and enforces MCP tool calls (the seed's mode without DLP).
    McpOnly,
    /// No LLM proxy: the shim, filter proxy and kernel layers still run.
    Disabled,
}

impl ProxyMode {
    /// The YAML spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Embedded => "embedded",
            ProxyMode::McpOnly => "mcp-only",
            ProxyMode::Disabled => "disabled",
        }
    }
}

/// `proxy.providers:`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProvidersConfig {
    /// Anthropic API base URL.
    #[serde(default = "default_anthropic")]
    pub anthropic: String,
    /// OpenAI API base URL.
    #[serde(default = "default_openai")]
    pub openai: String,
    /// Gemini API base URL (the Gemini Developer API, as Gemini CLI and the `google-genai`
    /// SDKs call it).
    #[serde(default = "default_gemini")]
    pub gemini: String,
}

impl Default for ProvidersConfig {
    fn default() -> Self {
        ProvidersConfig {
            anthropic: default_anthropic(),
            openai: default_openai(),
            gemini: default_gemini(),
        }
    }
}

/// `interceptor:`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InterceptorConfig {
    /// What an LLM response the interceptor cannot parse does.
    #[serde(default)]
    pub on_malformed: OnMalformed,
    /// Most bytes of one streamed tool call held back while it is being decided.
    #[serde(default = "default_max_stream_buffer")]
    pub max_stream_buffer_bytes: u64,
}

impl Default for InterceptorConfig {
    fn default() -> Self {
        InterceptorConfig {
            on_malformed: OnMalformed::FailClosed,
            max_stream_buffer_bytes: default_max_stream_buffer(),
        }
    }
}

/// `interceptor.on_malformed`: what the LLM layer does with an event or body it cannot parse.
///
/// Such an event is as unreadable to the agent's SDK as to us, so the only risk of passing it is
/// a parser differential (something our strict parser rejects but a lenient client accepts, e.g.
/// a trailing comma or `NaN`): `FailOpen` accepts that risk for availability; `FailClosed` ends
/// the stream (or refuses the body) instead, at the cost of breaking a turn on a provider bug.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMalformed {
    /// Pass malformed events through unchanged (logged). Valid JSON our strict reading refuses
    /// (a repeated key, a wrong type) that mentions a tool still ends the stream.
    FailOpen,
    /// End the stream cleanly when a malformed event mentions a tool; events that cannot be
    /// about a tool (no tool key at all) still pass. The default.
    #[default]
    FailClosed,
}

impl OnMalformed {
    /// The YAML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OnMalformed::FailOpen => "fail_open",
            OnMalformed::FailClosed => "fail_closed",
        }
    }
}

fn default_proxy_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 18080))
}

fn default_anthropic() -> String {
    "https://api.anthropic.com".to_string()
}

fn default_openai() -> String {
    "https://api.openai.com".to_string()
}

fn default_gemini() -> String {
    "https://generativelanguage.googleapis.com".to_string()
}

fn default_max_stream_buffer() -> u64 {
    8 * 1024 * 1024
}
