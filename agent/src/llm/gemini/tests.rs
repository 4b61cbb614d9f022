use serde_json::{Value, json};

use crate::decision::Action;
use crate::llm::testing::{assert_split_invariant, data_values, gate, run, run_failing_open};
use crate::llm::{Dialect, OnMalformed, rewrite_buffered};

/// A streamed chunk as the API sends it (`alt=sse`: one `data:` line, CRLF ends).
pub(crate) fn chunk(parts: &str, finish: Option<&str>) -> String {
    let finish = finish.map_or(String::new(), |f| format!(",\"finishReason\":\"{f}\""));
    format!(
        "data: {{\"candidates\":[{{\"content\":{{\"parts\":[{parts}],\"role\":\"model\"}}{finish},\"index\":0}}],\"usageMetadata\":{{\"promptTokenCount\":5,\"totalTokenCount\":9}},\"modelVersion\":\"gemini-2.5-flash\",\"responseId\":\"r1\"}}\r\n\r\n"
    )
}

fn call(name: &str, args: &str) -> String {
    format!(r#"{{"functionCall":{{"id":"c-{name}","name":"{name}","args":{args}}}}}"#)
}

/// What the SDKs read from a stream: every chunk's parts, per candidate, in order.
fn parts(stream: &[u8]) -> Vec<Value> {
    data_values(stream)
        .into_iter()
        .flat_map(|v| {
            v["candidates"][0]["content"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

fn names(parts: &[Value]) -> Vec<&str> {
    parts
        .iter()
        .filter_map(|p| p["functionCall"]["name"].as_str())
        .collect()
}

#[test]
fn a_blocked_call_becomes_text_and_allowed_ones_leave_as_they_came() {
    let input = [
        chunk(r#"{"text":"Let me look."}"#, None),
        chunk(
            &format!(
                "{},{}",
                call("mcp__fs__delete", r#"{"path":"/"}"#),
                call("mcp__fs__read", r#"{"path":"/a"}"#)
            ),
            None,
        ),
        chunk(r#"{"text":""}"#, Some("STOP")),
    ]
    .concat();
    let out = assert_split_invariant(Dialect::Gemini, &["mcp__fs__delete"], input.as_bytes());
    let parts = parts(&out);
    assert_eq!(names(&parts), ["mcp__fs__read"]);
    assert_eq!(
        parts[1]["text"],
        "[toolwall] Tool 'mcp__fs__delete' blocked by policy: denied by test"
    );
    assert_eq!(parts[2]["functionCall"]["args"], json!({"path": "/a"}));
    // Chunks without a call leave as they came but for toolwall's line ends.
    let text = String::from_utf8_lossy(&out);
    let lf = |c: String| c.replace("\r\n", "\n");
    assert!(text.starts_with(&lf(chunk(r#"{"text":"Let me look."}"#, None))));
    assert!(text.ends_with(&lf(chunk(r#"{"text":""}"#, Some("STOP")))));
    let (_, records) = run(Dialect::Gemini, &["mcp__fs__delete"], input.as_bytes());
    let got: Vec<(&str, &str, Action)> = records
        .iter()
        .map(|r| {
            (
                r.tool_name.as_str(),
                r.tool_call_id.as_str(),
                r.decision.action,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("mcp__fs__delete", "c-mcp__fs__delete", Action::Block),
            ("mcp__fs__read", "c-mcp__fs__read", Action::Allow)
        ]
    );
    assert_eq!(records[1].input, Some(json!({"path": "/a"})));
}

#[test]
fn every_chunk_leaves_as_one_data_line_of_what_was_judged() {
    let input = [
        chunk(&call("mcp__fs__read", "{}"), None),
        chunk(r#"{"text":"ok"}"#, Some("STOP")),
    ]
    .concat();
    let out = assert_split_invariant(Dialect::Gemini, &["mcp__fs__delete"], input.as_bytes());
    // Every chunk is written by toolwall: one data line, LF ends, the JSON as it came.
    assert_eq!(String::from_utf8_lossy(&out), input.replace("\r\n", "\n"));
    // A chunk with line breaks between its tokens leaves on one line: Python's SDK reads
    // each `data:` line as a chunk of its own.
    let spread = "data: {\"candidates\":\ndata: [{\"content\":{\"parts\":[{\"functionCall\":{\"name\":\"mcp__fs__read\"}}]}}]}\n\n";
    let (out, _) = run(Dialect::Gemini, &[], spread.as_bytes());
    assert_eq!(
        String::from_utf8_lossy(&out),
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":{\"name\":\"mcp__fs__read\"}}]}}]}\n\n"
    );
}

#[test]
fn a_call_outside_the_data_lines_never_leaves() {
    let call =
        r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"mcp__fs__delete"}}]}}]}"#;
    // Python's SDK takes a bare JSON line for a chunk: beside data, and as an event of its own.
    for input in [
        format!("data: {{\"candidates\":[]}}\n{call}\n\n"),
        format!("{call}\n\n"),
        format!("event: x\n{call}\n\n"),
    ] {
        let out = assert_split_invariant(Dialect::Gemini, &["mcp__fs__delete"], input.as_bytes());
        let text = String::from_utf8_lossy(&out);
        assert!(!text.contains("functionCall"), "{input:?} gave {text:?}");
    }
    // fail_open passes data it cannot read, never the lines beside it.
    let broken = format!("data: {{\"candidates\"\n{call}\n\n");
    let out = run_failing_open(Dialect::Gemini, &["mcp__fs__delete"], broken.into_bytes());
    assert!(!out.contains("functionCall"), "{out}");
}

#[test]
fn every_candidate_and_both_spellings_are_judged() {
    let body = r#"{"candidates":[{"content":{"parts":[{"text":"a"}]},"index":0},{"content":{"parts":[{"function_call":{"name":"Bash","args":{"c":"rm"}},"thoughtSignature":"c2ln"}]},"index":1}]}"#;
    let input = format!("data: {body}\n\n");
    let out = assert_split_invariant(Dialect::Gemini, &["Bash"], input.as_bytes());
    let v = &data_values(&out)[0];
    assert_eq!(v["candidates"][0]["content"]["parts"][0]["text"], "a");
    let replaced = &v["candidates"][1]["content"]["parts"][0];
    assert!(replaced.get("function_call").is_none());
    assert_eq!(replaced["thoughtSignature"], "c2ln", "the signature stays");
    assert!(
        replaced["text"]
            .as_str()
            .is_some_and(|t| t.contains("Bash"))
    );
}

#[test]
fn calls_it_cannot_judge_whole_or_read_end_the_stream() {
    for event in [
        // Streamed arguments: not whole when they leave.
        r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"mcp__fs__read","partialArgs":[{"jsonPath":"$.p","stringValue":"/"}],"willContinue":true}}]}}]}"#,
        r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"mcp__fs__read","will_continue":true}}]}}]}"#,
        // A repeated key: the SDKs read the last.
        r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"mcp__fs__read","name":"mcp__fs__delete"}}]}}]}"#,
        // Both spellings of one field.
        r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"x","partialArgs":[],"partial_args":[]}}]}}]}"#,
        // Not JSON, and two responses in one event's data.
        r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"mcp__fs__delete""#,
        "{\"candidates\":[]}\ndata: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":{\"name\":\"mcp__fs__delete\"}}]}}]}",
    ] {
        let input = format!(
            "data: {{\"candidates\":[{{\"content\":{{\"parts\":[{{\"text\":\"hi\"}}]}}}}]}}\n\ndata: {event}\n\n"
        );
        let (out, _) = run(Dialect::Gemini, &["mcp__fs__delete"], input.as_bytes());
        let values = data_values(&out);
        assert_eq!(values.len(), 2, "{event}");
        assert_eq!(values[1]["error"]["status"], "INTERNAL", "{event}");
        assert!(names(&parts(&out)).is_empty(), "{event}");
    }
    // Not JSON at all, fail_open: the SDKs read no call from it either, so it may pass; the
    // backstop still refuses what could hold a blocked one.
    let broken = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":{\"name\":\"mcp__fs__delete\"\n\n";
    let out = run_failing_open(
        Dialect::Gemini,
        &["mcp__fs__delete"],
        broken.as_bytes().to_vec(),
    );
    assert!(out.contains("\"error\""), "{out}");
}

