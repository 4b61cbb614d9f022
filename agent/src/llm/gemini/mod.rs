//! The Gemini API (`models/{model}:generateContent`, `:streamGenerateContent`): calls are
//! `functionCall` parts of a candidate's `content.parts`.
//!
//! # How the SDKs build calls
//!
//! Every response, and every streamed chunk, is a whole `GenerateContentResponse`; a
//! `functionCall` part arrives whole in one chunk (name, `id`, `args` object), and the SDKs
//! (`google-genai` for Python, `@google/genai` for Node, and Gemini CLI on top of the latter)
//! act on each chunk's parts as they come: `response.function_calls` / `functionCalls` read the
//! parts of the chunk at hand, nothing joins parts across chunks. So each part is judged on its
//! own, as it comes, and nothing is held.
//!
//! # What this module does
//!
//! A part holding a call of a blocked tool (under `functionCall`, or `function_call`, which the
//! Python SDK's models also take) is replaced in place by a text part saying why (its
//! `thoughtSignature`, if any, kept: Gemini 3 wants one on the turn's first part); every other
//! byte is upstream's. The streamed chunk holding it is rewritten as one `data:` line. A call
//! whose arguments stream in pieces (`partialArgs`, `willContinue`: Gemini 3's streamed
//! function-call arguments) cannot be judged whole when it leaves, so the stream ends there
//! (fail closed). Whole bodies are one response, or the JSON-array stream
//! (`streamGenerateContent` without `alt=sse`), each element judged alike.

use std::borrow::Cow;
use std::sync::LazyLock;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{RawObject, quote, raw_array, raw_from_json};
use super::{Cx, Keys, blocked_message};

mod stream;

pub(crate) use stream::Gemini;

/// The keys a call comes under: the API's `functionCall`, and the proto field name the Python
/// SDK's models accept as well.
static TOOL_KEYS: LazyLock<Keys> =
    LazyLock::new(|| Keys::new(&["\"functionCall\"", "\"function_call\""]));

/// The two spellings of a part's call.
const CALL_FIELDS: [&str; 2] = ["functionCall", "function_call"];

/// Why a response cannot be passed on.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unpassable {
    /// Not the JSON a response is.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A call toolwall cannot judge whole.
    #[error("{0}")]
    Unjudgeable(String),
}

/// A `functionCall` as the SDKs read it (camelCase, and the Python SDK's snake_case aliases:
/// both spellings of one field are a repeated field, refused).
#[derive(Deserialize)]
struct CallView<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    args: Option<&'a RawValue>,
    #[serde(default, borrow, rename = "partialArgs", alias = "partial_args")]
    partial_args: Option<&'a RawValue>,
    #[serde(default, rename = "willContinue", alias = "will_continue")]
    will_continue: Option<bool>,
}

/// A whole body: one response, or the JSON-array stream (a list of responses). `None` when
/// nothing was blocked.
pub(super) fn rewrite_document(cx: &mut Cx, text: &str) -> Result<Option<String>, Unpassable> {
    if !text.trim_start().starts_with('[') {
        return rewrite_response(cx, text);
    }
    let items: Vec<&RawValue> = serde_json::from_str(text)?;
    let new = rewrite_each(items, |item| {
        Ok(rewrite_response(cx, item.get())?.map(raw_from_json))
    })?;
    Ok(new.map(|array| array.get().to_owned()))
}

/// A JSON array of `items` with each one `rewrite` replaces (`Some`) replaced and the others
/// verbatim; `None` when it replaced none.
fn rewrite_each<'a>(
    items: Vec<&'a RawValue>,
    mut rewrite: impl FnMut(&'a RawValue) -> Result<Option<Box<RawValue>>, Unpassable>,
) -> Result<Option<Box<RawValue>>, Unpassable> {
    let mut out: Vec<Cow<'a, RawValue>> = Vec::with_capacity(items.len());
    let mut changed = false;
    for item in items {
        match rewrite(item)? {
            Some(new) => {
                changed = true;
                out.push(Cow::Owned(new));
            }
            None => out.push(Cow::Borrowed(item)),
        }
    }
    Ok(changed.then(|| raw_array(out.iter().map(AsRef::as_ref))))
}

