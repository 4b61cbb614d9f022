use serde_json::{Value, json};

use super::rewrite_buffered;
use crate::decision::Action;
use crate::llm::testing::gate;
use crate::llm::{Dialect, OnMalformed};

fn rewrite(
    dialect: Dialect,
    blocked: &[&'static str],
    body: &str,
) -> (String, Vec<(String, Action)>) {
    let (new, records) = rewrite_buffered(
        dialect,
        body.as_bytes(),
        gate(blocked),
        OnMalformed::FailClosed,
    )
    .expect("inspectable");
    let out = new.map_or_else(|| body.to_owned(), |b| String::from_utf8(b).expect("utf-8"));
    (
        out,
        records
            .into_iter()
            .map(|r| (r.tool_name, r.decision.action))
            .collect(),
    )
}

const ANTHROPIC: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"mcp__fs__read","input":{"p":1}},{"type":"tool_use","id":"toolu_2","name":"mcp__fs__delete","input":{"SECRET":1}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":4}}"#;

#[test]
fn anthropic() {
    // Partial: only the blocked block replaced; stop_reason kept; other fields verbatim.
    let (out, records) = rewrite(Dialect::Anthropic, &["mcp__fs__delete"], ANTHROPIC);
    let v: Value = serde_json::from_str(&out).expect("valid JSON");
    assert!(!out.contains("SECRET"));
    assert_eq!(v["content"][1]["name"], "mcp__fs__read");
    assert_eq!(
        v["content"][2],
        json!({"type":"text","text":"[toolwall] Tool 'mcp__fs__delete' blocked by policy: denied by test"})
    );
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(v["usage"], json!({"input_tokens":3,"output_tokens":4}));
    assert!(out.starts_with(r#"{"id":"msg_1","type":"message""#));
    assert_eq!(
        records,
        vec![
            ("mcp__fs__read".to_owned(), Action::Allow),
            ("mcp__fs__delete".to_owned(), Action::Block)
        ]
    );
    // All blocked: end_turn.
    let (out, _) = rewrite(
        Dialect::Anthropic,
        &["mcp__fs__delete", "mcp__fs__read"],
        ANTHROPIC,
    );
    let v: Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["stop_reason"], "end_turn");
    // Nothing blocked: the original bytes.
    let (new, _) = rewrite_buffered(
        Dialect::Anthropic,
        ANTHROPIC.as_bytes(),
        gate(&[]),
        OnMalformed::FailClosed,
    )
    .expect("ok");
    assert!(new.is_none());
    // A forced call that says end_turn is still looked at.
    let forced = ANTHROPIC.replace(r#""stop_reason":"tool_use""#, r#""stop_reason":"end_turn""#);
    let (out, _) = rewrite(Dialect::Anthropic, &["mcp__fs__delete"], &forced);
    assert!(!out.contains("SECRET"));
}

const CHAT: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"mcp__fs__delete","arguments":"{\"SECRET\":1}"}},{"id":"call_2","type":"function","function":{"name":"mcp__fs__read","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"total_tokens":9}}"#;

#[test]
fn chat() {
    let (out, records) = rewrite(Dialect::OpenAiChat, &["mcp__fs__delete"], CHAT);
    let v: Value = serde_json::from_str(&out).expect("valid JSON");
    assert!(!out.contains("SECRET"));
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "[toolwall] Tool 'mcp__fs__delete' blocked by policy: denied by test"
    );
    assert_eq!(records.len(), 2);

    let (out, _) = rewrite(
        Dialect::OpenAiChat,
        &["mcp__fs__delete", "mcp__fs__read"],
        CHAT,
    );
    let v: Value = serde_json::from_str(&out).expect("valid JSON");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["total_tokens"], 9);

    // finish_reason "stop" with a forced call: still inspected.
    let forced = CHAT.replace(
        r#""finish_reason":"tool_calls""#,
        r#""finish_reason":"stop""#,
    );
    let (out, _) = rewrite(Dialect::OpenAiChat, &["mcp__fs__delete"], &forced);
    assert!(!out.contains("SECRET"));
}

const RESPONSES: &str = r#"{"id":"resp_1","object":"response","status":"completed","output":[{"id":"fc_1","type":"function_call","status":"completed","arguments":"{\"SECRET\":1}","call_id":"call_1","name":"get_sum","namespace":"mcp__everything"},{"id":"ctc_1","type":"custom_tool_call","call_id":"call_2","name":"exec","input":"await tools.mcp__everything__echo({m: 'CODESECRET'})"}],"usage":{"total_tokens":5}}"#;

#[test]
fn responses() {
    let (out, records) = rewrite(
        Dialect::OpenAiResponses,
        &["mcp__everything__get_sum"],
        RESPONSES,
    );
    let v: Value = serde_json::from_str(&out).expect("valid JSON");
    assert!(!out.contains("SECRET\\\""), "function arguments leaked");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(
        v["output"][0]["content"][0]["text"],
        "[toolwall] Tool 'mcp__everything__get_sum' blocked by policy: denied by test"
    );
    assert_eq!(v["output"][1]["type"], "custom_tool_call");
    assert!(records.contains(&("mcp__everything__get_sum".to_owned(), Action::Block)));
    assert!(records.contains(&("mcp__everything__echo".to_owned(), Action::Allow)));

    let (out, _) = rewrite(
        Dialect::OpenAiResponses,
        &["mcp__everything__echo"],
        RESPONSES,
    );
    let v: Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["output"][0]["type"], "function_call");
    assert_eq!(v["output"][1]["type"], "message");
    assert!(!out.contains("CODESECRET"));
}

