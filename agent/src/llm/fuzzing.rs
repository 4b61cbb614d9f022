//! The oracle for the streaming interceptors, for the `cargo fuzz` target `llm_sse`
//! (`agent/fuzz`) and the randomised test below: whatever bytes the upstream sends, in whatever
//! pieces, in any dialect,
//!
//! - no call of a blocked tool reaches the client: no event of the output presents one (for
//!   Chat Completions, with the name pieces of each call joined as the SDKs join them);
//! - a well-formed input (SSE ending on an event boundary, every `data` JSON or `[DONE]`) gives
//!   a well-formed output;
//! - nothing panics.
//!
//! The oracle judges with `serde_json::Value` (what a typical SDK parses), not with the
//! interceptors' own borrowed parsers, so a disagreement between the two is a finding.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::{Dialect, Flow, OnMalformed, Output, SseDecoder, SseEvent, StreamInterceptor};
use crate::decision::{Action, CallQuery, Decision, Gate, ToolIdentity};

mod routes;

/// The tools blocked in oracle runs (a Codex namespaced call counts as `namespace__name`).
pub(crate) const BLOCKED: &[&str] = &["mcp__fs__delete", "Bash"];

/// Blocks exactly [`BLOCKED`]; every `mcp__` name is an MCP tool.
struct FuzzGate;

impl Gate for FuzzGate {
    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
        let name = match call.namespace {
            Some(ns) => format!("{ns}__{}", call.name),
            None => call.name.to_owned(),
        };
        let tool = name.starts_with("mcp__").then(|| ToolIdentity {
            server_id: "fs".into(),
            server_type: "stdio".into(),
            server_addr: String::new(),
            tool: name.rsplit("__").next().unwrap_or_default().to_owned(),
            tool_hash: String::new(),
        });
        let action = if BLOCKED.contains(&name.as_str()) {
            Action::Block
        } else {
            Action::Allow
        };
        Decision {
            action,
            reason: "fuzz".into(),
            tool,
            redact: Vec::new(),
            ask: None,
        }
    }

    fn needs_arguments(&self, _: &CallQuery<'_>) -> bool {
        false
    }

    fn dispatched(&self, _: &str, _: &serde_json::Value) -> Option<(String, serde_json::Value)> {
        None
    }

    fn declared_url(&self, _: &str) -> Option<String> {
        None
    }

    fn inspect_result(
        &self,
        _: &str,
        _: Option<&str>,
        _: &[u8],
    ) -> Option<crate::decision::ResultVerdict> {
        None
    }

    fn check_listed(&self, _: &str, _: &str, _: &Value) -> Decision {
        Decision::not_mcp()
    }
}

/// The `data` payloads of an SSE stream parsed as JSON (`[DONE]` skipped), or `None` if the
/// stream is not well-formed (a payload that is not JSON, or bytes after the last event).
pub(crate) fn well_formed(stream: &[u8]) -> Option<Vec<Value>> {
    let mut d = SseDecoder::new(usize::MAX);
    d.feed(Bytes::copy_from_slice(stream));
    let mut values = Vec::new();
    while let Some(ev) = d.next_event().ok()? {
        if let Some(data) = SseEvent::new(&ev).data() {
            if data.as_ref() == b"[DONE]" {
                continue;
            }
            values.push(serde_json::from_slice(&data).ok()?);
        }
    }
    d.finish().is_empty().then_some(values)
}

/// The `data` payloads of every event of a stream that parse as JSON (the others skipped).
fn parsed_events(stream: &[u8]) -> Vec<Value> {
    let mut d = SseDecoder::new(usize::MAX);
    d.feed(Bytes::copy_from_slice(stream));
    let mut values = Vec::new();
    let mut raws = Vec::new();
    while let Ok(Some(ev)) = d.next_event() {
        raws.push(ev);
    }
    raws.push(d.finish());
    for raw in raws {
        if let Some(data) = SseEvent::new(&raw).data()
            && let Ok(v) = serde_json::from_slice(&data)
        {
            values.push(v);
        }
    }
    values
}

