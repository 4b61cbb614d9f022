//! The second line behind the dialect machines: whatever the route, the label or
//! the dialect, any JSON object in a response that has the shape of a tool call of any dialect
//! and names a blocked tool stops the response.
//!
//! The dialect machines (`anthropic.rs`, `chat.rs`, `responses.rs`, `buffered.rs`) know each
//! API's grammar and rewrite blocked calls in place; this module knows only call *shapes*, and
//! refuses instead of rewriting. It runs over every buffered body the proxy sends on an
//! inspected route (after the rewrite: what leaves is what is judged) and over the whole body
//! of every route without calls of its own (models, conversations, error statuses).
//!
//! Call shapes (what the SDKs act on; a repeated key counts as its last value, as in Python's
//! `json` and JavaScript's `JSON.parse`):
//! - an object whose `type` is `tool_use`, `server_tool_use`, `mcp_tool_use` (Anthropic),
//!   `function_call`, `custom_tool_call`, `mcp_call` or `mcp_approval_request` (Responses), by
//!   its `name` (with Codex's `namespace`, and an MCP block's `server_name` / `server_label`);
//! - an object whose `type` reads as a call of some other kind (`agent.custom_tool_use`,
//!   `chatkit.client_tool_call`, any `*_call`) and that names a tool (`name`, `tool_name`):
//!   refused whatever it names, since toolwall does not know how its receiver runs it;
//! - an element of a `tool_calls` array or the value of a `function_call` key (Chat), by the
//!   `name` of its `function` or `custom` object, or its own `name` — outside a stream's
//!   `delta`, where a name is a fragment the SDKs join (the Chat machine judges joined names);
//! - the value of a `functionCall` key (Gemini; `function_call` as the Python SDK also reads
//!   it), by its `name`.
//!
//! Checks use `CallStage::Inspected`: the same rules, no rate-limit budget spent.

use std::sync::LazyLock;

use bytes::Bytes;
use memchr::memmem;
use serde_json::{Map, Value};

use crate::decision::{CallQuery, CallStage, Decision, Gate};

/// A call the backstop found, with the gate's answer.
#[derive(Debug)]
pub(crate) struct Found {
    pub(crate) name: String,
    pub(crate) decision: Decision,
}

const CALL_TYPES: [&str; 7] = [
    "tool_use",
    "server_tool_use",
    "mcp_tool_use",
    "function_call",
    "custom_tool_call",
    "mcp_call",
    // The provider asks to run a hosted MCP tool: a call, whoever answers it.
    "mcp_approval_request",
];

/// Whether a `type` reads as a call of some API (`agent.custom_tool_use`,
/// `chatkit.client_tool_call`, a `*_call` item): such an object that names a tool and is not
/// one of [`CALL_TYPES`] is a call toolwall cannot judge, so it refuses it (fail closed).
fn call_like(kind: &str) -> bool {
    let kind = kind.to_ascii_lowercase();
    kind.contains("tool_use")
        || kind.contains("tool_call")
        || kind.ends_with("_call")
        || kind.contains("approval_request")
}

/// A call of a type toolwall does not know: refused whatever it names.
fn unknown_call(kind: &str, name: &str) -> Found {
    Found {
        name: name.to_owned(),
        decision: Decision {
            action: crate::decision::Action::Block,
            reason: format!(
                "a tool call of a type toolwall does not read ({kind:?}): refused, fail closed"
            ),
            tool: None,
            redact: Vec::new(),
            ask: None,
        },
    }
}

/// Bytes that every call shape's JSON holds (`tool_` of `tool_use`, `tool_calls`,
/// `custom_tool_call`; `_call` of `function_call`, `mcp_call`; `approval_request` of
/// `mcp_approval_request`; Gemini's `functionCall`), or behind which one could hide (`\u`
/// escapes): text without any of them cannot carry a call. Five searches, each built once.
static MARKERS: LazyLock<[memmem::Finder<'static>; 5]> = LazyLock::new(|| {
    [
        memmem::Finder::new(b"tool_"),
        memmem::Finder::new(b"_call"),
        memmem::Finder::new(b"approval_request"),
        memmem::Finder::new(b"functionCall"),
        memmem::Finder::new(b"\\u"),
    ]
});

pub(crate) fn may_hold_a_call(bytes: &[u8]) -> bool {
    MARKERS.iter().any(|m| m.find(bytes).is_some())
}

fn str_of<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    map.get(key).and_then(Value::as_str)
}

/// The first blocked call in `value`, searched depth first.
pub(crate) fn find_blocked(value: &Value, gate: &dyn Gate) -> Option<Found> {
    walk(value, None, false, gate)
}

