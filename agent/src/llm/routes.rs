//! Which requests the LLM proxy relays: an allowlist of routes per provider.
//!
//! A byte reaches the other side only if toolwall read it the way the receiver will, so a
//! request is relayed only on a route whose answer toolwall knows how to judge:
//! - the dialect routes (Messages, Chat Completions, Responses), each by method and whole
//!   path, whose responses the dialect machines read;
//! - routes that carry no tool call of their own (`GET /v1/models`, `count_tokens`,
//!   embeddings, conversations), whose responses are read whole and judged as one document
//!   by call shape (`backstop.rs`);
//! - the routes the host owner lists in `proxy.pass_through`, relayed uninspected and
//!   recorded.
//!
//! Everything else is refused with the route and the setting that would allow it: the
//! provider APIs that carry calls no dialect reads (Assistants, Managed Agents sessions,
//! Message Batches results, ChatKit, files) and paths of vendors toolwall has no provider for
//! (a Gemini request is never sent to another vendor with its key).

use hyper::{HeaderMap, Method};

use super::Dialect;
use super::request;
use crate::config::{PassThrough, Provider};

/// How a relayed route's response is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reading {
    /// By the dialect's machine (streams event by event, bodies whole).
    Dialect(Dialect),
    /// Whole, as one document judged by call shape: the route carries no call of its own.
    Document,
    /// Not at all: listed in `proxy.pass_through` by the host owner, relayed as it comes.
    Uninspected,
}

/// Where a request goes and how its two sides are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Routed {
    pub(crate) provider: Provider,
    pub(crate) reading: Reading,
    /// How the request body is judged, if it is (`request.rs`).
    pub(crate) request: Option<request::Route>,
}

/// Why a request is not relayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error(
        "{method} {path} is not a route toolwall inspects for any configured provider (anthropic, openai), so it is not relayed; to relay it uninspected, add it to proxy.pass_through with its provider"
    )]
    Unknown { method: String, path: String },
    #[error(
        "the request carries a Gemini API key ({what}), and no Gemini provider is configured: a key is never sent to another vendor"
    )]
    ForeignKey { what: &'static str },
    #[error(
        "the request carries an Anthropic key (x-api-key, or an sk-ant- bearer token) on a route of the openai provider: a key is never sent to another vendor"
    )]
    AnthropicKeyToOpenai,
}

/// The dialect routes: method, path (`*`: one segment) and the dialect that reads the answer
/// (and judges the request body, whatever the method, when there is one). The bare forms serve
/// base URLs whose upstream holds the version prefix; Azure's deployments name the model in
/// the path.
const DIALECTS: &[(&str, &str, Dialect)] = &[
    ("POST", "/v1/messages", Dialect::Anthropic),
    ("POST", "/messages", Dialect::Anthropic),
    ("POST", "/v1/chat/completions", Dialect::OpenAiChat),
    ("POST", "/chat/completions", Dialect::OpenAiChat),
    (
        "POST",
        "/openai/deployments/*/chat/completions",
        Dialect::OpenAiChat,
    ),
    // Stored completions, fetched again, carry the same calls.
    ("GET", "/v1/chat/completions/*", Dialect::OpenAiChat),
    ("POST", "/v1/chat/completions/*", Dialect::OpenAiChat),
    ("DELETE", "/v1/chat/completions/*", Dialect::OpenAiChat),
    (
        "GET",
        "/v1/chat/completions/*/messages",
        Dialect::OpenAiChat,
    ),
    ("POST", "/v1/responses", Dialect::OpenAiResponses),
    ("POST", "/responses", Dialect::OpenAiResponses),
    ("POST", "/v1/responses/compact", Dialect::OpenAiResponses),
    ("GET", "/v1/responses/*", Dialect::OpenAiResponses),
    ("DELETE", "/v1/responses/*", Dialect::OpenAiResponses),
    ("POST", "/v1/responses/*/cancel", Dialect::OpenAiResponses),
    (
        "GET",
        "/v1/responses/*/input_items",
        Dialect::OpenAiResponses,
    ),
];

/// The routes that carry no call of their own: method, path (`*`: one segment), provider and
/// how the request body is judged.
const DOCUMENTS: &[(&str, &str, Provider, Option<request::Route>)] = &[
    // Claude Code's reachability probe.
    ("HEAD", "/", Provider::Anthropic, None),
    ("GET", "/v1/models", Provider::Anthropic, None),
    ("GET", "/v1/models/*", Provider::Anthropic, None),
    (
        "POST",
        "/v1/messages/count_tokens",
        Provider::Anthropic,
        Some(request::Route::Dialect(Dialect::Anthropic)),
    ),
    ("GET", "/v1/models", Provider::Openai, None),
    ("GET", "/v1/models/*", Provider::Openai, None),
    (
        "POST",
        "/v1/responses/input_tokens",
        Provider::Openai,
        Some(request::Route::Dialect(Dialect::OpenAiResponses)),
    ),
    ("POST", "/v1/embeddings", Provider::Openai, None),
    ("POST", "/v1/moderations", Provider::Openai, None),
    // Conversations hold Responses input items the model reads once a response names the
    // conversation: their tool results are judged like a Responses request's.
    (
        "POST",
        "/v1/conversations",
        Provider::Openai,
        Some(request::Route::ConversationItems),
    ),
    ("GET", "/v1/conversations/*", Provider::Openai, None),
    ("POST", "/v1/conversations/*", Provider::Openai, None),
    ("DELETE", "/v1/conversations/*", Provider::Openai, None),
    ("GET", "/v1/conversations/*/items", Provider::Openai, None),
    (
        "POST",
        "/v1/conversations/*/items",
        Provider::Openai,
        Some(request::Route::ConversationItems),
    ),
    ("GET", "/v1/conversations/*/items/*", Provider::Openai, None),
    (
        "DELETE",
        "/v1/conversations/*/items/*",
        Provider::Openai,
        None,
    ),
];

