//! Which requests the LLM proxy relays: an allowlist of routes per provider.
//!
//! A byte reaches the other side only if toolwall read it the way the receiver will, so a
//! request is relayed only on a route whose answer toolwall knows how to judge:
//! - the dialect routes (Messages, Chat Completions, Responses, Gemini's `generateContent` and
//!   `streamGenerateContent`), each by method and whole path, whose responses the dialect
//!   machines read;
//! - routes that carry no tool call of their own (`GET /v1/models`, `count_tokens`,
//!   `countTokens`, embeddings, conversations), whose responses are read whole and judged as
//!   one document by call shape (`backstop.rs`);
//! - the routes the host owner lists in `proxy.pass_through`, relayed uninspected and
//!   recorded.
//!
//! Everything else is refused with the route and the setting that would allow it: the
//! provider APIs that carry calls no dialect reads (Assistants, Managed Agents sessions,
//! Message Batches results, ChatKit, files, Gemini's cached contents and batches) and paths of
//! vendors toolwall has no provider for (Vertex AI's).
//!
//! A key goes only to its own vendor: a Gemini key (`x-goog-api-key`, `key=`, any `AIza…`
//! value) only on a route of the gemini provider, and an Anthropic or OpenAI key (`x-api-key`,
//! an `sk-` bearer token) never there; an Anthropic key never to the openai provider. A route
//! two providers share (`GET /v1/models`) goes to the vendor whose key the request carries.

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
        "{method} {path} is not a route toolwall inspects for any configured provider (anthropic, openai, gemini), so it is not relayed; to relay it uninspected, add it to proxy.pass_through with its provider"
    )]
    Unknown { method: String, path: String },
    #[error(
        "the request carries a Gemini API key ({what}) on a route of the {provider} provider: a key is never sent to another vendor"
    )]
    ForeignKey {
        what: &'static str,
        provider: &'static str,
    },
    #[error(
        "the request carries {vendor} credentials ({what}) on a route of the gemini provider: a key is never sent to another vendor"
    )]
    KeyToGemini {
        vendor: &'static str,
        what: &'static str,
    },
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
    // `{v}`: any Gemini API version; `*:x`: a model id, then `:x` (`segment_matches`).
    ("POST", "/{v}/models/*:generateContent", Dialect::Gemini),
    (
        "POST",
        "/{v}/models/*:streamGenerateContent",
        Dialect::Gemini,
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
    ("GET", "/{v}/models", Provider::Gemini, None),
    ("GET", "/{v}/models/{model}", Provider::Gemini, None),
    // Contents counted are judged like a request's (a tool result in them is inspected).
    (
        "POST",
        "/{v}/models/*:countTokens",
        Provider::Gemini,
        Some(request::Route::Dialect(Dialect::Gemini)),
    ),
    ("POST", "/{v}/models/*:embedContent", Provider::Gemini, None),
    (
        "POST",
        "/{v}/models/*:batchEmbedContents",
        Provider::Gemini,
        None,
    ),
];

/// The Gemini API's versions (`{v}` in a route).
const GEMINI_VERSIONS: [&str; 3] = ["v1", "v1beta", "v1alpha"];

/// Whether one path segment is what a route's segment asks: `*` any one, `{v}` a Gemini API
/// version, `{model}` a Gemini model id (no colon: that starts a method), `*:x` a model id
/// followed by `:x`, else itself.
fn segment_matches(want: &str, have: &str) -> bool {
    match want {
        "*" => true,
        "{v}" => GEMINI_VERSIONS.contains(&have),
        "{model}" => !have.is_empty() && !have.contains(':'),
        _ => match want.strip_prefix("*:") {
            Some(method) => have
                .rsplit_once(':')
                .is_some_and(|(model, m)| m == method && !model.is_empty() && !model.contains(':')),
            None => want == have,
        },
    }
}

fn document_matches(pattern: &str, path: &[&str]) -> bool {
    let want: Vec<&str> = pattern[1..].split('/').collect();
    want.len() == path.len() && want.iter().zip(path).all(|(w, h)| segment_matches(w, h))
}

fn provider_of(dialect: Dialect) -> Provider {
    match dialect {
        Dialect::Anthropic => Provider::Anthropic,
        Dialect::OpenAiChat | Dialect::OpenAiResponses => Provider::Openai,
        Dialect::Gemini => Provider::Gemini,
    }
}

/// Whether the request names Anthropic as its vendor (the Anthropic SDKs always send
/// `anthropic-version`; `x-api-key` is Anthropic's key header).
fn speaks_anthropic(headers: &HeaderMap) -> bool {
    headers.contains_key("anthropic-version") || headers.contains_key("x-api-key")
}

/// Of the providers that have a route, the one the request names by its key or headers:
/// Gemini for a Google key, Anthropic for its headers, else OpenAI (if it has the route).
fn vendor_of(candidates: &[Provider], google_key: bool, headers: &HeaderMap) -> Provider {
    let has = |p: Provider| candidates.contains(&p);
    if google_key && has(Provider::Gemini) {
        Provider::Gemini
    } else if speaks_anthropic(headers) && has(Provider::Anthropic) {
        Provider::Anthropic
    } else if has(Provider::Openai) {
        Provider::Openai
    } else {
        candidates[0]
    }
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
    let google = keys::google(query, headers);
    let routed = known(method, path, google.is_some(), headers)
        .or_else(|| {
            let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            let listed: Vec<Provider> = pass_through
                .iter()
                .filter(|p| p.matches(method, &segments))
                .map(PassThrough::provider)
                .collect();
            if listed.is_empty() {
                return None;
            }
            // Listed for several providers: the vendor the request names.
            let provider = vendor_of(&listed, google.is_some(), headers);
            Some(Routed {
                provider,
                reading: Reading::Uninspected,
                request: None,
            })
        })
        .ok_or_else(|| match google {
            // A Gemini key on a route of no provider: the key is what matters.
            Some(what) => Refused::ForeignKey {
                what,
                provider: "no",
            },
            None => Refused::Unknown {
                method: method.to_string(),
                path: path.to_owned(),
            },
        })?;
    if let Some(what) = google
        && routed.provider != Provider::Gemini
    {
        return Err(Refused::ForeignKey {
            what,
            provider: routed.provider.as_str(),
        });
    }
    if routed.provider == Provider::Openai && keys::anthropic(query, headers) {
        return Err(Refused::AnthropicKeyToOpenai);
    }
    if routed.provider == Provider::Gemini
        && let Some((vendor, what)) = keys::foreign_to_gemini(query, headers)
    {
        return Err(Refused::KeyToGemini { vendor, what });
    }
    Ok(routed)
}

/// The routes toolwall reads.
fn known(method: &Method, path: &str, google_key: bool, headers: &HeaderMap) -> Option<Routed> {
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
    let found: Vec<&(&str, &str, Provider, Option<request::Route>)> = DOCUMENTS
        .iter()
        .filter(|(m, p, _, _)| *m == method.as_str() && document_matches(p, &segments))
        .collect();
    let providers: Vec<Provider> = found.iter().map(|(_, _, p, _)| *p).collect();
    if providers.is_empty() {
        return None;
    }
    // Several providers have it (`/v1/models`): the vendor the request names.
    let provider = vendor_of(&providers, google_key, headers);
    let (_, _, _, request) = found.iter().find(|(_, _, p, _)| *p == provider)?;
    Some(Routed {
        provider,
        reading: Reading::Document,
        request: *request,
    })
}

mod keys;
#[cfg(test)]
mod tests;
