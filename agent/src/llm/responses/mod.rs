//! OpenAI Responses API streaming (what Codex speaks).
//!
//! | event | action |
//! |---|---|
//! | `response.output_item.added`, `function_call` | ask the gate with `namespace` + `name`; blocked: a message item (added, part added, text delta, text done, part done) replaces it at the same `output_index` |
//! | `response.function_call_arguments.delta/.done` | suppressed for a blocked item |
//! | `response.output_item.done` | blocked: the completed message item; allowed MCP: recorded with its arguments; an item whose name/namespace differs from what was judged at `added` is judged again (and replaced by a message item if now blocked) |
//! | `response.output_item.added`, `mcp_approval_request` | the hosted MCP call it proposes (`mcp__{server_label}__{name}`, with its arguments) decided at once and recorded; blocked: replaced by a message item as a function call is (the SDK never sees a request to approve), and remembered so an approval of it is refused (`request/approvals.rs`) |
//! | `response.output_item.added`, `custom_tool_call` | held back with its `custom_tool_call_input.*` events until its `output_item.done`; then its code is scanned for `mcp__<server>__<tool>` references and the whole item passes, or is replaced if one is blocked |
//! | `response.completed/.incomplete/.failed` | blocked items in `response.output` replaced by the message items; a tool item not passed exactly as it stands (same id, type, name, namespace, code) is judged again |
//! | any other event with a call item (`item`, `response.output`) | a blocked one ends the stream (fail closed) |
//!
//! Synthetic events reuse the `sequence_number` of the event they stand in for.
//!
//! SDK helpers build the final result from `output_item.done` and `response.completed`, not from
//! `added`, so a decision taken at `added` only holds for the item as it was then: each decision
//! keeps a [`Judged`] fingerprint of what it was about, and a later event that carries the same
//! item with another name is judged anew. Unchanged items are not asked about again (an allow
//! spends the server's rate-limit budget, and would be recorded twice).

use std::borrow::Cow;
use std::sync::LazyLock;

use bytes::BytesMut;
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::Keys;
use super::json::quote;
use crate::sse::write_event;

mod body;
mod judge;
mod stream;

pub(super) use body::rewrite_body;
#[cfg(test)]
use judge::{mcp_references, normalise_code};
pub(crate) use stream::Responses;

/// The item types a tool call comes as (`function_call`, with its events, Codex's
/// `custom_tool_call`, and the hosted MCP tool's `mcp_call` and `mcp_approval_request`).
static CALL_KEYS: LazyLock<Keys> = LazyLock::new(|| {
    Keys::new(&[
        "function_call",
        "custom_tool_call",
        "mcp_call",
        "mcp_approval_request",
    ])
});

/// Event types that carry only text of message/reasoning items: never parsed.
const TEXT_PREFIXES: [&[u8]; 4] = [
    br#"{"type":"response.output_text.delta""#,
    br#"{"type":"response.reasoning_summary_text.delta""#,
    br#"{"type":"response.reasoning_text.delta""#,
    br#"{"type":"response.refusal.delta""#,
];

#[derive(Deserialize)]
struct Envelope<'a> {
    /// Empty when missing: such an event is no known type, not malformed JSON, and is still
    /// looked at for call items.
    #[serde(rename = "type", borrow, default)]
    ty: Cow<'a, str>,
    #[serde(default)]
    output_index: Option<u64>,
    #[serde(default, borrow)]
    item_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    item: Option<&'a RawValue>,
    #[serde(default, borrow)]
    sequence_number: Option<&'a RawValue>,
    #[serde(default, borrow)]
    delta: Option<&'a RawValue>,
    #[serde(default, borrow)]
    input: Option<&'a RawValue>,
    /// `function_call_arguments.done`'s whole arguments.
    #[serde(default, borrow)]
    arguments: Option<&'a RawValue>,
    #[serde(default, borrow)]
    response: Option<&'a RawValue>,
}

/// The part of a `response` object that can hold calls.
#[derive(Deserialize)]
struct ResponseOutput<'a> {
    #[serde(default, borrow)]
    output: Vec<&'a RawValue>,
}

/// An output item as far as we care.
#[derive(Deserialize)]
pub(crate) struct Item<'a> {
    #[serde(rename = "type", borrow)]
    pub ty: Cow<'a, str>,
    #[serde(default, borrow)]
    pub id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub call_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub namespace: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub arguments: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub input: Option<Cow<'a, str>>,
    /// The hosted MCP server of an `mcp_approval_request`.
    #[serde(default, borrow)]
    pub server_label: Option<Cow<'a, str>>,
}

impl Item<'_> {
    /// The name the gate is asked about and records show, and its namespace: a hosted MCP
    /// approval request's tool as `mcp__{server_label}__{name}` (as the backstop names it).
    pub(crate) fn call_name(&self) -> (Cow<'_, str>, Option<&str>) {
        let name = self.name.as_deref().unwrap_or_default();
        if self.ty == "mcp_approval_request" {
            let server = self.server_label.as_deref().unwrap_or_default();
            return (Cow::Owned(format!("mcp__{server}__{name}")), None);
        }
        (Cow::Borrowed(name), self.namespace.as_deref())
    }
}