#[test]
fn whole_bodies_and_the_array_stream_are_judged_alike() {
    let one = r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"mcp__fs__delete","args":{}}},{"functionCall":{"name":"mcp__fs__read","args":{"p":1}}}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":1}}"#;
    let (new, records) = rewrite_buffered(
        Dialect::Gemini,
        one.as_bytes(),
        gate(&["mcp__fs__delete"]),
        OnMalformed::FailClosed,
    )
    .expect("judged");
    let v: Value = serde_json::from_slice(&new.expect("changed")).expect("json");
    let parts = v["candidates"][0]["content"]["parts"]
        .as_array()
        .expect("parts");
    assert_eq!(names(parts), ["mcp__fs__read"]);
    assert_eq!(v["usageMetadata"]["promptTokenCount"], 1);
    assert_eq!(records.len(), 2);
    // `streamGenerateContent` without `alt=sse`: a JSON array of responses.
    let array = format!(
        "[{one},\r\n{}]",
        r#"{"candidates":[{"content":{"parts":[{"text":"x"}]}}]}"#
    );
    let (new, _) = rewrite_buffered(
        Dialect::Gemini,
        array.as_bytes(),
        gate(&["mcp__fs__delete"]),
        OnMalformed::FailClosed,
    )
    .expect("judged");
    let v: Value = serde_json::from_slice(&new.expect("changed")).expect("json");
    assert_eq!(v.as_array().map(Vec::len), Some(2));
    assert_eq!(v[1]["candidates"][0]["content"]["parts"][0]["text"], "x");
    // Nothing blocked: the body leaves as it came.
    let (new, _) = rewrite_buffered(
        Dialect::Gemini,
        array.as_bytes(),
        gate(&[]),
        OnMalformed::FailClosed,
    )
    .expect("judged");
    assert!(new.is_none());
    // A call with streamed arguments in a whole body cannot be judged either.
    let partial = r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"x","partialArgs":[]}}]}}]}"#;
    assert!(
        rewrite_buffered(
            Dialect::Gemini,
            partial.as_bytes(),
            gate(&[]),
            OnMalformed::FailOpen
        )
        .is_err()
    );
}