/// The chunks Google's Python SDK reads from a Gemini stream (`google-genai`'s
/// `_iter_response_stream`, written again here): lines split at LF, CRLF and CR; consecutive
/// `data: ` lines joined by LF up to a blank line; every other line joined, without a
/// separator and across blank lines, into a chunk wherever its braces balance outside strings.
fn python_chunks(stream: &[u8]) -> Vec<Value> {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut data: Vec<&[u8]> = Vec::new();
    let (mut raw, mut depth, mut in_string, mut escaped) = (Vec::new(), 0i64, false, false);
    let mut rest = stream;
    while !rest.is_empty() {
        let end = rest
            .iter()
            .position(|&b| b == b'\n' || b == b'\r')
            .unwrap_or(rest.len());
        let line = &rest[..end];
        let skip = match rest.get(end..end + 2) {
            Some(b"\r\n") => 2,
            _ => 1,
        };
        rest = rest.get(end + skip..).unwrap_or_default();
        if line.is_empty() {
            if !data.is_empty() {
                chunks.push(data.join(&b'\n'));
                data.clear();
            }
        } else if let Some(value) = line.strip_prefix(b"data: ") {
            data.push(value);
        } else {
            for &c in line {
                match (in_string, escaped, c) {
                    (true, true, _) => escaped = false,
                    (true, false, b'\\') => escaped = true,
                    (true, false, b'"') => in_string = false,
                    (false, _, b'"') => in_string = true,
                    (false, _, b'{') => depth += 1,
                    (false, _, b'}') => depth -= 1,
                    _ => {}
                }
            }
            raw.extend_from_slice(line);
            if depth == 0 {
                chunks.push(std::mem::take(&mut raw));
                (in_string, escaped) = (false, false);
            }
        }
    }
    chunks.extend((!raw.is_empty()).then_some(raw));
    if !data.is_empty() {
        chunks.push(data.join(&b'\n'));
    }
    chunks
        .iter()
        .filter_map(|c| serde_json::from_slice(c).ok())
        .collect()
}

/// Every tool name the events present as a call to a client of `dialect`: Anthropic
/// `tool_use` blocks (streamed or in a message), Responses `function_call` items (namespace
/// joined), Gemini `functionCall` parts, or Chat Completions calls with their name pieces joined per choice and call index.
/// Another dialect's shapes are not calls to that client (its SDK dispatches on its own event
/// types and never reads them), so they are not counted.
pub(crate) fn called_names(dialect: Dialect, events: &[Value]) -> Vec<String> {
    let mut names = Vec::new();
    let mut chat: HashMap<(u64, u64), String> = HashMap::new();
    let anthropic_block = |b: &Value, names: &mut Vec<String>| {
        if b["type"] == "tool_use"
            && let Some(n) = b["name"].as_str()
        {
            names.push(n.to_owned());
        }
    };
    let responses_item = |item: &Value, names: &mut Vec<String>| {
        if item["type"] == "function_call" {
            let name = item["name"].as_str().unwrap_or_default();
            names.push(match item["namespace"].as_str() {
                Some(ns) => format!("{ns}__{name}"),
                None => name.to_owned(),
            });
        }
    };
    for v in events {
        if dialect == Dialect::Anthropic {
            anthropic_block(&v["content_block"], &mut names);
            for b in v["message"]["content"].as_array().into_iter().flatten() {
                anthropic_block(b, &mut names);
            }
            continue;
        }
        if dialect == Dialect::Gemini {
            gemini_calls(v, &mut names);
            continue;
        }
        if dialect == Dialect::OpenAiResponses {
            responses_item(&v["item"], &mut names);
            for item in v["response"]["output"].as_array().into_iter().flatten() {
                responses_item(item, &mut names);
            }
            continue;
        }
        for (ci, c) in v["choices"].as_array().into_iter().flatten().enumerate() {
            let choice = c["index"].as_u64().unwrap_or(ci as u64);
            for delta in [&c["delta"], &c["message"]] {
                for (ti, tc) in delta["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let index = tc["index"].as_u64().unwrap_or(ti as u64);
                    for part in [&tc["function"]["name"], &tc["custom"]["name"]] {
                        if let Some(part) = part.as_str() {
                            chat.entry((choice, index)).or_default().push_str(part);
                        }
                    }
                }
            }
        }
    }
    names.extend(chat.into_values());
    names
}

