//! The LLM interceptor proxy driven by the official Python SDKs (`anthropic`, `openai`) with
//! their streaming helpers, against a local fake upstream that replays real-format responses.
//! Asserts on what the SDK assembles: blocked tool gone, replacement text present, stop reason
//! rewritten when all calls are blocked, allowed tools intact, no SDK error.
//!
//! The proxy runs in process through the library (the daemon's wiring is tested elsewhere).

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use toolwall::{Action, CallQuery, Decision, Gate, ResultVerdict, ToolIdentity};
use toolwall::{Event, EventSink};
use toolwall::{LlmProxy, LlmProxySettings};

/// Blocks `mcp__everything__get-sum` (Claude's name) and its Codex form.
struct DenyGetSum;

/// The `everything` tool a call names (Claude's `mcp__everything__x` or Codex's namespace).
fn everything_tool(call: &CallQuery<'_>) -> Option<String> {
    let full = match call.namespace {
        Some(ns) => format!("{ns}__{}", call.name),
        None => call.name.to_owned(),
    };
    full.strip_prefix("mcp__everything__").map(str::to_owned)
}

impl Gate for DenyGetSum {
    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
        let Some(tool) = everything_tool(call) else {
            return Decision::not_mcp();
        };
        let blocked = tool == "get-sum" || tool == "get_sum";
        Decision {
            action: if blocked {
                Action::Block
            } else {
                Action::Allow
            },
            reason: if blocked {
                "denied by rule".into()
            } else {
                String::new()
            },
            tool: Some(ToolIdentity {
                server_id: "everything".into(),
                server_type: "stdio".into(),
                server_addr: String::new(),
                tool,
                tool_hash: String::new(),
            }),
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

    fn inspect_result(&self, _: &str, _: Option<&str>, _: &[u8]) -> Option<ResultVerdict> {
        None
    }

    fn check_listed(&self, _: &str, _: &str, _: &Value) -> Decision {
        Decision::not_mcp()
    }
}

fn sse(events: &[&str]) -> String {
    let mut out = String::new();
    for data in events {
        let v: Value = serde_json::from_str(data).expect("fixture is JSON");
        if let Some(t) = v.get("type").and_then(Value::as_str) {
            out.push_str(&format!("event: {t}\n"));
        }
        out.push_str(&format!("data: {data}\n\n"));
    }
    out
}

fn anthropic_stream(blocked_only: bool) -> String {
    let mut ev = vec![
        r#"{"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}}"#.to_owned(),
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.to_owned(),
        r#"{"type":"ping"}"#.to_owned(),
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Adding."}}"#.to_owned(),
        r#"{"type":"content_block_stop","index":0}"#.to_owned(),
    ];
    let mut tools = vec![("mcp__everything__get-sum", r#"{\"a\": 1, \"b\": 41}"#)];
    if !blocked_only {
        tools.push(("mcp__everything__echo", r#"{\"message\": \"hi\"}"#));
    }
    for (i, (name, args)) in tools.iter().enumerate() {
        let index = i + 1;
        ev.push(format!(r#"{{"type":"content_block_start","index":{index},"content_block":{{"type":"tool_use","id":"toolu_0{index}","name":"{name}","input":{{}}}}}}"#));
        ev.push(format!(r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"input_json_delta","partial_json":"{args}"}}}}"#));
        ev.push(format!(
            r#"{{"type":"content_block_stop","index":{index}}}"#
        ));
    }
    ev.push(r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":30}}"#.to_owned());
    ev.push(r#"{"type":"message_stop"}"#.to_owned());
    let refs: Vec<&str> = ev.iter().map(String::as_str).collect();
    sse(&refs)
}

const ANTHROPIC_JSON: &str = r#"{"id":"msg_02","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Adding."},{"type":"tool_use","id":"toolu_01","name":"mcp__everything__get-sum","input":{"a":1,"b":41}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":30}}"#;

fn chat_stream() -> String {
    let head = r#""id":"chatcmpl-1","object":"chat.completion.chunk","created":1730000000,"model":"gpt-4o","system_fingerprint":"fp_1""#;
    let choices = [
        r#"{"index":0,"delta":{"role":"assistant","content":null},"logprobs":null,"finish_reason":null}"#,
        r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"mcp__everything__get-sum","arguments":""}}]},"logprobs":null,"finish_reason":null}"#,
        r#"{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":1,"}}]},"logprobs":null,"finish_reason":null}"#,
        r#"{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"mcp__everything__echo","arguments":""}}]},"logprobs":null,"finish_reason":null}"#,
        r#"{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"b\":41}"}}]},"logprobs":null,"finish_reason":null}"#,
        r#"{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"message\":\"hi\"}"}}]},"logprobs":null,"finish_reason":null}"#,
        r#"{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}"#,
    ];
    let mut out = String::new();
    for c in choices {
        out.push_str(&format!("data: {{{head},\"choices\":[{c}]}}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    out
}

fn responses_stream() -> String {
    let fc = r#""id":"fc_1","type":"function_call","call_id":"call_1","name":"get_sum","namespace":"mcp__everything""#;
    let ev = [
        r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1730000000,"status":"in_progress","model":"gpt-5","output":[],"parallel_tool_calls":true,"tool_choice":"auto","tools":[]}}"#.to_owned(),
        format!(r#"{{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{{{fc},"status":"in_progress","arguments":""}}}}"#),
        r#"{"type":"response.function_call_arguments.delta","sequence_number":2,"item_id":"fc_1","output_index":0,"delta":"{\"a\":1,\"b\":41}"}"#.to_owned(),
        r#"{"type":"response.function_call_arguments.done","sequence_number":3,"item_id":"fc_1","output_index":0,"arguments":"{\"a\":1,\"b\":41}"}"#.to_owned(),
        format!(r#"{{"type":"response.output_item.done","sequence_number":4,"output_index":0,"item":{{{fc},"status":"completed","arguments":"{{\"a\":1,\"b\":41}}"}}}}"#),
        format!(r#"{{"type":"response.completed","sequence_number":5,"response":{{"id":"resp_1","object":"response","created_at":1730000000,"status":"completed","model":"gpt-5","output":[{{{fc},"status":"completed","arguments":"{{\"a\":1,\"b\":41}}"}}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"usage":{{"input_tokens":5,"input_tokens_details":{{"cached_tokens":0}},"output_tokens":9,"output_tokens_details":{{"reasoning_tokens":0}},"total_tokens":14}}}}}}"#),
    ];
    let refs: Vec<&str> = ev.iter().map(String::as_str).collect();
    sse(&refs)
}

/// Answers every request by path (and `"stream": true` in the body), one per connection.
async fn fake_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 8192];
                let head_end = loop {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                    if let Some(p) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                };
                let head = String::from_utf8_lossy(&req[..head_end]).to_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while req.len() < head_end + len {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let body = String::from_utf8_lossy(&req[head_end..]).to_string();
                let streaming =
                    body.contains("\"stream\": true") || body.contains("\"stream\":true");
                let blocked_only = body.contains("only-blocked");
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let (ctype, payload) = if path.starts_with("/v1/messages") {
                    if streaming {
                        ("text/event-stream", anthropic_stream(blocked_only))
                    } else {
                        ("application/json", ANTHROPIC_JSON.to_owned())
                    }
                } else if path.starts_with("/v1/chat/completions") {
                    ("text/event-stream", chat_stream())
                } else if path.starts_with("/v1/responses") {
                    ("text/event-stream", responses_stream())
                } else {
                    ("application/json", "{}".to_owned())
                };
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{payload}",
                    payload.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    addr
}

const SCRIPT: &str = r#"
import json, sys
import anthropic, openai
base = sys.argv[1]
out = {}
a = anthropic.Anthropic(base_url=base, api_key="sk-test", max_retries=0)
msgs = [{"role": "user", "content": "add 1 and 41"}]
for label, marker in (("anthropic_stream", "partial"), ("anthropic_stream_all_blocked", "only-blocked")):
    with a.messages.stream(model="claude-sonnet-4-5", max_tokens=100, messages=msgs, metadata={"user_id": marker}) as s:
        for _ in s:
            pass
        m = s.get_final_message()
    out[label] = {"stop_reason": m.stop_reason, "content": [b.model_dump() for b in m.content]}
m = a.messages.create(model="claude-sonnet-4-5", max_tokens=100, messages=msgs)
out["anthropic_json"] = {"stop_reason": m.stop_reason, "content": [b.model_dump() for b in m.content]}

o = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
content, calls, finish = "", {}, None
for chunk in o.chat.completions.create(model="gpt-4o", messages=msgs, stream=True):
    for ch in chunk.choices:
        if ch.delta.content:
            content += ch.delta.content
        for tc in ch.delta.tool_calls or []:
            d = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            if tc.function and tc.function.name:
                d["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                d["arguments"] += tc.function.arguments
        if ch.finish_reason:
            finish = ch.finish_reason
out["chat"] = {"content": content, "calls": list(calls.values()), "finish": finish}

types = []
for ev in o.responses.create(model="gpt-5", input="add", stream=True):
    types.append(ev.type)
with o.responses.stream(model="gpt-5", input="add") as s:
    for _ in s:
        pass
    r = s.get_final_response()
out["responses"] = {"types": types, "output": [i.model_dump() for i in r.output], "text": r.output_text}
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_see_blocked_calls_replaced() {
    official_sdks_see(Arc::new(DenyGetSum), "denied by rule").await;
}

/// An argument rule (here: `get-sum` with `b` = 41) refuses the call on what it
/// asks; every call of the tools with rules (get-sum and echo) is held until its arguments are
/// whole, and what the SDKs assemble is as valid as with a name rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_see_calls_refused_for_their_arguments() {
    official_sdks_see(Arc::new(GetSumArguments), "b is 41").await;
}

/// `get-sum` (any spelling) is refused when its `b` is 41; `echo` is judged on its
/// arguments too (and allowed).
struct GetSumArguments;

impl Gate for GetSumArguments {
    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
        let Some(tool) = everything_tool(call) else {
            return Decision::not_mcp();
        };
        let blocked = (tool == "get-sum" || tool == "get_sum")
            && call.arguments.is_some_and(|a| a["b"] == 41);
        Decision {
            action: if blocked {
                Action::Block
            } else {
                Action::Allow
            },
            reason: if blocked {
                "b is 41".into()
            } else {
                String::new()
            },
            tool: Some(ToolIdentity {
                server_id: "everything".into(),
                server_type: "stdio".into(),
                server_addr: String::new(),
                tool,
                tool_hash: String::new(),
            }),
            redact: Vec::new(),
            ask: None,
        }
    }

    fn needs_arguments(&self, call: &CallQuery<'_>) -> bool {
        everything_tool(call).is_some()
    }

    fn dispatched(&self, _: &str, _: &serde_json::Value) -> Option<(String, serde_json::Value)> {
        None
    }

    fn declared_url(&self, _: &str) -> Option<String> {
        None
    }

    fn inspect_result(&self, _: &str, _: Option<&str>, _: &[u8]) -> Option<ResultVerdict> {
        None
    }

    fn check_listed(&self, _: &str, _: &str, _: &Value) -> Decision {
        Decision::not_mcp()
    }
}

async fn official_sdks_see(gate: Arc<dyn Gate>, reason: &str) {
    let python = toolwall_tests::python();
    let upstream = fake_upstream().await;
    let (sink, mut events) = EventSink::channel();
    let settings = LlmProxySettings {
        listen: "127.0.0.1:0".parse().expect("addr"),
        anthropic_upstream: format!("http://{upstream}"),
        openai_upstream: format!("http://{upstream}"),
        gemini_upstream: format!("http://{upstream}"),
        session_id: "sdk".into(),
        ..LlmProxySettings::default()
    };
    let proxy = LlmProxy::bind(settings, gate, sink).await.expect("bind");
    let addr = proxy.local_addr().expect("addr");
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(proxy.run(async {
        let _ = stop_rx.await;
    }));

    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg("-c")
            .arg(SCRIPT)
            .arg(format!("http://{addr}"))
            .output()
    })
    .await
    .expect("join")
    .expect("python runs");
    let _ = stop_tx.send(());
    let _ = server.await;
    assert!(
        output.status.success(),
        "SDK script failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: Value = serde_json::from_slice(&output.stdout).expect("script prints JSON");
    let blocked_text =
        format!("[toolwall] Tool 'mcp__everything__get-sum' blocked by policy: {reason}");

    // Anthropic, streamed, partial: get-sum replaced, echo intact, stop_reason still tool_use.
    let s = &out["anthropic_stream"];
    assert_eq!(s["stop_reason"], "tool_use", "{s}");
    assert_eq!(s["content"][1]["type"], "text", "{s}");
    assert_eq!(s["content"][1]["text"], blocked_text, "{s}");
    assert_eq!(s["content"][2]["name"], "mcp__everything__echo");
    assert_eq!(
        s["content"][2]["input"],
        serde_json::json!({"message":"hi"})
    );
    // All blocked: end_turn.
    let s = &out["anthropic_stream_all_blocked"];
    assert_eq!(s["stop_reason"], "end_turn", "{s}");
    assert_eq!(s["content"].as_array().map(Vec::len), Some(2));
    // Buffered.
    let s = &out["anthropic_json"];
    assert_eq!(s["stop_reason"], "end_turn", "{s}");
    assert_eq!(s["content"][1]["text"], blocked_text);

    // Chat completions: get-sum gone, echo intact with its arguments, explanation in content.
    let s = &out["chat"];
    assert_eq!(
        s["calls"],
        serde_json::json!([{"name":"mcp__everything__echo","arguments":"{\"message\":\"hi\"}"}]),
        "{s}"
    );
    assert_eq!(s["content"], blocked_text);
    assert_eq!(s["finish"], "tool_calls");

    // Responses (Codex form: namespace + name): the call became a message item.
    let s = &out["responses"];
    let types: Vec<&str> = s["types"]
        .as_array()
        .expect("types")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        !types.contains(&"response.function_call_arguments.delta"),
        "{types:?}"
    );
    assert_eq!(s["output"][0]["type"], "message", "{s}");
    assert_eq!(
        s["text"],
        format!("[toolwall] Tool 'mcp__everything__get_sum' blocked by policy: {reason}")
    );

    let mut actions = Vec::new();
    while let Ok(Event::McpToolCallIntercepted(e)) = events.try_recv() {
        actions.push((e.tool_name, e.action));
    }
    assert!(actions.contains(&("mcp__everything__get-sum".to_owned(), Action::Block)));
    assert!(actions.contains(&("mcp__everything__echo".to_owned(), Action::Allow)));
    assert!(actions.contains(&("mcp__everything__get_sum".to_owned(), Action::Block)));
}