#[test]
fn argument_rules_judge_the_whole_arguments() {
    let input = [
        chunk(&call("mcp__fs__guarded", r#"{"a":"SECRET_2"}"#), None),
        chunk(&call("mcp__fs__guarded", r#"{"a":"SECRET_1"}"#), None),
    ]
    .concat();
    let (out, records) = run(Dialect::Gemini, &[], input.as_bytes());
    let parts = parts(&out);
    assert_eq!(names(&parts), ["mcp__fs__guarded"]);
    assert_eq!(records[0].decision.action, Action::Block);
    // The redacted value never reaches the record.
    assert_eq!(records[1].decision.action, Action::Allow);
    assert_ne!(records[1].input, Some(json!({"a": "SECRET_1"})));
}

/// Python's SDK joins every line that is not a `data: ` line, across events and without a
/// separator, into chunks where the braces balance: a key split over such lines is whole there.
#[test]
fn lines_outside_data_are_read_as_pythons_sdk_reads_them() {
    let text = r#"data: {"candidates":[{"content":{"parts":[{"text":"a"}]}}]}"#;
    for input in [
        format!(
            "{text}\r\n\r\n{{\"candidates\":[{{\"content\":{{\"parts\":[{{\"function\r\nCall\":{{\"name\":\"mcp__fs__delete\"}}}}]}}}}]}}\r\n\r\n{text}\r\n\r\n"
        ),
        format!(
            "{text}\n\n{{\"candidates\":[{{\"content\":{{\"parts\":[{{\"function_\ncall\":{{\"name\":\"mcp__fs__delete\"}}}}]}}}}]}}\n\n"
        ),
        // Halves in events of their own.
        format!(
            "{text}\n\n{{\"candidates\":[{{\"content\":{{\"parts\":[{{\"function\n\nCall\":{{\"name\":\"mcp__fs__delete\"}}}}]}}}}]}}\n\n"
        ),
        // `data:` without the space is no data line to Python.
        "data:{\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":{\"name\":\"mcp__fs__delete\"}}]}}]}\n\n".to_owned(),
    ] {
        let out = assert_split_invariant(Dialect::Gemini, &["mcp__fs__delete"], input.as_bytes());
        let text = String::from_utf8_lossy(&out);
        // Every line that leaves is toolwall's own `data: ` line, and no call of a denied tool.
        assert!(
            text.lines()
                .all(|l| l.is_empty() || l.starts_with("data: ")),
            "{input:?} gave {text:?}"
        );
        assert!(
            !text.contains("\"name\":\"mcp__fs__delete\""),
            "{input:?} gave {text:?}"
        );
    }
    // A mid-stream error as the API sends it (pretty-printed, no `data:`) reaches both SDKs.
    let error = "{\n  \"error\": {\n    \"code\": 429,\n    \"message\": \"slow down\",\n    \"status\": \"RESOURCE_EXHAUSTED\"\n  }\n}\n\n";
    let (out, _) = run(Dialect::Gemini, &[], error.as_bytes());
    assert_eq!(
        String::from_utf8_lossy(&out),
        "data: {\"error\":{\"code\":429,\"message\":\"slow down\",\"status\":\"RESOURCE_EXHAUSTED\"}}\n\n"
    );
    // A line outside data that is no JSON: Python's SDK fails on it, the stream ends.
    let (out, _) = run(Dialect::Gemini, &[], b": keep-alive\n\ndata: {}\n\n");
    assert!(String::from_utf8_lossy(&out).contains("\"status\":\"INTERNAL\""));
}

#[test]
fn calls_of_a_response_that_cannot_pass_are_recorded_as_refused() {
    for event in [
        r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"mcp__fs__read","name":"mcp__fs__delete"}}]}}]}"#,
        r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"mcp__fs__delete","partialArgs":[],"willContinue":true}}]}}]}"#,
    ] {
        let (_, records) = run(
            Dialect::Gemini,
            &[],
            format!("data: {event}\n\n").as_bytes(),
        );
        let got: Vec<(&str, Action)> = records
            .iter()
            .map(|r| (r.tool_name.as_str(), r.decision.action))
            .collect();
        assert_eq!(got, [("mcp__fs__delete", Action::Block)], "{event}");
    }
}