/// `in_delta`: inside a Chat stream's `delta`, where a `tool_calls` entry's name is a fragment
/// the SDKs join with others (the Chat machine judges the joined names, `chat.rs`); only whole
/// names are judged here.
fn walk(value: &Value, key: Option<&str>, in_delta: bool, gate: &dyn Gate) -> Option<Found> {
    match value {
        Value::Object(map) => judge(map, key, in_delta, gate).or_else(|| {
            map.iter()
                .find_map(|(k, v)| walk(v, Some(k.as_str()), in_delta || k == "delta", gate))
        }),
        // An array's elements stand where the array stands (`tool_calls: [call, ...]`).
        Value::Array(items) => items.iter().find_map(|v| walk(v, key, in_delta, gate)),
        _ => None,
    }
}

fn judge(
    map: &Map<String, Value>,
    key: Option<&str>,
    in_delta: bool,
    gate: &dyn Gate,
) -> Option<Found> {
    let mut names: Vec<(String, Option<&str>)> = Vec::new();
    if let Some(kind) = str_of(map, "type").filter(|t| !CALL_TYPES.contains(t) && call_like(t))
        && let Some(name) = str_of(map, "name").or_else(|| str_of(map, "tool_name"))
    {
        return Some(unknown_call(kind, name));
    }
    if str_of(map, "type").is_some_and(|t| CALL_TYPES.contains(&t))
        && let Some(name) = str_of(map, "name")
    {
        names.push((name.to_owned(), str_of(map, "namespace")));
        if let Some(server) = str_of(map, "server_name").or_else(|| str_of(map, "server_label")) {
            names.push((format!("mcp__{server}__{name}"), None));
        }
    }
    if !in_delta && matches!(key, Some("tool_calls" | "function_call" | "functionCall")) {
        for inner in ["function", "custom"] {
            if let Some(name) = map
                .get(inner)
                .and_then(Value::as_object)
                .and_then(|f| str_of(f, "name"))
            {
                names.push((name.to_owned(), None));
            }
        }
        if let Some(name) = str_of(map, "name") {
            names.push((name.to_owned(), None));
        }
    }
    names.into_iter().find_map(|(name, namespace)| {
        let decision = gate.check_call(&CallQuery {
            server_id: None,
            name: &name,
            namespace,
            stage: CallStage::Inspected,
            arguments: None,
        });
        decision.is_blocked().then(|| Found {
            name: match namespace {
                Some(ns) => format!("{ns}__{name}"),
                None => name.clone(),
            },
            decision,
        })
    })
}

/// Whether a body opens a JSON document (`Some(true)`), something else (`Some(false)`), or has
/// shown only whitespace and a byte order mark so far (`None`): how the proxy decides to read a
/// response, whatever its label says (the SDKs parse a JSON document as JSON regardless).
pub(crate) fn opens_json(prefix: &[u8]) -> Option<bool> {
    let prefix = prefix.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(prefix);
    // A partial byte order mark is not yet an answer.
    if !prefix.is_empty() && b"\xEF\xBB\xBF".starts_with(prefix) {
        return None;
    }
    prefix
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .map(|b| matches!(b, b'{' | b'['))
}

/// Parses JSON as the SDKs do: a UTF-8 byte order mark before it is allowed (Python's `json`
/// skips one).
fn parse(text: &[u8]) -> serde_json::Result<Value> {
    let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
    serde_json::from_slice(text)
}

/// Text whose first byte (after whitespace and a byte order mark) opens a JSON document.
fn looks_like_json(text: &[u8]) -> bool {
    opens_json(text) == Some(true)
}

/// JSON that may hold a call and that this reading cannot take (nesting past 128, a lone
/// surrogate, `NaN`: Python's `json` or `JSON.parse` read some of them): what cannot be judged does not leave (forward only what was understood).
fn unreadable(error: &serde_json::Error) -> Found {
    Found {
        name: "<unreadable>".into(),
        decision: Decision {
            action: crate::decision::Action::Block,
            reason: format!(
                "a part of the response that may hold a tool call could not be read as JSON ({error}): refused, fail closed"
            ),
            tool: None,
            redact: Vec::new(),
            ask: None,
        },
    }
}

/// Judges one JSON text that may hold a call.
fn judge_json(text: &[u8], gate: &dyn Gate) -> Option<Found> {
    match parse(text) {
        Ok(value) => find_blocked(&value, gate),
        Err(e) => Some(unreadable(&e)),
    }
}