#[test]
fn chat_legacy_function_call() {
    let body = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":null,"function_call":{"name":"mcp__fs__delete","arguments":"{\"SECRET\":1}"}},"finish_reason":"function_call"}]}"#;
    let (out, records) = rewrite(Dialect::OpenAiChat, &["mcp__fs__delete"], body);
    let v: Value = serde_json::from_str(&out).expect("valid JSON");
    assert!(!out.contains("SECRET"));
    assert!(v["choices"][0]["message"].get("function_call").is_none());
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(records, vec![("mcp__fs__delete".to_owned(), Action::Block)]);
    let (out, _) = rewrite(Dialect::OpenAiChat, &[], body);
    assert_eq!(out, body);
}

#[test]
fn malformed_bodies() {
    let bad = br#"{"content":[{"type":"tool_use","name":"x""#;
    assert!(rewrite_buffered(Dialect::Anthropic, bad, gate(&[]), OnMalformed::FailClosed).is_err());
    let (new, _) = rewrite_buffered(Dialect::Anthropic, bad, gate(&[]), OnMalformed::FailOpen)
        .expect("fail open passes");
    assert!(new.is_none());
    // UTF-16 (Python's `json.loads` reads it) or not UTF-8 at all: refused whatever the setting.
    let utf16: Vec<u8> = r#"{"content":[{"type":"tool_use","name":"x"}]}"#
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    for body in [&utf16[..], b"{\"content\":\"\xff\"}"] {
        for on_malformed in [OnMalformed::FailOpen, OnMalformed::FailClosed] {
            assert!(rewrite_buffered(Dialect::Anthropic, body, gate(&[]), on_malformed).is_err());
        }
    }
}

/// A `custom` tool call (`{"type":"custom","custom":{"name","input"}}`) is judged
/// like a function call: a blocked one removed, the explanation in `content`.
#[test]
fn chat_custom_tool_calls_are_judged() {
    let body = r#"{"id":"c","object":"chat.completion","created":1,"model":"gpt","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"custom","custom":{"name":"mcp__fs__delete","input":"SECRET"}},{"id":"call_2","type":"custom","custom":{"name":"mcp__fs__read","input":"x"}}]},"finish_reason":"tool_calls"}]}"#;
    let (out, records) = rewrite(Dialect::OpenAiChat, &["mcp__fs__delete"], body);
    let v: Value = serde_json::from_str(&out).expect("valid JSON");
    assert!(!out.contains("SECRET"), "{out}");
    let calls = v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .expect("one kept");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["custom"]["name"], "mcp__fs__read");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "[toolwall] Tool 'mcp__fs__delete' blocked by policy: denied by test"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        records,
        vec![
            ("mcp__fs__delete".to_owned(), Action::Block),
            ("mcp__fs__read".to_owned(), Action::Allow)
        ]
    );
    // All blocked: no tool_calls left, finish_reason stop.
    let (out, _) = rewrite(
        Dialect::OpenAiChat,
        &["mcp__fs__delete", "mcp__fs__read"],
        body,
    );
    let v: Value = serde_json::from_str(&out).expect("valid JSON");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // Nothing blocked: the original bytes.
    let (out, _) = rewrite(Dialect::OpenAiChat, &[], body);
    assert_eq!(out, body);
}