/// One `GenerateContentResponse`: every candidate's call parts judged, the blocked ones
/// replaced. `None` when nothing was blocked.
fn rewrite_response(cx: &mut Cx, text: &str) -> Result<Option<String>, Unpassable> {
    let mut top = RawObject::parse(text)?;
    let Some(raw) = top.parsed("candidates") else {
        return Ok(None);
    };
    let Some(candidates) = serde_json::from_str::<Option<Vec<&RawValue>>>(raw.get())? else {
        return Ok(None);
    };
    let Some(new) = rewrite_each(candidates, |c| rewrite_candidate(cx, c))? else {
        return Ok(None);
    };
    top.set("candidates", new);
    Ok(Some(top.to_json()))
}

fn rewrite_candidate(cx: &mut Cx, raw: &RawValue) -> Result<Option<Box<RawValue>>, Unpassable> {
    let mut candidate = RawObject::from_raw(raw)?;
    let Some(content_raw) = candidate.parsed("content") else {
        return Ok(None);
    };
    let Some(mut content) = serde_json::from_str::<Option<RawObject<'_>>>(content_raw.get())?
    else {
        return Ok(None);
    };
    let Some(parts_raw) = content.parsed("parts") else {
        return Ok(None);
    };
    let Some(parts) = serde_json::from_str::<Option<Vec<&RawValue>>>(parts_raw.get())? else {
        return Ok(None);
    };
    let Some(new) = rewrite_each(parts, |p| judge_part(cx, p))? else {
        return Ok(None);
    };
    content.set("parts", new);
    candidate.set("content", content.to_raw());
    Ok(Some(candidate.to_raw()))
}

/// Judges a part's call(s); the text part that replaces it when one is blocked.
fn judge_part(cx: &mut Cx, raw: &RawValue) -> Result<Option<Box<RawValue>>, Unpassable> {
    // A part that is not an object holds no call an SDK reads (theirs would fail on it); an
    // object our strict reading refuses (a repeated key) is refused, the SDKs read it their way.
    if !raw.get().trim_start().starts_with('{') {
        return Ok(None);
    }
    let part = RawObject::from_raw(raw)?;
    let mut messages = String::new();
    for field in CALL_FIELDS {
        let Some(call_raw) = part.parsed(field) else {
            continue;
        };
        let Some(call) = serde_json::from_str::<Option<CallView<'_>>>(call_raw.get())? else {
            continue;
        };
        let name = call.name.as_deref().unwrap_or_default();
        if call.partial_args.is_some() || call.will_continue == Some(true) {
            return Err(Unpassable::Unjudgeable(format!(
                "the call of {name:?} streams its arguments in pieces (partialArgs / willContinue), which toolwall cannot judge before they leave; do not ask for streamed function-call arguments"
            )));
        }
        let args = call.args.map(RawValue::get);
        let decision = cx.check_complete(name, None, args);
        if decision.is_blocked() && messages.is_empty() {
            messages = blocked_message(name, &decision.reason);
        }
        let input = args.and_then(|a| serde_json::from_str(a).ok());
        let id = call.id.as_deref().unwrap_or_default().to_owned();
        cx.record(name.to_owned(), id, input, decision);
    }
    if messages.is_empty() {
        return Ok(None);
    }
    let mut text = format!("{{\"text\":{}", quote(&messages));
    for signature in ["thoughtSignature", "thought_signature"] {
        if let Some(s) = part.get(signature) {
            text.push_str(&format!(",{}:{}", quote(signature), s.get()));
        }
    }
    text.push('}');
    Ok(Some(raw_from_json(text)))
}

/// Records, as refused, every call a response that cannot be passed on presents to a lenient
/// reader (a repeated key counts as its last value, as in both SDKs), so the refusal is on
/// record even though the stream ends.
pub(super) fn record_unreadable(cx: &mut Cx, text: &str, why: &str) {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
        return;
    };
    let responses = match &value {
        serde_json::Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    for response in responses {
        for candidate in response["candidates"].as_array().into_iter().flatten() {
            for part in candidate["content"]["parts"]
                .as_array()
                .into_iter()
                .flatten()
            {
                for field in CALL_FIELDS {
                    let Some(name) = part[field]["name"].as_str() else {
                        continue;
                    };
                    let decision = cx.check_at(name, None, crate::decision::CallStage::Inspected);
                    let decision = if decision.is_blocked() {
                        decision
                    } else {
                        decision.overruled(format!(
                            "the response holding it cannot be passed on ({why}): refused, fail closed"
                        ))
                    };
                    let id = part[field]["id"].as_str().unwrap_or_default().to_owned();
                    cx.record(name.to_owned(), id, None, decision);
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