/// The first blocked call in a whole body, read every way a client could read it: one JSON
/// document, JSON lines, and the `data` of SSE events. JSON that may hold a call and cannot
/// be read counts as blocked.
pub(crate) fn scan_body(body: &[u8], gate: &dyn Gate) -> Option<Found> {
    if !may_hold_a_call(body) {
        return None;
    }
    match parse(body) {
        Ok(value) => return find_blocked(&value, gate),
        // One document (not JSON lines) that cannot be read.
        Err(e)
            if looks_like_json(body)
                && !body.trim_ascii().contains(&b'\n')
                && !body.trim_ascii().contains(&b'\r') =>
        {
            return Some(unreadable(&e));
        }
        Err(_) => {}
    }
    scan_lines(body, gate).or_else(|| scan_sse(body, gate))
}

/// Each line that looks like a JSON document, as one (JSON lines), its lines ended at every
/// line end a reader splits at (LF, CRLF, and a lone CR: both SDKs' JSONL readers split there).
/// Other lines (SSE fields, text) are left to [`scan_sse`].
fn scan_lines(body: &[u8], gate: &dyn Gate) -> Option<Found> {
    body.split(|&b| b == b'\n' || b == b'\r')
        .filter(|line| may_hold_a_call(line) && looks_like_json(line))
        .find_map(|line| judge_json(line, gate))
}

