use serde_json::Value;

use super::mcp_references;
use crate::decision::Action;
use crate::llm::Dialect;
use crate::llm::testing::{assert_split_invariant, data_values, run, sse};

mod rejudged;

fn ev(ty: &str, rest: &str) -> (String, String) {
    (ty.to_owned(), format!(r#"{{"type":"{ty}",{rest}}}"#))
}

/// A Codex-like stream: a message item then a function_call (namespace + name) at index 1.
pub(crate) fn function_stream(namespace: &str, name: &str) -> Vec<u8> {
    function_stream_changing((namespace, name), (namespace, name), (namespace, name))
}

/// [`function_stream`] whose call carries one (namespace, name) at `output_item.added`,
/// another at `output_item.done` and a third in `response.completed`.
fn function_stream_changing(
    added: (&str, &str),
    done: (&str, &str),
    completed: (&str, &str),
) -> Vec<u8> {
    let ((namespace, name), (done_ns, done_name)) = (added, done);
    let item = format!(
        r#""id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"call_1","name":"{name}","namespace":"{namespace}""#
    );
    let done_item = format!(
        r#""id":"fc_1","type":"function_call","status":"completed","arguments":"{{\"a\":\"SECRET\"}}","call_id":"call_1","name":"{done_name}","namespace":"{done_ns}""#
    );
    let final_item = format!(
        r#""id":"fc_1","type":"function_call","status":"completed","arguments":"{{\"a\":\"SECRET\"}}","call_id":"call_1","name":"{}","namespace":"{}""#,
        completed.1, completed.0
    );
    let events = vec![
        ev(
            "response.created",
            r#""sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}"#,
        ),
        ev(
            "response.output_item.added",
            r#""sequence_number":1,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}"#,
        ),
        ev(
            "response.content_part.added",
            r#""sequence_number":2,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}"#,
        ),
        ev(
            "response.output_text.delta",
            r#""sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Sure.","logprobs":[]"#,
        ),
        ev(
            "response.output_text.done",
            r#""sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"text":"Sure.","logprobs":[]"#,
        ),
        ev(
            "response.content_part.done",
            r#""sequence_number":5,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"Sure.","annotations":[]}"#,
        ),
        ev(
            "response.output_item.done",
            r#""sequence_number":6,"output_index":0,"item":{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Sure.","annotations":[]}]}"#,
        ),
        ev(
            "response.output_item.added",
            &format!(r#""sequence_number":7,"output_index":1,"item":{{{item}}}"#),
        ),
        ev(
            "response.function_call_arguments.delta",
            r#""sequence_number":8,"item_id":"fc_1","output_index":1,"delta":"{\"a\":\"SEC""#,
        ),
        ev(
            "response.function_call_arguments.delta",
            r#""sequence_number":9,"item_id":"fc_1","output_index":1,"delta":"RET\"}""#,
        ),
        ev(
            "response.function_call_arguments.done",
            r#""sequence_number":10,"item_id":"fc_1","output_index":1,"arguments":"{\"a\":\"SECRET\"}""#,
        ),
        ev(
            "response.output_item.done",
            &format!(r#""sequence_number":11,"output_index":1,"item":{{{done_item}}}"#),
        ),
        ev(
            "response.completed",
            &format!(
                r#""sequence_number":12,"response":{{"id":"resp_1","object":"response","status":"completed","output":[{{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{{"type":"output_text","text":"Sure.","annotations":[]}}]}},{{{final_item}}}],"usage":{{"input_tokens":1,"output_tokens":2}}}}"#
            ),
        ),
    ];
    let refs: Vec<(&str, &str)> = events
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    sse(&refs)
}

/// Codex code mode: a custom `exec` tool call whose JS calls an MCP tool.
pub(crate) fn custom_stream(code_json: &str) -> Vec<u8> {
    let events = [
        ev(
            "response.created",
            r#""sequence_number":0,"response":{"id":"resp_1","output":[]}"#,
        ),
        ev(
            "response.output_item.added",
            r#""sequence_number":1,"output_index":0,"item":{"id":"ctc_1","type":"custom_tool_call","status":"in_progress","call_id":"call_9","name":"exec","input":""}"#,
        ),
        ev(
            "response.custom_tool_call_input.delta",
            &format!(
                r#""sequence_number":2,"item_id":"ctc_1","output_index":0,"delta":{code_json}"#
            ),
        ),
        ev(
            "response.custom_tool_call_input.done",
            &format!(
                r#""sequence_number":3,"item_id":"ctc_1","output_index":0,"input":{code_json}"#
            ),
        ),
        ev(
            "response.output_item.done",
            &format!(
                r#""sequence_number":4,"output_index":0,"item":{{"id":"ctc_1","type":"custom_tool_call","status":"completed","call_id":"call_9","name":"exec","input":{code_json}}}"#
            ),
        ),
        ev(
            "response.completed",
            &format!(
                r#""sequence_number":5,"response":{{"id":"resp_1","output":[{{"id":"ctc_1","type":"custom_tool_call","status":"completed","call_id":"call_9","name":"exec","input":{code_json}}}]}}"#
            ),
        ),
    ];
    let refs: Vec<(&str, &str)> = events
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    sse(&refs)
}

/// The items of the `response.completed` events' output.
fn completed_output(values: &[Value]) -> impl Iterator<Item = Value> + '_ {
    values
        .iter()
        .filter(|v| v["type"] == "response.completed")
        .flat_map(|v| {
            v["response"]["output"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
}

fn output_types(values: &[Value]) -> Vec<String> {
    completed_output(values)
        .filter_map(|i| i["type"].as_str().map(str::to_owned))
        .collect()
}

/// Simulates an SDK's accumulation: every `output_text.delta` must land on a message item at
/// its `output_index`, and every item added is done.
fn check_consistent(values: &[Value]) {
    let mut open: Vec<(u64, String)> = Vec::new();
    for v in values {
        let ty = v["type"].as_str().unwrap_or_default();
        let index = v["output_index"].as_u64();
        match ty {
            "response.output_item.added" => {
                open.push((
                    index.expect("index"),
                    v["item"]["type"].as_str().unwrap_or_default().to_owned(),
                ));
            }
            "response.output_text.delta" => {
                let i = index.expect("index");
                assert!(
                    open.iter().any(|(oi, t)| *oi == i && t == "message"),
                    "delta for a non-message item: {v}"
                );
            }
            "response.function_call_arguments.delta" => {
                let i = index.expect("index");
                assert!(
                    open.iter().any(|(oi, t)| *oi == i && t == "function_call"),
                    "arguments for a non-call item: {v}"
                );
            }
            "response.output_item.done" => {
                let i = index.expect("index");
                let pos = open
                    .iter()
                    .position(|(oi, _)| *oi == i)
                    .expect("done after added");
                assert_eq!(open[pos].1, v["item"]["type"].as_str().unwrap_or_default());
                open.remove(pos);
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "items left open: {open:?}");
}

#[test]
fn function_calls_with_namespace() {
    struct Case {
        name: &'static str,
        blocked: &'static [&'static str],
        want_types: &'static [&'static str],
        identical: bool,
        record: Option<(&'static str, Action)>,
    }
    let cases = [
        Case {
            name: "blocked MCP function (namespace + name)",
            blocked: &["mcp__everything__get_sum"],
            want_types: &["message", "message"],
            identical: false,
            record: Some(("mcp__everything__get_sum", Action::Block)),
        },
        Case {
            name: "allowed MCP function",
            blocked: &[],
            want_types: &["message", "function_call"],
            identical: true,
            record: Some(("mcp__everything__get_sum", Action::Allow)),
        },
    ];
    for case in cases {
        let input = function_stream("mcp__everything", "get_sum");
        let out = assert_split_invariant(Dialect::OpenAiResponses, case.blocked, &input);
        let values = data_values(&out);
        check_consistent(&values);
        assert_eq!(output_types(&values), case.want_types, "{}", case.name);
        let text = String::from_utf8_lossy(&out);
        if case.identical {
            assert_eq!(out, input, "{}", case.name);
        } else {
            assert!(!text.contains("SECRET"), "{}: arguments leaked", case.name);
            assert!(!text.contains("\"function_call\""), "{}", case.name);
            assert!(text.contains("[toolwall] Tool 'mcp__everything__get_sum' blocked by policy"));
        }
        let (_, records) = run(Dialect::OpenAiResponses, case.blocked, &input);
        let got = records
            .iter()
            .map(|r| (r.tool_name.as_str(), r.decision.action))
            .next();
        assert_eq!(got, case.record, "{}", case.name);
        if case.record.is_some_and(|r| r.1 == Action::Allow) {
            assert_eq!(records[0].input, Some(serde_json::json!({"a": "SECRET"})));
            assert_eq!(records[0].tool_call_id, "call_1");
        }
    }
}

#[test]
fn code_mode_custom_call_blocked_when_code_references_a_blocked_tool() {
    let code = serde_json::to_string(
        "const r = await tools.mcp__everything__echo({message: \"SECRET\"});\nreturn r;",
    )
    .expect("json");
    let input = custom_stream(&code);
    // Blocked: the whole custom call is replaced, its code never reaches the agent.
    let out = assert_split_invariant(Dialect::OpenAiResponses, &["mcp__everything__echo"], &input);
    let values = data_values(&out);
    check_consistent(&values);
    assert_eq!(output_types(&values), ["message"]);
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("SECRET"));
    assert!(text.contains("[toolwall] Tool 'mcp__everything__echo' blocked by policy"));
    let (_, records) = run(Dialect::OpenAiResponses, &["mcp__everything__echo"], &input);
    assert!(
        records
            .iter()
            .any(|r| r.tool_name == "mcp__everything__echo" && r.decision.action == Action::Block)
    );

    // Allowed: held until complete, then passed byte-identical and recorded.
    let out = assert_split_invariant(Dialect::OpenAiResponses, &[], &input);
    assert_eq!(out, input);
    let (_, records) = run(Dialect::OpenAiResponses, &[], &input);
    assert!(
        records
            .iter()
            .any(|r| r.tool_name == "mcp__everything__echo" && r.decision.action == Action::Allow)
    );
}

#[test]
fn completed_only_stream_is_still_inspected() {
    let input = sse(&[(
        "response.completed",
        r#"{"type":"response.completed","sequence_number":1,"response":{"id":"r","output":[{"id":"fc_9","type":"function_call","arguments":"{\"SECRET\":1}","call_id":"c","name":"get_sum","namespace":"mcp__everything"}]}}"#,
    )]);
    let (out, _) = run(
        Dialect::OpenAiResponses,
        &["mcp__everything__get_sum"],
        &input,
    );
    assert!(!String::from_utf8_lossy(&out).contains("SECRET"));
    assert_eq!(output_types(&data_values(&out)), ["message"]);
}

#[test]
fn mcp_reference_scan() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("tools.mcp__everything__echo({})", &[("everything", "echo")]),
        (
            "const f = tools.mcp__a__b_c; await f(); tools.mcp__a__b_c()",
            &[("a", "b_c")],
        ),
        ("tools['mcp__srv__get-sum']()", &[("srv", "get-sum")]),
        ("no tools here; mcp__ alone; mcp__x", &[]),
    ];
    for (code, want) in cases {
        assert_eq!(mcp_references(code), *want, "{code}");
    }
}

#[test]
fn unknown_event_shapes_after_a_tool_item_pass() {
    let mut input = function_stream("mcp__everything", "get_sum");
    let extra = sse(&[(
        "response.future_thing.delta",
        r#"{"type":"response.future_thing.delta","sequence_number":13,"output_index":5,"delta":{"function_call":"x"},"input":[1]}"#,
    )]);
    input.extend_from_slice(&extra);
    let (out, _, closed) = crate::llm::testing::run_chunks(
        Dialect::OpenAiResponses,
        &["mcp__everything__get_sum"],
        &[&input],
        1 << 20,
    );
    assert!(!closed);
    assert!(out.ends_with(&extra));
}