/// The calls a Gemini SDK reads from one response, or from each of a JSON array of them (the
/// array stream): every `functionCall` (or Python's `function_call`) part of every candidate.
fn gemini_calls(v: &Value, names: &mut Vec<String>) {
    if let Some(items) = v.as_array() {
        items.iter().for_each(|item| gemini_calls(item, names));
        return;
    }
    for candidate in v["candidates"].as_array().into_iter().flatten() {
        for part in candidate["content"]["parts"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for key in ["functionCall", "function_call"] {
                if let Some(n) = part[key]["name"].as_str() {
                    names.push(n.to_owned());
                }
            }
        }
    }
}

/// Runs `input` through an interceptor in pieces of the given lengths (cycled); the output.
pub(crate) fn intercept(
    dialect: Dialect,
    on_malformed: OnMalformed,
    input: &[u8],
    pieces: &[usize],
) -> Vec<u8> {
    let mut i = StreamInterceptor::new(dialect, Arc::new(FuzzGate), on_malformed, 1 << 20);
    let mut out = Output::default();
    let mut rest = input;
    let mut lens = pieces.iter().copied().filter(|&l| l > 0).cycle();
    let mut closed = false;
    while !rest.is_empty() {
        let len = lens.next().unwrap_or(rest.len()).min(rest.len());
        let (piece, tail) = rest.split_at(len);
        rest = tail;
        let flow = i.feed(Bytes::copy_from_slice(piece), &mut out);
        i.drain_records().for_each(drop);
        if flow == Flow::Closed {
            closed = true;
            break;
        }
    }
    if !closed {
        i.finish(&mut out);
    }
    out.take_all()
}

/// Checks the oracle for one input at one chunking; panics with the evidence on a violation.
pub(crate) fn check(dialect: Dialect, on_malformed: OnMalformed, input: &[u8], pieces: &[usize]) {
    let out = intercept(dialect, on_malformed, input, pieces);
    let mut readings = parsed_events(&out);
    if dialect == Dialect::Gemini {
        readings.extend(python_chunks(&out));
    }
    let leaked: Vec<String> = called_names(dialect, &readings)
        .into_iter()
        .filter(|n| BLOCKED.contains(&n.as_str()))
        .collect();
    assert!(
        leaked.is_empty(),
        "blocked call {leaked:?} reached the client ({dialect:?}, {on_malformed:?}, pieces {pieces:?})\ninput:  {:?}\noutput: {:?}",
        String::from_utf8_lossy(input),
        String::from_utf8_lossy(&out)
    );
    if well_formed(input).is_some() {
        assert!(
            well_formed(&out).is_some(),
            "well-formed input, malformed output ({dialect:?}, {on_malformed:?}, pieces {pieces:?})\ninput:  {:?}\noutput: {:?}",
            String::from_utf8_lossy(input),
            String::from_utf8_lossy(&out)
        );
    }
}

