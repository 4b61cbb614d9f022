use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::config::Config;
use crate::policy::Policy;
use crate::registry::Registry;

pub(super) const AWS: &str = "AKIAQYLPMN5HHHFPZAM2";

fn policy(yaml: &str) -> Policy {
    let config = Config::parse(yaml, "test.yaml").expect("config");
    Policy::new(
        &config,
        Arc::new(Registry::in_memory().expect("registry")),
        &[],
    )
    .expect("policy")
}

pub(super) fn run(
    gate: &Policy,
    dialect: Dialect,
    request: &Value,
    recorded: &Recorded,
) -> (Option<Value>, Vec<Event>) {
    let body = serde_json::to_vec(request).expect("json");
    let out = inspect(gate, Route::Dialect(dialect), &body, "sess", recorded).expect("readable");
    let body = out
        .body
        .map(|b| serde_json::from_slice(&b).expect("json out"));
    (body, out.records)
}

fn anthropic_request(result: Value) -> Value {
    json!({
        "model": "claude", "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "read the file"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "mcp__files__read", "input": {}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": result}
            ]}
        ]
    })
}

#[test]
fn an_anthropic_tool_result_is_redacted_before_the_model_reads_it_and_recorded_once() {
    let gate = policy("{}");
    let recorded = Recorded::default();
    let request = anthropic_request(json!([{"type": "text", "text": format!("aws_key={AWS}")}]));
    let (body, records) = run(&gate, Dialect::Anthropic, &request, &recorded);
    let body = body.expect("rewritten");
    assert_eq!(
        body["messages"][2]["content"][0]["content"][0]["text"],
        "aws_key=[toolwall:redacted:aws-access-token]"
    );
    // The rest of the request is what the agent sent.
    assert_eq!(body["messages"][0], request["messages"][0]);
    assert_eq!(body["max_tokens"], 10);
    let [Event::McpResultInspected(record)] = records.as_slice() else {
        panic!("one record: {records:?}");
    };
    assert_eq!(record.layer, "llm");
    // The name's form says whose tool it is, though no registry knows server `files`.
    assert_eq!(
        (record.server_id.as_str(), record.tool_name.as_str()),
        ("files", "read")
    );
    assert_eq!(record.jsonrpc_id, json!("toolu_1"));
    assert_eq!(
        record.findings[0].pointer,
        "/messages/2/content/0/content/0/text"
    );
    assert!(!serde_json::to_string(record).expect("json").contains(AWS));
    // The next turn carries the same result again: redacted again, not recorded again.
    let (again, records) = run(&gate, Dialect::Anthropic, &request, &recorded);
    assert!(again.is_some_and(|b| !b.to_string().contains(AWS)));
    assert!(records.is_empty());
}

#[test]
fn a_request_without_findings_passes_as_the_agents_bytes() {
    let gate = policy("{}");
    let request = anthropic_request(json!("all quiet"));
    let (body, records) = run(&gate, Dialect::Anthropic, &request, &Recorded::default());
    assert!(body.is_none() && records.is_empty());
    // A secret the user wrote is the user's: only tool results are judged.
    let mut request = anthropic_request(json!("all quiet"));
    request["messages"][0]["content"] = json!(format!("my key is {AWS}"));
    let (body, _) = run(&gate, Dialect::Anthropic, &request, &Recorded::default());
    assert!(body.is_none());
}

#[test]
fn withheld_results_say_why_and_anthropic_blocks_become_errors() {
    let gate = policy("sandbox:\n  mcp:\n    result_inspection:\n      secrets: withhold\n");
    let request = anthropic_request(json!(format!("{AWS}")));
    let (body, records) = run(&gate, Dialect::Anthropic, &request, &Recorded::default());
    let block = &body.expect("rewritten")["messages"][2]["content"][0];
    assert_eq!(block["is_error"], true);
    assert!(
        block["content"]
            .as_str()
            .is_some_and(|t| t.starts_with("toolwall withheld this result"))
    );
    assert!(
        matches!(&records[0], Event::McpResultInspected(r) if r.action == crate::decision::Action::Block)
    );
}

