//! The second line behind the dialect machines: whatever the route, the label or
//! the dialect, any JSON object in a response that has the shape of a tool call of any dialect
//! and names a blocked tool stops the response.
//!
//! The dialect machines (`anthropic.rs`, `chat.rs`, `responses.rs`, `buffered.rs`) know each
//! API's grammar and rewrite blocked calls in place; this module knows only call *shapes*, and
//! refuses instead of rewriting. It runs over every buffered body the proxy sends on an
//! inspected route (after the rewrite: what leaves is what is judged) and over every body of
//! the providers' other routes (message batch results, files, paths that do not exist yet).
//!
//! Call shapes (what the SDKs act on; a repeated key counts as its last value, as in Python's
//! `json` and JavaScript's `JSON.parse`):
//! - an object whose `type` is `tool_use`, `server_tool_use`, `mcp_tool_use` (Anthropic),
//!   `function_call`, `custom_tool_call` or `mcp_call` (Responses), by its `name` (with
//!   Codex's `namespace`, and an MCP block's `server_name` / `server_label`);
//! - an element of a `tool_calls` array or the value of a `function_call` key (Chat), by the
//!   `name` of its `function` or `custom` object, or its own `name` — outside a stream's
//!   `delta`, where a name is a fragment the SDKs join (the Chat machine judges joined names).
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

const CALL_TYPES: [&str; 6] = [
    "tool_use",
    "server_tool_use",
    "mcp_tool_use",
    "function_call",
    "custom_tool_call",
    "mcp_call",
];