/// A whole response body as the proxy reads it (`proxy.rs`): by what it is, whatever its
/// label — a JSON document is rewritten (`rewrite_buffered`) and what would leave is judged by
/// the backstop (refused: nothing leaves); anything else is a stream. The oracle reads the
/// output as the SDKs read a JSON body (Python's `json`: a byte order mark skipped, the last of
/// a repeated key) and finds no blocked call in the dialect's buffered shapes.
pub(crate) fn check_body(dialect: Dialect, on_malformed: OnMalformed, body: &[u8]) {
    if super::backstop::opens_json(body) == Some(false) {
        return check(dialect, on_malformed, body, &[body.len()]);
    }
    let gate: Arc<dyn Gate> = Arc::new(FuzzGate);
    let out = match super::rewrite_buffered(dialect, body, gate.clone(), on_malformed) {
        Ok((new, _)) => new.unwrap_or_else(|| body.to_vec()),
        Err(_) => return,
    };
    if super::backstop::scan_body(&out, gate.as_ref()).is_some() {
        return;
    }
    let text = out.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&out);
    let Ok(value) = serde_json::from_slice::<Value>(text) else {
        return;
    };
    // The buffered shapes, as events the stream oracle reads.
    let as_event = match dialect {
        Dialect::Anthropic => serde_json::json!({ "message": value }),
        Dialect::OpenAiChat => value,
        Dialect::OpenAiResponses => serde_json::json!({ "response": value }),
        Dialect::Gemini => value,
    };
    let leaked: Vec<String> = called_names(dialect, &[as_event])
        .into_iter()
        .filter(|n| BLOCKED.contains(&n.as_str()))
        .collect();
    assert!(
        leaked.is_empty(),
        "blocked call {leaked:?} reached the client in a whole body ({dialect:?}, {on_malformed:?})\ninput:  {:?}\noutput: {:?}",
        String::from_utf8_lossy(body),
        String::from_utf8_lossy(&out)
    );
}