#[test]
fn chat_tool_messages_and_responses_outputs_are_judged() {
    let gate = policy("{}");
    let chat = json!({
        "model": "gpt", "messages": [
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "mcp__files__read", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": format!("token: {AWS}")}
        ]
    });
    let (body, records) = run(&gate, Dialect::OpenAiChat, &chat, &Recorded::default());
    assert_eq!(
        body.expect("rewritten")["messages"][1]["content"],
        "token: [toolwall:redacted:aws-access-token]"
    );
    assert!(
        matches!(&records[0], Event::McpResultInspected(r) if r.server_id == "files" && r.tool_name == "read")
    );
    let responses = json!({
        "model": "gpt", "input": [
            {"type": "function_call", "call_id": "call_2", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_2", "output": format!("{AWS}")}
        ]
    });
    let (body, _) = run(
        &gate,
        Dialect::OpenAiResponses,
        &responses,
        &Recorded::default(),
    );
    assert_eq!(
        body.expect("rewritten")["input"][1]["output"],
        "[toolwall:redacted:aws-access-token]"
    );
}

#[test]
fn an_exempt_tool_s_result_passes() {
    let gate = policy(
        "sandbox:\n  mcp:\n    servers:\n      - id: files\n        type: http\n        url: http://127.0.0.1:9/mcp\n    result_inspection:\n      exempt:\n        - server: files\n          tool: read\n",
    );
    let request = anthropic_request(json!(format!("{AWS}")));
    let (body, records) = run(&gate, Dialect::Anthropic, &request, &Recorded::default());
    assert!(body.is_none() && records.is_empty(), "{body:?} {records:?}");
    // Another tool's result is judged.
    let mut other = request.clone();
    other["messages"][1]["content"][0]["name"] = json!("mcp__files__write");
    let (body, _) = run(&gate, Dialect::Anthropic, &other, &Recorded::default());
    assert!(body.is_some());
    // One id named for the exempt tool and for another: its result could be the other's, so
    // no exemption applies (in every dialect's history, whichever is named first).
    for order in [
        ["mcp__files__write", "mcp__files__read"],
        ["mcp__files__read", "mcp__files__write"],
    ] {
        let mut borrowed = request.clone();
        borrowed["messages"][1]["content"] = json!([
            {"type": "tool_use", "id": "toolu_1", "name": order[0], "input": {}},
            {"type": "tool_use", "id": "toolu_1", "name": order[1], "input": {}}
        ]);
        let (body, _) = run(&gate, Dialect::Anthropic, &borrowed, &Recorded::default());
        assert!(
            body.is_some(),
            "{order:?}: the secret passed as the exempt tool's"
        );
    }
    let chat = json!({
        "model": "gpt",
        "messages": [
            {"role": "assistant", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "mcp__files__write", "arguments": "{}"}},
                {"id": "c1", "type": "function", "function": {"name": "mcp__files__read", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": AWS}
        ]
    });
    let (body, _) = run(&gate, Dialect::OpenAiChat, &chat, &Recorded::default());
    assert!(
        body.is_some(),
        "chat: the secret passed as the exempt tool's"
    );
}

const DENY_SUM: &str = "sandbox:\n  mcp:\n    deny: ['^get-sum$']\n    servers:\n      - id: everything\n        type: stdio\n        command: /bin/true\n";

#[test]
fn denied_tools_are_not_offered_to_the_model() {
    let gate = policy(DENY_SUM);
    let request = json!({
        "model": "claude", "max_tokens": 10,
        "tools": [
            {"name": "Bash", "input_schema": {"type": "object"}},
            {"name": "mcp__everything__echo", "input_schema": {"type": "object"}},
            {"name": "mcp__everything__get-sum", "input_schema": {"type": "object"}, "defer_loading": true}
        ],
        "tool_choice": {"type": "tool", "name": "mcp__everything__get-sum"},
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_9", "name": "ToolSearch", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": [
                {"type": "tool_reference", "tool_name": "mcp__everything__get-sum"},
                {"type": "tool_reference", "tool_name": "mcp__everything__echo"}
            ]}]}
        ]
    });
    let (body, _) = run(&gate, Dialect::Anthropic, &request, &Recorded::default());
    let body = body.expect("rewritten");
    let names: Vec<&str> = body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["Bash", "mcp__everything__echo"]);
    assert_eq!(body["tool_choice"], json!({"type": "auto"}));
    assert_eq!(
        body["messages"][1]["content"][0]["content"],
        json!([{"type": "tool_reference", "tool_name": "mcp__everything__echo"}])
    );
}

