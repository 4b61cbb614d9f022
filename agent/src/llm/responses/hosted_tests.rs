//! Hosted MCP approval requests (`mcp_approval_request`): judged like calls, buffered and
//! streamed.

use serde_json::Value;

use crate::decision::Action;
use crate::llm::buffered::rewrite_buffered;
use crate::llm::testing::{assert_split_invariant, data_values, gate, run, sse};
use crate::llm::{Dialect, OnMalformed};

fn request_item(id: &str, tool: &str) -> String {
    format!(
        r#"{{"id":"{id}","type":"mcp_approval_request","server_label":"s","name":"{tool}","arguments":"{{\"a\":1}}"}}"#
    )
}

/// A stream proposing `tool` of server `s` for approval (added, done, completed).
fn approval_stream(id: &str, tool: &str) -> Vec<u8> {
    let item = request_item(id, tool);
    let events = [
        (
            "response.created",
            r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}"#.to_owned(),
        ),
        (
            "response.output_item.added",
            format!(r#"{{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{item}}}"#),
        ),
        (
            "response.output_item.done",
            format!(r#"{{"type":"response.output_item.done","sequence_number":2,"output_index":0,"item":{item}}}"#),
        ),
        (
            "response.completed",
            format!(r#"{{"type":"response.completed","sequence_number":3,"response":{{"id":"resp_1","object":"response","status":"completed","output":[{item}]}}}}"#),
        ),
    ];
    let refs: Vec<(&str, &str)> = events.iter().map(|(n, d)| (*n, d.as_str())).collect();
    sse(&refs)
}

fn item_types(values: &[Value]) -> Vec<String> {
    values
        .iter()
        .filter_map(|v| v.get("item").or_else(|| v.pointer("/response/output/0")))
        .map(|i| i["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn a_streamed_approval_request_for_a_denied_tool_becomes_a_message() {
    let input = approval_stream("mcpr_stream_1", "echo");
    let out = assert_split_invariant(Dialect::OpenAiResponses, &["mcp__s__echo"], &input);
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("mcp_approval_request"), "{text}");
    let values = data_values(&out);
    assert!(
        item_types(&values).iter().all(|t| t == "message"),
        "{values:?}"
    );
    assert!(text.contains("mcp__s__echo"), "{text}");
    let (_, records) = run(Dialect::OpenAiResponses, &["mcp__s__echo"], &input);
    let seen: Vec<(&str, Action, &str)> = records
        .iter()
        .map(|r| {
            (
                r.tool_name.as_str(),
                r.decision.action,
                r.tool_call_id.as_str(),
            )
        })
        .collect();
    assert_eq!(seen, [("mcp__s__echo", Action::Block, "mcpr_stream_1")]);
}

#[test]
fn a_streamed_approval_request_for_an_allowed_tool_passes_and_is_recorded_once() {
    let input = approval_stream("mcpr_stream_2", "add");
    let (out, records) = run(Dialect::OpenAiResponses, &["mcp__s__echo"], &input);
    assert_eq!(out, input);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].tool_name, "mcp__s__add");
    assert_eq!(records[0].decision.action, Action::Allow);
    assert_eq!(records[0].input, Some(serde_json::json!({"a": 1})));
}

#[test]
fn an_approval_request_renamed_at_done_is_judged_again() {
    let mut input = approval_stream("mcpr_stream_3", "add");
    let text = String::from_utf8(input.clone()).expect("utf8");
    // `done` and `completed` carry the denied tool under the same id.
    let (head, tail) = text.split_at(text.find("response.output_item.done").expect("done"));
    input = format!(
        "{head}{}",
        tail.replace(r#""name":"add""#, r#""name":"echo""#)
    )
    .into_bytes();
    let (out, records) = run(Dialect::OpenAiResponses, &["mcp__s__echo"], &input);
    let values = data_values(&out);
    let types = item_types(&values);
    assert_eq!(types[0], "mcp_approval_request");
    assert!(types[1..].iter().all(|t| t == "message"), "{types:?}");
    assert!(
        records
            .iter()
            .any(|r| r.tool_name == "mcp__s__echo" && r.decision.is_blocked())
    );
}

#[test]
fn a_buffered_approval_request_for_a_denied_tool_becomes_a_message() {
    let body = format!(
        r#"{{"id":"resp_1","object":"response","status":"completed","output":[{},{}]}}"#,
        request_item("mcpr_buf_1", "echo"),
        request_item("mcpr_buf_2", "add")
    );
    let (new, records) = rewrite_buffered(
        Dialect::OpenAiResponses,
        body.as_bytes(),
        gate(&["mcp__s__echo"]),
        OnMalformed::FailClosed,
    )
    .expect("inspectable");
    let v: Value = serde_json::from_slice(&new.expect("rewritten")).expect("json");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][1]["type"], "mcp_approval_request");
    let seen: Vec<(String, Action)> = records
        .into_iter()
        .map(|r| (r.tool_name, r.decision.action))
        .collect();
    assert_eq!(
        seen,
        [
            ("mcp__s__echo".to_owned(), Action::Block),
            ("mcp__s__add".to_owned(), Action::Allow)
        ]
    );
}