/// The fuzz entry point. The first byte picks the dialect (low two bits: Anthropic, Chat,
/// Responses, Gemini), the malformed-event
/// policy (bit 2), whether the rest is a whole body (bit 3: judged as the proxy judges a
/// body whatever its label, [`check_body`]) or a request and its answer (bit 4: the route
/// table and whole-document judging, `fuzzing/routes.rs`); the second seeds the chunking; the
/// rest is the upstream response, a stream checked whole and in pieces.
pub fn run(input: &[u8]) {
    let [control, seed, stream @ ..] = input else {
        return;
    };
    if control & 16 != 0 {
        return routes::check(stream);
    }
    let dialect = match control & 3 {
        0 => Dialect::Anthropic,
        1 => Dialect::OpenAiChat,
        2 => Dialect::OpenAiResponses,
        _ => Dialect::Gemini,
    };
    let on_malformed = if control & 4 == 0 {
        OnMalformed::FailClosed
    } else {
        OnMalformed::FailOpen
    };
    if control & 8 != 0 {
        return check_body(dialect, on_malformed, stream);
    }
    check(dialect, on_malformed, stream, &[stream.len()]);
    // Piece lengths from the seed: 1..=8 bytes, then longer, so event and line boundaries fall
    // anywhere.
    let mut x = u64::from(*seed) | 0x100;
    let pieces: Vec<usize> = (0..16)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x % if seed & 1 == 0 { 8 } else { 97 }) as usize
        })
        .collect();
    check(dialect, on_malformed, stream, &pieces);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oracle_sees_a_blocked_call_in_every_dialect() {
        let anthropic = br#"data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"mcp__fs__delete","input":{}}}"#;
        let chat = br#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"mcp__fs__"}}]}}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"delete"}}]}}]}
"#;
        let responses = br#"data: {"type":"response.output_item.added","item":{"type":"function_call","namespace":"mcp__fs","name":"delete"}}"#;
        let gemini = br#"data: {"candidates":[{"content":{"parts":[{"functionCall":{"name":"mcp__fs__delete","args":{}}}]}}]}"#;
        let cases = [
            (Dialect::Anthropic, &anthropic[..]),
            (Dialect::OpenAiChat, &chat[..]),
            (Dialect::OpenAiResponses, &responses[..]),
            (Dialect::Gemini, &gemini[..]),
        ];
        for (dialect, stream) in cases {
            let names = called_names(dialect, &parsed_events(stream));
            assert_eq!(names, ["mcp__fs__delete"], "{dialect:?}");
            // The same events are no call to another dialect's client.
            for (other, _) in cases.iter().filter(|(d, _)| *d != dialect) {
                assert!(called_names(*other, &parsed_events(stream)).is_empty());
            }
        }
    }

    /// The oracle reads a Gemini stream as Python's SDK does: lines outside data joined.
    #[test]
    fn oracle_reads_gemini_lines_as_pythons_sdk_does() {
        let split = b"data: {}\r\n\r\n{\"candidates\":[{\"content\":{\"parts\":[{\"function\r\nCall\":{\"name\":\"mcp__fs__delete\"}}]}}]}\r\n\r\n";
        assert_eq!(
            called_names(Dialect::Gemini, &python_chunks(split)),
            ["mcp__fs__delete"]
        );
        let mut input = vec![3, 0];
        input.extend_from_slice(split);
        run(&input);
    }

    /// The committed seeds of the fuzz target (`agent/fuzz/seeds/llm_sse`) are regression
    /// cases: each keeps the oracle.
    #[test]
    fn every_committed_seed_keeps_the_oracle() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/llm_sse");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("the seeds are committed") {
            let path = entry.expect("seed").path();
            run(&std::fs::read(&path).expect("read seed"));
            seen += 1;
        }
        assert!(seen >= 10, "{} seeds in {}", seen, dir.display());
    }

    #[test]
    fn whole_bodies_keep_the_oracle_whatever_they_are() {
        let bodies: [(u8, &[u8]); 6] = [
            (11, br#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"Bash","args":{}}}]}}]}"#),
            (11 | 4, br#"[{"candidates":[]},{"candidates":[{"content":{"parts":[{"function_call":{"name":"Bash"}}]}}]}]"#),
            (8, br#"{"content":[{"type":"tool_use","id":"t","name":"mcp__fs__delete","input":{}}],"stop_reason":"tool_use"}"#),
            (9, br#"{"choices":[{"index":0,"message":{"tool_calls":[{"id":"c","type":"custom","custom":{"name":"Bash","input":"x"}}]}}]}"#),
            (10, b"\xEF\xBB\xBF {\"output\":[{\"type\":\"function_call\",\"name\":\"x\",\"name\":\"Bash\",\"input\":0}]}"),
            (8 | 4, br#"{"content":[{"type":"text","text":"a"}],"content":[{"type":"tool_use","name":"Bash"}]}"#),
        ];
        for (control, body) in bodies {
            let mut input = vec![control, 0];
            input.extend_from_slice(body);
            run(&input);
        }
    }

    #[test]
    fn dialect_streams_keep_the_oracle_at_every_chunking() {
        let streams: [(u8, Vec<u8>); 4] = [
            (
                0,
                super::super::anthropic::tests::stream(&[
                    "mcp__fs__delete",
                    "mcp__fs__read",
                    "Bash",
                ]),
            ),
            (
                1,
                super::super::chat::tests::chunks(&[
                    r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"mcp__fs__del","arguments":""}}]},"finish_reason":null}"#,
                    r#"{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"ete","arguments":"{}"}}]},"finish_reason":null}"#,
                    r#"{"index":0,"delta":{},"finish_reason":"tool_calls"}"#,
                ]),
            ),
            (
                2,
                super::super::responses::tests::function_stream("mcp__fs", "delete"),
            ),
            (
                3,
                [
                    super::super::gemini::tests::chunk(
                        r#"{"functionCall":{"name":"mcp__fs__delete","args":{}}},{"functionCall":{"name":"mcp__fs__read","args":{}}}"#,
                        None,
                    ),
                    super::super::gemini::tests::chunk(r#"{"text":""}"#, Some("STOP")),
                ]
                .concat()
                .into_bytes(),
            ),
        ];
        for (control, stream) in streams {
            assert!(well_formed(&stream).is_some());
            for seed in 0..=255u8 {
                let mut input = vec![control, seed];
                input.extend_from_slice(&stream);
                run(&input);
            }
        }
    }
}