#[test]
fn chat_functions_and_codex_namespaces_lose_denied_tools_and_empty_tools_go() {
    let gate = policy(DENY_SUM);
    let chat = json!({
        "model": "gpt", "messages": [],
        "tools": [{"type": "function", "function": {"name": "mcp__everything__get-sum", "parameters": {}}}],
        "tool_choice": "required"
    });
    let (body, _) = run(&gate, Dialect::OpenAiChat, &chat, &Recorded::default());
    let body = body.expect("rewritten");
    assert!(
        body.get("tools").is_none() && body.get("tool_choice").is_none(),
        "{body}"
    );
    let responses = json!({
        "model": "gpt", "input": "hi",
        "tools": [
            {"type": "function", "name": "shell", "parameters": {}},
            {"type": "namespace", "name": "mcp__everything", "tools": [
                {"type": "function", "name": "get_sum", "parameters": {}},
                {"type": "function", "name": "echo", "parameters": {}}
            ]}
        ]
    });
    let (body, _) = run(
        &gate,
        Dialect::OpenAiResponses,
        &responses,
        &Recorded::default(),
    );
    let body = body.expect("rewritten");
    assert_eq!(
        body["tools"][1]["tools"],
        json!([{"type": "function", "name": "echo", "parameters": {}}])
    );
    assert_eq!(body["tools"][0]["name"], "shell");
}

#[test]
fn a_request_offering_only_allowed_tools_passes_as_it_came() {
    let gate = policy(DENY_SUM);
    let request = json!({"model": "claude", "max_tokens": 1, "messages": [],
        "tools": [{"name": "mcp__everything__echo", "input_schema": {}}]});
    let (body, _) = run(&gate, Dialect::Anthropic, &request, &Recorded::default());
    assert!(body.is_none());
}