fn document_matches(pattern: &str, path: &[&str]) -> bool {
    let want: Vec<&str> = pattern[1..].split('/').collect();
    want.len() == path.len() && want.iter().zip(path).all(|(w, h)| *w == "*" || w == h)
}

fn provider_of(dialect: Dialect) -> Provider {
    match dialect {
        Dialect::Anthropic => Provider::Anthropic,
        Dialect::OpenAiChat | Dialect::OpenAiResponses => Provider::Openai,
    }
}

/// Whether the request names Anthropic as its vendor (the Anthropic SDKs always send
/// `anthropic-version`; `x-api-key` is Anthropic's key header).
fn speaks_anthropic(headers: &HeaderMap) -> bool {
    headers.contains_key("anthropic-version") || headers.contains_key("x-api-key")
}

/// Routes a request: `path_and_query` is the client's, its session prefix gone.
pub(crate) fn route(
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    pass_through: &[PassThrough],
) -> Result<Routed, Refused> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    // Gemini's key, wherever it is sent: no route of another vendor takes it.
    if headers.contains_key("x-goog-api-key") {
        return Err(Refused::ForeignKey {
            what: "x-goog-api-key",
        });
    }
    // The query as a server decodes it (`;` separates too, names are matched in any case).
    let decoded = form_urlencoded::parse(query.replace(';', "&").as_bytes())
        // An escaped `=` (`key%3D…`) still names `key` to a server that decodes first.
        .any(|(name, _)| {
            name.split('=')
                .next()
                .is_some_and(|n| n.trim().eq_ignore_ascii_case("key"))
        });
    if decoded {
        return Err(Refused::ForeignKey { what: "key=" });
    }
    let google_key = |text: &[u8]| memchr::memmem::find(text, b"AIza").is_some();
    if google_key(query.as_bytes()) || headers.values().any(|v| google_key(v.as_bytes())) {
        return Err(Refused::ForeignKey {
            what: "a Google API key (AIza…)",
        });
    }
    let routed = known(method, path, headers)
        .or_else(|| {
            let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            let mut listed = pass_through.iter().filter(|p| p.matches(method, &segments));
            let first = listed.next()?;
            // Listed for both providers: the vendor the request names.
            let provider = match listed.find(|p| p.provider() != first.provider()) {
                Some(_) if speaks_anthropic(headers) => Provider::Anthropic,
                Some(_) => Provider::Openai,
                None => first.provider(),
            };
            Some(Routed {
                provider,
                reading: Reading::Uninspected,
                request: None,
            })
        })
        .ok_or_else(|| Refused::Unknown {
            method: method.to_string(),
            path: path.to_owned(),
        })?;
    // Anthropic's key header, or one of its keys (`sk-ant-…`, API or OAuth) as a bearer token.
    let anthropic_key = headers.contains_key("x-api-key")
        || headers
            .get_all(hyper::header::AUTHORIZATION)
            .iter()
            .any(|v| memchr::memmem::find(v.as_bytes(), b"sk-ant-").is_some());
    if routed.provider == Provider::Openai && anthropic_key {
        return Err(Refused::AnthropicKeyToOpenai);
    }
    Ok(routed)
}

/// The routes toolwall reads.
fn known(method: &Method, path: &str, headers: &HeaderMap) -> Option<Routed> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if let Some((_, _, dialect)) = DIALECTS
        .iter()
        .find(|(m, p, _)| *m == method.as_str() && document_matches(p, &segments))
    {
        return Some(Routed {
            provider: provider_of(*dialect),
            reading: Reading::Dialect(*dialect),
            request: Some(request::Route::Dialect(*dialect)),
        });
    }
    let mut found = DOCUMENTS
        .iter()
        .filter(|(m, p, _, _)| *m == method.as_str() && document_matches(p, &segments));
    let (_, _, provider, request) = found.next()?;
    // Both providers have it (`/v1/models`): the vendor the request names.
    let provider = match found.next() {
        Some(_) if speaks_anthropic(headers) => Provider::Anthropic,
        Some(_) => Provider::Openai,
        None => *provider,
    };
    Some(Routed {
        provider,
        reading: Reading::Document,
        request: *request,
    })
}

#[cfg(test)]
mod tests;
