//! Layer 1: the LLM interceptor proxy.
//!
//! An agent points its SDK at [`proxy`] (`ANTHROPIC_BASE_URL` / `OPENAI_BASE_URL`); every model
//! response passes through a dialect interceptor that asks the [`Gate`] about each tool call the
//! model makes and replaces the blocked ones with a text explanation, so the agent never sees a
//! call it may not make, while the stream stays one its SDK accepts.
//!
//! The interceptors are sans-IO ([`StreamInterceptor::feed`] bytes in, bytes and [`Record`]s
//! out; [`rewrite_buffered`] for whole bodies), so tests and fuzzers drive them directly, at any
//! chunking; [`proxy`] is the HTTP shell around them.
//!
//! Trust assumptions (documented because they bound what "blocked" means):
//! - An event that holds no tool key (such as `"tool_calls"`) and no `\u` escape (behind which a
//!   key could hide) cannot carry a tool call: the [`keys`] pre-filters pass it unparsed, and
//!   while no call is open (nothing held, blocked or followed) whole runs of such events are
//!   forwarded after one scan of their bytes, unframed and uncopied. Model output can only appear
//!   inside JSON strings, where a `"` is always escaped, so it cannot forge a key; at worst it
//!   makes an event be parsed.
//! - Events are classified by their JSON `type` (what the SDKs dispatch on), not the SSE
//!   `event:` line.

mod anthropic;
mod asking;
mod backstop;
#[cfg(feature = "bench")]
pub(crate) mod bench;
mod buffered;
mod chat;
mod cx;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub(crate) mod fuzzing;
mod gemini;
mod interceptor;
pub(crate) mod json;
pub(crate) mod keys;
pub(crate) mod proxy;
mod relay;
pub(crate) use relay::RelayStats;
mod request;
mod responses;
pub(crate) mod routes;
mod upstream;

pub(crate) use crate::sse::{SseDecoder, SseEvent};
pub(crate) use buffered::rewrite_buffered;
pub(crate) use cx::{Cx, Record, push_capped};
pub(crate) use interceptor::{Flow, Machine, Output, StreamInterceptor};
pub(crate) use keys::Keys;
pub use proxy::{LlmProxy, LlmProxySettings};

/// Which API a response speaks; chosen from the request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    OpenAiChat,
    /// OpenAI Responses (`/v1/responses`), as used by Codex.
    OpenAiResponses,
    /// Gemini API (`models/{model}:generateContent`, `:streamGenerateContent`), as used by
    /// Gemini CLI.
    Gemini,
}

impl Dialect {
    /// The name stored in events.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Anthropic => "anthropic",
            Dialect::OpenAiChat => "openai-chat",
            Dialect::OpenAiResponses => "openai-responses",
            Dialect::Gemini => "gemini",
        }
    }

    /// The dialect whose responses must be inspected for a request path (query string allowed);
    /// `None` for every other path (passed through untouched). Matched on the path's end so a
    /// base URL with or without `/v1`, or with a deployment prefix (Azure's
    /// `/openai/deployments/{d}/chat/completions`), is still inspected.
    pub fn from_path(path_and_query: &str) -> Option<Dialect> {
        let path = path_and_query
            .split_once('?')
            .map_or(path_and_query, |(p, _)| p);
        let path = path.trim_end_matches('/');
        if path.ends_with("/v1/messages") || path == "/messages" {
            Some(Dialect::Anthropic)
        } else if path.ends_with("/chat/completions") || path.contains("/chat/completions/") {
            // Stored completions fetched again carry the same calls.
            Some(Dialect::OpenAiChat)
        } else if path.ends_with("/responses") || path.contains("/responses/") {
            Some(Dialect::OpenAiResponses)
        } else if path.ends_with(":generateContent") || path.ends_with(":streamGenerateContent") {
            Some(Dialect::Gemini)
        } else {
            None
        }
    }
}

/// What to do with an event whose JSON does not parse.
///
pub(crate) use crate::config::OnMalformed;

/// A condition under which the stream must end (fail closed), with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fatal(String);

impl Fatal {
    fn new(why: impl Into<String>) -> Self {
        Fatal(why.into())
    }
}

/// The text that replaces a blocked call.
pub(crate) fn blocked_message(name: &str, reason: &str) -> String {
    if reason.is_empty() {
        format!("[toolwall] Tool '{name}' blocked by policy")
    } else {
        format!("[toolwall] Tool '{name}' blocked by policy: {reason}")
    }
}

#[cfg(test)]
#[test]
fn dialect_by_path() {
    let cases = [
        ("/v1/messages?beta=true", Some(Dialect::Anthropic)),
        ("/v1/messages/count_tokens", None),
        ("/v1/chat/completions", Some(Dialect::OpenAiChat)),
        ("/chat/completions", Some(Dialect::OpenAiChat)),
        (
            "/openai/deployments/gpt/chat/completions?api-version=1",
            Some(Dialect::OpenAiChat),
        ),
        ("/v1/responses", Some(Dialect::OpenAiResponses)),
        ("/v1/responses/resp_1", Some(Dialect::OpenAiResponses)),
        ("/", None),
        ("/v1/models", None),
        (
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
            Some(Dialect::Gemini),
        ),
        ("/v1beta/models/gemini-2.5-pro:countTokens", None),
    ];
    for (path, want) in cases {
        assert_eq!(Dialect::from_path(path), want, "{path}");
    }
}

/// Strips leading JSON whitespace.
fn trim_ws(data: &[u8]) -> &[u8] {
    let start = data
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
        .unwrap_or(data.len());
    &data[start..]
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