/// A fingerprint of what a tool item was judged on: type, name, namespace and (custom tool
/// calls) code. SHA-256, so an upstream cannot make a different item look already judged.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Judged([u8; 32]);

impl Judged {
    fn of(ty: &str, name: &str, namespace: Option<&str>, input: &str) -> Self {
        let mut h = Sha256::new();
        // Length-prefixed fields: no two different items hash the same bytes.
        for part in [Some(ty), Some(name), namespace, Some(input)] {
            match part {
                Some(p) => {
                    h.update([1]);
                    h.update((p.len() as u64).to_le_bytes());
                    h.update(p.as_bytes());
                }
                None => h.update([0]),
            }
        }
        Judged(h.finalize().into())
    }

    /// The fingerprint of an item as it stands, what it was judged on included: a custom tool
    /// call's code, a function call's arguments (argument rules judge them: a final
    /// `response.completed` item with other arguments than those passed is judged again).
    fn item(item: &Item<'_>) -> Self {
        let input = match item.ty.as_ref() {
            "custom_tool_call" => item.input.as_deref().unwrap_or_default(),
            "function_call" | "mcp_approval_request" => {
                item.arguments.as_deref().unwrap_or_default()
            }
            _ => "",
        };
        let (name, namespace) = item.call_name();
        Judged::of(&item.ty, &name, namespace, input)
    }

    /// The fingerprint of what an item calls, without its arguments: a function call allowed
    /// at `added` (its arguments still empty) is judged again at `done` only if this changed.
    fn named(item: &Item<'_>) -> Self {
        let input = if item.ty == "custom_tool_call" {
            item.input.as_deref().unwrap_or_default()
        } else {
            ""
        };
        let (name, namespace) = item.call_name();
        Judged::of(&item.ty, &name, namespace, input)
    }
}

/// The name to show and record: Codex's `namespace` + `name` as `mcp__server__tool`.
pub(crate) fn display_name(name: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}__{name}"),
        _ => name.to_owned(),
    }
}
/// A message item carrying `text` (JSON), as `added` (in progress, empty) or `done`.
pub(crate) fn message_item(id: &str, text: &str, done: bool) -> String {
    if done {
        format!(
            r#"{{"id":{},"type":"message","status":"completed","role":"assistant","content":[{{"type":"output_text","text":{},"annotations":[]}}]}}"#,
            quote(id),
            quote(text)
        )
    } else {
        format!(
            r#"{{"id":{},"type":"message","status":"in_progress","role":"assistant","content":[]}}"#,
            quote(id)
        )
    }
}

fn write_message_open(out: &mut BytesMut, seq: &str, index: u64, id: &str, text: &str) {
    let (qid, qtext) = (quote(id), quote(text));
    let added = format!(
        r#"{{"type":"response.output_item.added","sequence_number":{seq},"output_index":{index},"item":{}}}"#,
        message_item(id, text, false)
    );
    write_event(out, Some("response.output_item.added"), added.as_bytes());
    let part_added = format!(
        r#"{{"type":"response.content_part.added","sequence_number":{seq},"item_id":{qid},"output_index":{index},"content_index":0,"part":{{"type":"output_text","text":"","annotations":[]}}}}"#
    );
    write_event(
        out,
        Some("response.content_part.added"),
        part_added.as_bytes(),
    );
    let delta = format!(
        r#"{{"type":"response.output_text.delta","sequence_number":{seq},"item_id":{qid},"output_index":{index},"content_index":0,"delta":{qtext},"logprobs":[]}}"#
    );
    write_event(out, Some("response.output_text.delta"), delta.as_bytes());
    let done = format!(
        r#"{{"type":"response.output_text.done","sequence_number":{seq},"item_id":{qid},"output_index":{index},"content_index":0,"text":{qtext},"logprobs":[]}}"#
    );
    write_event(out, Some("response.output_text.done"), done.as_bytes());
    let part_done = format!(
        r#"{{"type":"response.content_part.done","sequence_number":{seq},"item_id":{qid},"output_index":{index},"content_index":0,"part":{{"type":"output_text","text":{qtext},"annotations":[]}}}}"#
    );
    write_event(
        out,
        Some("response.content_part.done"),
        part_done.as_bytes(),
    );
}

fn write_message_done(out: &mut BytesMut, seq: &str, index: u64, id: &str, text: &str) {
    let done = format!(
        r#"{{"type":"response.output_item.done","sequence_number":{seq},"output_index":{index},"item":{}}}"#,
        message_item(id, text, true)
    );
    write_event(out, Some("response.output_item.done"), done.as_bytes());
}

#[cfg(test)]
mod hosted_tests;
#[cfg(test)]
pub(crate) mod tests;