/// Bytes that every call shape's JSON holds (`tool_` of `tool_use`, `tool_calls`,
/// `custom_tool_call`; `_call` of `function_call`, `mcp_call`), or behind which one could hide
/// (`\u` escapes): text without any of them cannot carry a call. Three searches, each built
/// once.
static MARKERS: LazyLock<[memmem::Finder<'static>; 3]> = LazyLock::new(|| {
    [
        memmem::Finder::new(b"tool_"),
        memmem::Finder::new(b"_call"),
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
    if str_of(map, "type").is_some_and(|t| CALL_TYPES.contains(&t))
        && let Some(name) = str_of(map, "name")
    {
        names.push((name.to_owned(), str_of(map, "namespace")));
        if let Some(server) = str_of(map, "server_name").or_else(|| str_of(map, "server_label")) {
            names.push((format!("mcp__{server}__{name}"), None));
        }
    }
    if !in_delta && matches!(key, Some("tool_calls" | "function_call")) {
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

/// JSON that may hold a call and that this reading cannot take (a number out of `f64`'s
/// range, nesting past 128, a lone surrogate, `NaN`: Python's `json` or `JSON.parse` read some
/// of them): what cannot be judged does not leave (forward only what was understood).
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
        Err(e) if looks_like_json(body) && !body.trim_ascii().contains(&b'\n') => {
            return Some(unreadable(&e));
        }
        Err(_) => {}
    }
    scan_lines(body, gate).or_else(|| scan_sse(body, gate))
}

/// Each line that looks like a JSON document, as one (JSON lines). Other lines (SSE fields,
/// text) are left to [`scan_sse`].
fn scan_lines(body: &[u8], gate: &dyn Gate) -> Option<Found> {
    body.split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
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

/// The backstop over a streamed body of a route no dialect machine reads (batch results,
/// files, unknown paths): complete lines are judged before they leave; a line that could hold
/// a call is held until it is complete (up to `max_line` bytes; past that, or when the start of
/// the line already left, the response is cut: fail closed); other bytes leave as they came
/// (slices of the reads, not copies).
pub(crate) struct LineGuard {
    /// The incomplete last line (or, of a line already partly passed on, its tail).
    held: Vec<u8>,
    /// The start of the held line was passed on (it held no marker then).
    partly_passed: bool,
    max_line: usize,
}

/// What [`LineGuard::feed`] decided.
#[derive(Debug)]
pub(crate) enum Guarded {
    /// These bytes may leave (in order).
    Pass(Vec<Bytes>),
    /// A blocked call: end the response here.
    Blocked(Found),
    /// A line that may hold a call cannot be judged (past the bound, or its start already
    /// left): end the response here.
    Unjudgeable,
}

impl LineGuard {
    pub(crate) fn new(max_line: usize) -> Self {
        LineGuard {
            held: Vec::new(),
            partly_passed: false,
            max_line,
        }
    }

    /// Judges the lines `input` completes; returns what may leave now.
    pub(crate) fn feed(&mut self, mut input: Bytes, gate: &dyn Gate) -> Guarded {
        let mut out = Vec::new();
        if !self.held.is_empty() || self.partly_passed {
            // Finish the held line first (a copy of one line at most).
            let Some(lf) = memchr::memchr(b'\n', &input) else {
                self.held.extend_from_slice(&input);
                return self.hold_tail(out);
            };
            let rest = input.split_off(lf + 1);
            self.held.extend_from_slice(&input);
            let line = std::mem::take(&mut self.held);
            if std::mem::take(&mut self.partly_passed) && may_hold_a_call(&line) {
                return Guarded::Unjudgeable;
            }
            if let Some(found) = judge_text(&line, gate) {
                return Guarded::Blocked(found);
            }
            out.push(Bytes::from(line));
            input = rest;
        }
        if let Some(lf) = memchr::memrchr(b'\n', &input) {
            let tail = input.split_off(lf + 1);
            if let Some(found) = judge_text(&input, gate) {
                return Guarded::Blocked(found);
            }
            out.push(input);
            input = tail;
        }
        self.held.extend_from_slice(&input);
        self.hold_tail(out)
    }

    /// The incomplete line in `held`: kept whole up to the bound (so a line is judged whole
    /// whatever it holds); past it, cut if it may hold a call, else passed on but for a tail
    /// long enough to complete a marker split over reads (a binary file with no line ends).
    fn hold_tail(&mut self, mut out: Vec<Bytes>) -> Guarded {
        if self.held.len() <= self.max_line && !self.partly_passed {
            return Guarded::Pass(out);
        }
        if may_hold_a_call(&self.held) {
            return Guarded::Unjudgeable;
        }
        let keep = self.held.len().min(MARKER_TAIL);
        let tail = self.held.split_off(self.held.len() - keep);
        let passed = std::mem::replace(&mut self.held, tail);
        if !passed.is_empty() {
            self.partly_passed = true;
            out.push(Bytes::from(passed));
        }
        Guarded::Pass(out)
    }

    /// Bytes of the incomplete line held now (counted against the proxy's memory budget).
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// The end of the body: the last line, judged.
    pub(crate) fn finish(&mut self, gate: &dyn Gate) -> Guarded {
        let rest = std::mem::take(&mut self.held);
        if self.partly_passed && may_hold_a_call(&rest) {
            return Guarded::Unjudgeable;
        }
        match judge_text(&rest, gate) {
            Some(found) => Guarded::Blocked(found),
            None => Guarded::Pass(vec![Bytes::from(rest)]),
        }
    }
}

/// Complete lines, as JSON lines and as SSE events.
pub(crate) fn judge_text(text: &[u8], gate: &dyn Gate) -> Option<Found> {
    if !may_hold_a_call(text) {
        return None;
    }
    scan_lines(text, gate).or_else(|| scan_sse(text, gate))
}

/// Bytes kept back from an unheld line: one less than the longest marker.
const MARKER_TAIL: usize = b"tool_".len() - 1;

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
            r#"{"content":[{"type":"server_tool_use","name":"echo","input":{"n":1e400}}]}"#,
            r#"{"content":[{"type":"tool_use","name":"echo","id":"\ud800"}]}"#,
            r#"{"content":[{"type":"tool_use","name":"echo","input":NaN}]}"#,
            "{\"custom_id\":\"r\",\"result\":{\"message\":{\"content\":[{\"type\":\"tool_use\",\"name\":\"echo\",\"x\":1e400}]}}}\n{\"a\":1}\n",
            "data: {\"type\":\"content_block_start\",\"index\":1e400,\"content_block\":{\"type\":\"tool_use\",\"name\":\"echo\"}}\n\n",
        ] {
            assert_eq!(blocked(body).as_deref(), Some("<unreadable>"), "{body}");
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

    fn passed(g: Guarded) -> Vec<u8> {
        match g {
            Guarded::Pass(v) => v.concat(),
            other => panic!("expected Pass, got {other:?}"),
        }
    }

    #[test]
    fn the_line_guard_holds_only_lines_that_may_hold_a_call() {
        let g = gate(&["echo"]);
        let g = g.as_ref();
        let feed = |guard: &mut LineGuard, b: &'static [u8]| guard.feed(Bytes::from_static(b), g);
        let mut guard = LineGuard::new(1024);
        let out = passed(feed(&mut guard, b"{\"a\":\"plain\"}\n{\"b\":"));
        assert!(
            out.starts_with(b"{\"a\":\"plain\"}\n"),
            "complete lines leave"
        );
        // A call split over reads, its marker too: held, then judged whole.
        let held = passed(feed(&mut guard, b"[{\"type\":\"tool_u"));
        assert!(held.is_empty(), "{held:?}");
        assert!(matches!(
            feed(&mut guard, b"se\",\"name\":\"echo\"}]}\n"),
            Guarded::Blocked(_)
        ));
        // An allowed call on a held line leaves whole, once complete.
        let mut guard = LineGuard::new(1024);
        assert!(passed(feed(&mut guard, b"{\"type\":\"tool_use\",")).is_empty());
        assert_eq!(
            passed(feed(&mut guard, b"\"name\":\"ping\"}\nnext")),
            b"{\"type\":\"tool_use\",\"name\":\"ping\"}\n".to_vec()
        );
        assert_eq!(passed(guard.finish(g)), b"next".to_vec());
        // Bounded.
        let mut guard = LineGuard::new(64);
        let long: &'static [u8] = Box::leak(
            [b"{\"type\":\"tool_use\",\"x\":\"".as_slice(), &[b'y'; 100]]
                .concat()
                .into_boxed_slice(),
        );
        assert!(matches!(feed(&mut guard, long), Guarded::Unjudgeable));
        // The last line, at the end.
        let mut guard = LineGuard::new(64);
        assert!(
            passed(feed(
                &mut guard,
                b"{\"type\":\"tool_use\",\"name\":\"echo\"}"
            ))
            .is_empty()
        );
        assert!(matches!(guard.finish(g), Guarded::Blocked(_)));
        // A line past the bound with no marker is passed on; a marker after that cannot be
        // judged.
        let mut guard = LineGuard::new(64);
        assert!(passed(feed(&mut guard, &[b'x'; 200])).len() > 150);
        assert!(matches!(
            feed(&mut guard, b"\"type\":\"tool_use\"}\n"),
            Guarded::Unjudgeable
        ));
    }

    #[test]
    fn the_line_guard_passes_clean_reads_uncopied() {
        let g = gate(&["echo"]);
        let mut guard = LineGuard::new(64);
        let read = Bytes::from_static(b"data: {\"type\":\"text\"}\n\ndata: more\n\n");
        let Guarded::Pass(out) = guard.feed(read.clone(), g.as_ref()) else {
            panic!("passes");
        };
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].as_ptr(), read.as_ptr());
    }
}