/// Each SSE event's `data` (its `data:` lines joined by LF), framed by the one framer
/// (`sse/framer.rs`: every line end WHATWG allows, a lone CR included); only events that may
/// hold a call are parsed, and an unterminated last event is judged too.
pub(crate) fn scan_sse(body: &[u8], gate: &dyn Gate) -> Option<Found> {
    if !may_hold_a_call(body) {
        return None;
    }
    // The body is whole: no event is left incomplete for want of a read, so no limit.
    let mut framer = crate::sse::SseDecoder::new(usize::MAX);
    framer.feed(Bytes::copy_from_slice(body));
    let judge = |raw: &[u8]| {
        if !may_hold_a_call(raw) {
            return None;
        }
        let data = crate::sse::SseEvent::new(raw).data()?;
        (may_hold_a_call(&data) && looks_like_json(&data))
            .then(|| judge_json(&data, gate))
            .flatten()
    };
    while let Ok(Some(raw)) = framer.next_event() {
        if let Some(found) = judge(&raw) {
            return Some(found);
        }
    }
    judge(&framer.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::testing::gate;

    fn blocked(body: &str) -> Option<String> {
        scan_body(body.as_bytes(), gate(&["echo", "mcp__s__echo"]).as_ref()).map(|f| f.name)
    }

    #[test]
    fn every_dialects_call_shape_is_found_anywhere() {
        for body in [
            r#"{"content":[{"type":"tool_use","id":"t","name":"echo","input":{}}]}"#,
            r#"{"x":{"y":[{"type":"server_tool_use","name":"echo"}]}}"#,
            r#"{"type":"mcp_tool_use","server_name":"s","name":"echo"}"#,
            r#"{"output":[{"type":"function_call","name":"echo","arguments":"{}"}]}"#,
            r#"{"output":[{"type":"custom_tool_call","name":"echo","input":""}]}"#,
            r#"{"choices":[{"message":{"tool_calls":[{"id":"c","type":"function","function":{"name":"echo","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"message":{"tool_calls":[{"type":"custom","custom":{"name":"echo","input":"x"}}]}}]}"#,
            r#"{"choices":[{"message":{"function_call":{"name":"echo","arguments":"{}"}}}]}"#,
            r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"echo","args":{}}}]}}]}"#,
            r#"[{"candidates":[{"content":{"parts":[{"function_call":{"name":"echo"}}]}}]}]"#,
            // A repeated key: the last value is what the SDKs read.
            r#"{"content":[{"type":"tool_use","name":"ping","name":"echo"}]}"#,
            // Escaped, with a byte order mark.
            "\u{feff}{\"content\":[{\"type\":\"tool_\\u0075se\",\"name\":\"\\u0065cho\"}]}",
            // JSON lines (batch results) and SSE.
            "{\"a\":1}\n{\"result\":{\"message\":{\"content\":[{\"type\":\"tool_use\",\"name\":\"echo\"}]}}}\n",
            "event: x\ndata: {\"type\":\"content_block_start\",\"content_block\":{\"type\":\"tool_use\",\"name\":\"echo\"}}\n\n",
        ] {
            assert!(blocked(body).is_some(), "missed: {body}");
        }
    }

    #[test]
    fn json_that_may_hold_a_call_and_cannot_be_read_is_refused() {
        // What Python's `json` or `JSON.parse` read and serde_json does not (a call hidden in
        // it would pass the backstop): refused rather than passed unjudged.
        for body in [
            r#"{"content":[{"type":"tool_use","name":"echo","id":"\ud800"}]}"#,
            r#"{"content":[{"type":"tool_use","name":"echo","input":NaN}]}"#,
            "{\"custom_id\":\"r\",\"result\":{\"message\":{\"content\":[{\"type\":\"tool_use\",\"name\":\"echo\",\"x\":NaN}]}}}\n{\"a\":1}\n",
            "data: {\"type\":\"content_block_start\",\"index\":NaN,\"content_block\":{\"type\":\"tool_use\",\"name\":\"echo\"}}\n\n",
        ] {
            assert_eq!(blocked(body).as_deref(), Some("<unreadable>"), "{body}");
        }
        // A number past a double's range (Python and JavaScript read infinity) is read by its
        // text, so the call around it is judged by its name.
        for body in [
            r#"{"content":[{"type":"server_tool_use","name":"echo","input":{"n":1e400}}]}"#,
            "{\"custom_id\":\"r\",\"result\":{\"message\":{\"content\":[{\"type\":\"tool_use\",\"name\":\"echo\",\"x\":1e400}]}}}\n{\"a\":1}\n",
            "data: {\"type\":\"content_block_start\",\"index\":1e400,\"content_block\":{\"type\":\"tool_use\",\"name\":\"echo\"}}\n\n",
        ] {
            assert_eq!(blocked(body).as_deref(), Some("echo"), "{body}");
        }
        // Unreadable text that cannot hold a call, or is no JSON at all, is not judged.
        assert_eq!(blocked(r#"{"n":1e400}"#), None);
        assert_eq!(blocked("plain text about tool_use and 1e400"), None);
    }

    #[test]
    fn definitions_text_and_allowed_calls_are_not_calls() {
        for body in [
            // Tool definitions echoed by the Responses API, and Chat's.
            r#"{"tools":[{"type":"function","name":"echo","parameters":{}}]}"#,
            r#"{"tools":[{"type":"function","function":{"name":"echo"}}]}"#,
            r#"{"content":[{"type":"text","text":"call the tool_use named echo"}]}"#,
            r#"{"content":[{"type":"tool_use","name":"ping"}]}"#,
            "not json at all, tool_use echo",
        ] {
            assert_eq!(blocked(body), None, "{body}");
        }
    }

    #[test]
    fn calls_of_types_toolwall_does_not_read_are_refused_whatever_they_name() {
        for (body, kind) in [
            (
                r#"{"data":[{"type":"agent.custom_tool_use","id":"e","name":"ping","input":{}}]}"#,
                "agent.custom_tool_use",
            ),
            (
                r#"{"type":"agent.mcp_tool_use","mcp_server_name":"s","name":"ping"}"#,
                "agent.mcp_tool_use",
            ),
            (
                r#"{"data":[{"type":"chatkit.client_tool_call","name":"ping","arguments":"{}"}]}"#,
                "chatkit.client_tool_call",
            ),
            (
                r#"{"output":[{"type":"future_call","tool_name":"ping"}]}"#,
                "future_call",
            ),
        ] {
            let found = scan_body(body.as_bytes(), gate(&["echo"]).as_ref()).expect(body);
            assert!(found.decision.is_blocked(), "{body}");
            assert!(
                found.decision.reason.contains(kind),
                "{}",
                found.decision.reason
            );
        }
        // Call-like types that name no tool (a hosted tool's own item), and named objects of
        // other types, are not calls.
        for body in [
            r#"{"output":[{"type":"web_search_call","id":"w","status":"completed"}]}"#,
            r#"{"type":"response.custom_tool_call_input.delta","item_id":"i","delta":"x"}"#,
            r#"{"content":[{"type":"tool_reference","tool_name":"echo"}]}"#,
        ] {
            assert!(
                scan_body(body.as_bytes(), gate(&["echo"]).as_ref()).is_none(),
                "{body}"
            );
        }
    }

    #[test]
    fn a_hosted_tools_approval_request_is_a_call() {
        let body = r#"{"output":[{"type":"mcp_approval_request","id":"mcpr_1","server_label":"s","name":"echo","arguments":"{}"}]}"#;
        assert_eq!(blocked(body).as_deref(), Some("echo"));
        let body = r#"{"output":[{"type":"mcp_approval_request","id":"mcpr_1","server_label":"s","name":"ping","arguments":"{}"}]}"#;
        assert_eq!(blocked(body), None);
    }

    #[test]
    fn json_lines_end_at_every_line_end_a_reader_splits_at() {
        // A lone CR ends a line for both SDKs' JSONL readers: the call after it is a line.
        let body = "{\"custom_id\":\"a\",\"result\":{\"type\":\"errored\"}}\r{\"custom_id\":\"b\",\"result\":{\"type\":\"succeeded\",\"message\":{\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"echo\",\"input\":{}}]}}}\r";
        assert_eq!(blocked(body).as_deref(), Some("echo"));
    }
}