#[test]
fn a_body_toolwall_cannot_read_is_refused() {
    let gate = policy("{}");
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    for body in [
        &b"{\"a\": NaN}"[..],
        b"\xEF\xBB\xBF{}",
        deep.as_bytes(),
        b"{} {}",
        br#"{"messages": [], "messages": []}"#,
    ] {
        assert!(
            inspect(
                &gate,
                Route::Dialect(Dialect::Anthropic),
                body,
                "s",
                &Recorded::default()
            )
            .is_err(),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn conversation_items_and_every_kind_of_call_output_are_judged() {
    let gate = policy("{}");
    let items = json!({"items": [
        {"type": "local_shell_call", "call_id": "c1", "action": {}},
        {"type": "local_shell_call_output", "call_id": "c1", "output": format!("{AWS}")}
    ]});
    let body = serde_json::to_vec(&items).expect("json");
    let out = inspect(
        &gate,
        Route::ConversationItems,
        &body,
        "s",
        &Recorded::default(),
    )
    .expect("readable");
    let v: Value = serde_json::from_slice(&out.body.expect("rewritten")).expect("json");
    assert_eq!(
        v["items"][1]["output"],
        "[toolwall:redacted:aws-access-token]"
    );
}

/// A hosted MCP call's or listing's `error` is a server's text the model reads, as its output.
#[test]
fn a_hosted_servers_errors_are_judged_as_its_results() {
    let gate = policy("{}");
    let request = json!({"model": "gpt", "input": [
        {"type": "mcp_call", "id": "mcp_1", "name": "write", "server_label": "other", "arguments": "{}", "error": format!("failed: {AWS}")},
        {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "other", "tools": [], "error": format!("listing failed: {AWS}")}
    ]});
    let (body, records) = run(
        &gate,
        Dialect::OpenAiResponses,
        &request,
        &Recorded::default(),
    );
    let body = body.expect("rewritten");
    for (i, field) in [(0, "error"), (1, "error")] {
        let text = body["input"][i][field].as_str().unwrap_or_default();
        assert!(
            !text.contains(AWS) && text.contains("[toolwall:redacted:aws-access-token]"),
            "{body}"
        );
    }
    assert_eq!(records.len(), 2, "{records:?}");
}

/// Tool definitions a server or a search handed back, and a Gemini function's answer parts:
/// texts the model reads that no model wrote.
#[test]
fn listings_search_results_and_answer_parts_are_judged_as_results() {
    let gate = policy("{}");
    let tool = json!({"name": "t", "description": format!("key {AWS}"), "input_schema": {"type": "object"}});
    let redacted = |body: &Value| !body.to_string().contains(AWS);
    let anthropic = json!({"model": "claude", "max_tokens": 10, "messages": [
        {"role": "assistant", "content": [
            {"type": "mcp_tool_listing", "mcp_server_name": "other", "tools": [tool.clone()]}
        ]},
        {"role": "user", "content": "go on"}
    ]});
    let responses = json!({"model": "gpt", "input": [
        {"type": "tool_search_output", "call_id": "ts_1", "tools": [
            {"type": "function", "name": "t", "description": format!("key {AWS}"), "parameters": {"type": "object"}}
        ]}
    ]});
    let gemini = json!({"contents": [
        {"role": "model", "parts": [{"functionCall": {"name": "t", "args": {}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "t", "parts": [{"text": format!("key {AWS}")}]}}]}
    ]});
    for (dialect, request) in [
        (Dialect::Anthropic, &anthropic),
        (Dialect::OpenAiResponses, &responses),
        (Dialect::Gemini, &gemini),
    ] {
        let (body, records) = run(&gate, dialect, request, &Recorded::default());
        let body = body.unwrap_or_else(|| panic!("{dialect:?}: passed as it came"));
        assert!(redacted(&body), "{dialect:?}: {body}");
        assert_eq!(records.len(), 1, "{dialect:?}: {records:?}");
    }
}

#[test]
fn paths_a_provider_could_route_otherwise_are_refused() {
    for path in [
        "/v1//messages",
        "/v1/./messages",
        "/v1/x/../messages",
        "/v1/%6Dessages",
        "/v1/messages;x",
        "/V1/messages",
        "/v1/Messages",
    ] {
        assert!(ambiguous_path(path).is_some(), "{path}");
    }
    for path in [
        "/v1/messages?beta=true",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/models",
        "/v1/messages?q=%20",
    ] {
        assert_eq!(ambiguous_path(path), None, "{path}");
    }
}

#[test]
fn gemini_declarations_lose_denied_functions_and_results_are_judged() {
    let gate = policy(DENY_SUM);
    let request = json!({
        "contents": [
            {"role": "user", "parts": [{"text": "sum it"}]},
            {"role": "model", "parts": [{"functionCall": {"id": "f1", "name": "mcp__everything__echo", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"id": "f1", "name": "mcp__everything__echo", "response": {"output": format!("aws_key={AWS}")}}}]},
            {"role": "user", "parts": [{"function_response": {"name": "read", "response": {"output": format!("again {AWS}")}}}]}
        ],
        "tools": [
            {"functionDeclarations": [
                {"name": "mcp__everything__echo", "parameters": {"type": "OBJECT"}},
                {"name": "mcp__everything__get-sum"}
            ]},
            {"function_declarations": [{"name": "get-sum"}]},
            {"googleSearch": {}}
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["mcp__everything__get-sum"]}}
    });
    let (body, records) = run(&gate, Dialect::Gemini, &request, &Recorded::default());
    let body = body.expect("rewritten");
    assert_eq!(
        body["tools"],
        json!([
            {"functionDeclarations": [{"name": "mcp__everything__echo", "parameters": {"type": "OBJECT"}}]},
            {"googleSearch": {}}
        ])
    );
    // Forced to call only a denied function: the model chooses.
    assert_eq!(
        body["toolConfig"]["functionCallingConfig"],
        json!({"mode": "AUTO"})
    );
    // Both results are redacted in place; a response stays an object.
    assert_eq!(
        body["contents"][2]["parts"][0]["functionResponse"]["response"]["output"],
        "aws_key=[toolwall:redacted:aws-access-token]"
    );
    assert_eq!(
        body["contents"][3]["parts"][0]["function_response"]["response"]["output"],
        "again [toolwall:redacted:aws-access-token]"
    );
    let ids: Vec<&Value> = records
        .iter()
        .map(|e| match e {
            Event::McpResultInspected(r) => &r.jsonrpc_id,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ids, [&json!("f1"), &json!("contents/3/parts/0")]);
    // Withheld, a result becomes the function's error.
    let withhold = policy("sandbox:\n  mcp:\n    result_inspection:\n      secrets: withhold\n");
    let (body, _) = run(&withhold, Dialect::Gemini, &request, &Recorded::default());
    let response =
        &body.expect("rewritten")["contents"][2]["parts"][0]["functionResponse"]["response"];
    assert!(
        response["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("toolwall withheld")),
        "{response}"
    );
}

#[test]
fn a_gemini_tool_of_a_kind_toolwall_does_not_know_is_refused() {
    let gate = policy("{}");
    for tool in [
        json!({"mcpServers": [{"name": "s"}]}),
        json!({"somethingNew": {}}),
    ] {
        let request = json!({"contents": [], "tools": [tool]});
        let body = serde_json::to_vec(&request).expect("json");
        let err = inspect(
            &gate,
            Route::Dialect(Dialect::Gemini),
            &body,
            "sess",
            &Recorded::default(),
        )
        .expect_err("unknown tool kind");
        assert!(err.to_string().contains("Gemini tool"), "{err}");
    }
}

#[test]
fn gemini_results_are_found_wherever_the_model_reads_them_and_odd_shapes_are_refused() {
    let gate = policy("{}");
    let answer =
        json!({"functionResponse": {"name": "read", "response": {"output": format!("key {AWS}")}}});
    // A result in the system instruction, and a countTokens request wrapping a whole request.
    for request in [
        json!({"contents": [], "systemInstruction": {"parts": [answer.clone()]}}),
        json!({"generateContentRequest": {"model": "models/g", "contents": [{"role": "user", "parts": [answer.clone()]}]}}),
    ] {
        let (body, records) = run(&gate, Dialect::Gemini, &request, &Recorded::default());
        let text = body.expect("rewritten").to_string();
        assert!(
            !text.contains(AWS) && text.contains("toolwall:redacted"),
            "{text}"
        );
        assert_eq!(records.len(), 1, "{records:?}");
    }
    // Lists that are not lists: nothing in them would be read.
    for request in [
        json!({"contents": {"0": {"parts": [answer.clone()]}}}),
        json!({"contents": [{"parts": {"0": answer.clone()}}]}),
        json!({"contents": [], "tools": {"functionDeclarations": [{"name": "x"}]}}),
        json!({"contents": [], "tools": [{"functionDeclarations": {"name": "x"}}]}),
    ] {
        let body = serde_json::to_vec(&request).expect("json");
        let err = inspect(
            &gate,
            Route::Dialect(Dialect::Gemini),
            &body,
            "sess",
            &Recorded::default(),
        )
        .expect_err("not a list");
        assert!(err.to_string().contains("not a list"), "{err}");
    }
}
