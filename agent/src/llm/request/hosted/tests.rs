use std::sync::Arc;

use serde_json::{Value, json};

use super::super::{Recorded, Refused, Route, inspect};
use super::Unjudgeable;
use crate::config::Config;
use crate::events::Event;
use crate::llm::Dialect;
use crate::llm::testing::TestGate;
use crate::policy::Policy;
use crate::registry::Registry;

/// Denies `mcp__s__echo` (and `mcp__s__guarded` has argument rules).
fn gate() -> TestGate {
    TestGate {
        blocked: vec!["mcp__s__echo"],
    }
}

fn run(
    gate: &dyn crate::decision::Gate,
    dialect: Dialect,
    request: &Value,
) -> Result<Value, Refused> {
    let body = serde_json::to_vec(request).expect("json");
    let out = inspect(
        gate,
        Route::Dialect(dialect),
        &body,
        "sess",
        &Recorded::default(),
    )?;
    Ok(out.body.map_or_else(
        || request.clone(),
        |b| serde_json::from_slice(&b).expect("json out"),
    ))
}

fn refusal(result: Result<Value, Refused>) -> Refused {
    match result {
        Ok(body) => panic!("forwarded: {body}"),
        Err(e) => e,
    }
}

fn mcp(allowed: Value) -> Value {
    json!({"type": "mcp", "server_label": "s", "server_url": "https://mcp.example/mcp", "allowed_tools": allowed})
}

#[test]
fn openai_hosted_mcp_loses_denied_tools_in_either_list_form() {
    let request = json!({"model": "m", "input": "hi", "tools": [mcp(json!(["echo", "add"]))]});
    let body = run(&gate(), Dialect::OpenAiResponses, &request).expect("forwarded");
    assert_eq!(body["tools"][0]["allowed_tools"], json!(["add"]));
    assert_eq!(body["tools"][0]["server_url"], "https://mcp.example/mcp");

    let request = json!({"model": "m", "input": "hi",
        "tools": [mcp(json!({"tool_names": ["echo", "add"], "read_only": true}))]});
    let body = run(&gate(), Dialect::OpenAiResponses, &request).expect("forwarded");
    assert_eq!(
        body["tools"][0]["allowed_tools"],
        json!({"tool_names": ["add"], "read_only": true})
    );

    // A connector is identified by its label alike.
    let request = json!({"model": "m", "input": "hi", "tools": [
        {"type": "function", "name": "f", "parameters": {}},
        {"type": "mcp", "server_label": "s", "connector_id": "connector_gmail", "allowed_tools": ["echo"]}
    ]});
    let body = run(&gate(), Dialect::OpenAiResponses, &request).expect("forwarded");
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "name": "f", "parameters": {}}])
    );
}

#[test]
fn a_hosted_entry_left_with_no_tool_is_removed_and_its_forced_choice_becomes_auto() {
    let request = json!({"model": "m", "input": "hi",
        "tools": [mcp(json!(["echo"])), {"type": "function", "name": "f", "parameters": {}}],
        "tool_choice": {"type": "mcp", "server_label": "s"}});
    let body = run(&gate(), Dialect::OpenAiResponses, &request).expect("forwarded");
    assert_eq!(body["tools"].as_array().map(Vec::len), Some(1));
    assert_eq!(body["tool_choice"], "auto");
    // Alone, the tools go with their choice.
    let request = json!({"model": "m", "input": "hi", "tools": [mcp(json!(["echo"]))]});
    let body = run(&gate(), Dialect::OpenAiResponses, &request).expect("forwarded");
    assert!(body.get("tools").is_none(), "{body}");
}

#[test]
fn a_hosted_server_that_may_run_any_tool_is_refused() {
    for entry in [
        json!({"type": "mcp", "server_label": "s", "server_url": "https://x"}),
        json!({"type": "mcp", "server_label": "s", "server_url": "https://x", "allowed_tools": null}),
        mcp(json!({"read_only": true})),
    ] {
        let request = json!({"model": "m", "input": "hi", "tools": [entry]});
        let why = refusal(run(&gate(), Dialect::OpenAiResponses, &request));
        assert!(
            matches!(why, Refused::Hosted(Unjudgeable::OpenAiUnlisted { ref server }) if server == "s"),
            "{why}"
        );
        assert!(why.to_string().contains("allowed_tools"), "{why}");
    }
    let request = json!({"model": "m", "input": "hi", "tools": [mcp(json!(["add", 3]))]});
    assert!(matches!(
        refusal(run(&gate(), Dialect::OpenAiResponses, &request)),
        Refused::Hosted(Unjudgeable::BadList { .. })
    ));
    let request = json!({"model": "m", "input": "hi",
        "tools": [{"type": "mcp", "server_url": "https://x", "allowed_tools": ["add"]}]});
    assert!(matches!(
        refusal(run(&gate(), Dialect::OpenAiResponses, &request)),
        Refused::Hosted(Unjudgeable::NoServerLabel)
    ));
}

#[test]
fn a_tool_choice_forcing_a_denied_hosted_tool_is_refused() {
    let request = json!({"model": "m", "input": "hi", "tools": [mcp(json!(["echo", "add"]))],
        "tool_choice": {"type": "mcp", "server_label": "s", "name": "echo"}});
    let why = refusal(run(&gate(), Dialect::OpenAiResponses, &request));
    assert!(
        matches!(why, Refused::Hosted(Unjudgeable::ForcedDenied { ref tool, .. }) if tool == "mcp__s__echo"),
        "{why}"
    );
    let allowed = json!({"model": "m", "input": "hi", "tools": [mcp(json!(["echo", "add"]))],
        "tool_choice": {"type": "mcp", "server_label": "s", "name": "add"}});
    let body = run(&gate(), Dialect::OpenAiResponses, &allowed).expect("forwarded");
    assert_eq!(body["tool_choice"]["name"], "add");
}

#[test]
fn tools_with_argument_rules_stay_only_where_the_provider_asks_first() {
    let request = json!({"model": "m", "input": "hi", "tools": [
        mcp(json!(["guarded", "add"])),
        {"type": "mcp", "server_label": "s", "server_url": "https://x", "allowed_tools": ["guarded"], "require_approval": "always"},
        {"type": "mcp", "server_label": "s", "server_url": "https://x", "allowed_tools": ["guarded"],
         "require_approval": {"always": {"tool_names": ["guarded"]}}}
    ]});
    let body = run(&gate(), Dialect::OpenAiResponses, &request).expect("forwarded");
    assert_eq!(body["tools"][0]["allowed_tools"], json!(["add"]));
    assert_eq!(body["tools"][1]["allowed_tools"], json!(["guarded"]));
    assert_eq!(body["tools"][2]["allowed_tools"], json!(["guarded"]));
}

#[test]
fn hosted_definitions_loaded_by_tool_search_are_judged() {
    let request = json!({"model": "m", "input": [
        {"type": "tool_search_output", "call_id": "ts", "execution": "client", "tools": [mcp(json!(["echo", "add"]))]}
    ]});
    let body = run(&gate(), Dialect::OpenAiResponses, &request).expect("forwarded");
    assert_eq!(
        body["input"][0]["tools"][0]["allowed_tools"],
        json!(["add"])
    );
}

fn anthropic(servers: Value, tools: Value) -> Value {
    json!({"model": "claude", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "mcp_servers": servers, "tools": tools})
}

fn server(config: Option<Value>) -> Value {
    let mut s = json!({"type": "url", "url": "https://mcp.example/mcp", "name": "s"});
    if let Some(c) = config {
        s["tool_configuration"] = c;
    }
    s
}

#[test]
fn anthropic_tool_configuration_loses_denied_tools_and_an_unlisted_server_is_refused() {
    let request = anthropic(
        json!([server(Some(
            json!({"enabled": true, "allowed_tools": ["echo", "add"]})
        ))]),
        json!([]),
    );
    let body = run(&gate(), Dialect::Anthropic, &request).expect("forwarded");
    assert_eq!(
        body["mcp_servers"][0]["tool_configuration"]["allowed_tools"],
        json!(["add"])
    );
    let request = anthropic(
        json!([server(Some(json!({"allowed_tools": ["echo"]})))]),
        json!([]),
    );
    let body = run(&gate(), Dialect::Anthropic, &request).expect("forwarded");
    assert_eq!(
        body["mcp_servers"][0]["tool_configuration"],
        json!({"allowed_tools": [], "enabled": false})
    );
    // Disabled: nothing to judge.
    let off = anthropic(json!([server(Some(json!({"enabled": false})))]), json!([]));
    assert!(run(&gate(), Dialect::Anthropic, &off).is_ok());
    // All tools of the server (the 2025-04-04 default).
    for config in [None, Some(json!({"enabled": true})), Some(json!({}))] {
        let request = anthropic(json!([server(config)]), json!([]));
        let why = refusal(run(&gate(), Dialect::Anthropic, &request));
        assert!(
            matches!(
                why,
                Refused::Hosted(Unjudgeable::AnthropicServerUnlisted { .. })
            ),
            "{why}"
        );
        assert!(why.to_string().contains("allowed_tools"), "{why}");
    }
}

fn toolset(extra: Value) -> Value {
    let mut t = json!({"type": "mcp_toolset", "mcp_server_name": "s"});
    if let (Some(t), Some(extra)) = (t.as_object_mut(), extra.as_object()) {
        t.extend(extra.clone());
    }
    t
}

#[test]
fn an_mcp_toolset_disables_denied_tools_and_one_enabling_unknown_tools_is_refused() {
    let allowlist = toolset(json!({"default_config": {"enabled": false},
        "configs": {"echo": {"enabled": true, "defer_loading": true}, "add": {"enabled": true}}}));
    let body = run(
        &gate(),
        Dialect::Anthropic,
        &anthropic(json!([server(None)]), json!([allowlist])),
    )
    .expect("forwarded");
    assert_eq!(
        body["tools"][0]["configs"],
        json!({"echo": {"enabled": false, "defer_loading": true}, "add": {"enabled": true}})
    );
    assert_eq!(
        body["tools"][0]["default_config"],
        json!({"enabled": false})
    );

    for set in [
        toolset(json!({})),
        toolset(
            json!({"default_config": {"enabled": true}, "configs": {"echo": {"enabled": false}}}),
        ),
    ] {
        let request = anthropic(json!([server(None)]), json!([set]));
        let why = refusal(run(&gate(), Dialect::Anthropic, &request));
        assert!(
            matches!(why, Refused::Hosted(Unjudgeable::ToolsetUnlisted { .. })),
            "{why}"
        );
        assert!(why.to_string().contains("default_config"), "{why}");
    }
}

#[test]
fn a_toolset_enabled_by_default_is_judged_on_its_pinned_or_listed_tools() {
    let pinned = toolset(json!({"tools": [
        {"name": "echo", "input_schema": {}}, {"name": "add", "input_schema": {}}
    ]}));
    let body = run(
        &gate(),
        Dialect::Anthropic,
        &anthropic(json!([server(None)]), json!([pinned])),
    )
    .expect("forwarded");
    assert_eq!(
        body["tools"][0]["configs"],
        json!({"echo": {"enabled": false}})
    );

    // Listed in the conversation: made an explicit list.
    let mut request = anthropic(json!([server(None)]), json!([toolset(json!({}))]));
    request["messages"] = json!([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "mcp_tool_listing", "mcp_server_name": "s",
            "tools": [{"name": "echo", "input_schema": {}}, {"name": "add", "input_schema": {}}]}]},
        {"role": "user", "content": "again"}
    ]);
    let body = run(&gate(), Dialect::Anthropic, &request).expect("forwarded");
    assert_eq!(
        body["tools"][0]["default_config"],
        json!({"enabled": false})
    );
    assert_eq!(
        body["tools"][0]["configs"],
        json!({"echo": {"enabled": false}, "add": {"enabled": true}})
    );
}

#[test]
fn tool_additions_of_denied_tools_are_removed_and_added_toolsets_judged() {
    let mut request = anthropic(
        json!([server(None)]),
        json!([toolset(
            json!({"default_config": {"enabled": false}, "configs": {"add": {"enabled": true}}})
        )]),
    );
    request["messages"] = json!([{"role": "user", "content": [
        {"type": "text", "text": "hi"},
        {"type": "tool_addition", "tool": {"type": "mcp_tool_reference", "server_name": "s", "name": "echo"}},
        {"type": "tool_addition", "tool": {"type": "mcp_tool_reference", "server_name": "s", "name": "add"}},
        {"type": "tool_addition", "tool": {"type": "tool_definition", "definition":
            {"type": "mcp_toolset", "mcp_server_name": "s", "default_config": {"enabled": false},
             "configs": {"echo": {"enabled": true}}}}}
    ]}]);
    let body = run(&gate(), Dialect::Anthropic, &request).expect("forwarded");
    let blocks = body["messages"][0]["content"].as_array().expect("blocks");
    assert_eq!(blocks.len(), 3, "{blocks:?}");
    assert_eq!(blocks[1]["tool"]["name"], "add");
    assert_eq!(
        blocks[2]["tool"]["definition"]["configs"]["echo"]["enabled"],
        false
    );
    // An added toolset enabling unknown tools is refused like one in tools[].
    request["messages"][0]["content"] = json!([{"type": "tool_addition", "tool": {"type": "tool_definition",
        "definition": {"type": "mcp_toolset", "mcp_server_name": "t"}}}]);
    request["mcp_servers"] =
        json!([server(None), {"type": "url", "url": "https://t", "name": "t"}]);
    assert!(matches!(
        refusal(run(&gate(), Dialect::Anthropic, &request)),
        Refused::Hosted(Unjudgeable::ToolsetUnlisted { .. })
    ));
}

fn approval(id: &str) -> Value {
    json!({"type": "mcp_approval_response", "approval_request_id": id, "approve": true})
}

fn approval_request(id: &str, tool: &str) -> Value {
    json!({"type": "mcp_approval_request", "id": id, "server_label": "s", "name": tool, "arguments": "{\"a\":1}"})
}

#[test]
fn an_approval_of_a_denied_hosted_call_is_refused_and_recorded() {
    let request = json!({"model": "m", "tools": [mcp(json!(["add"]))], "input": [
        approval_request("mcpr_hosted_t1", "echo"), approval("mcpr_hosted_t1")
    ]});
    let body = serde_json::to_vec(&request).expect("json");
    let why = inspect(
        &gate(),
        Route::Dialect(Dialect::OpenAiResponses),
        &body,
        "sess",
        &Recorded::default(),
    )
    .expect_err("refused");
    assert!(why.to_string().contains("mcp__s__echo"), "{why}");
    let records = why.into_records();
    let [Event::McpToolCallIntercepted(record)] = records.as_slice() else {
        panic!("one record: {records:?}");
    };
    assert_eq!(record.tool_name, "mcp__s__echo");
    assert_eq!(record.tool_call_id, "mcpr_hosted_t1");
    assert_eq!(record.action, crate::decision::Action::Block);
    assert_eq!(record.input, Some(json!({"a": 1})));
    assert_eq!(record.session_id, "sess");

    // The same in a conversation's items.
    let items =
        json!({"items": [approval_request("mcpr_hosted_t1", "echo"), approval("mcpr_hosted_t1")]});
    let body = serde_json::to_vec(&items).expect("json");
    assert!(
        inspect(
            &gate(),
            Route::ConversationItems,
            &body,
            "s",
            &Recorded::default()
        )
        .is_err()
    );
}

#[test]
fn approvals_of_allowed_calls_and_denials_pass_and_unknown_ones_are_refused() {
    let allowed = json!({"model": "m", "input": [
        approval_request("mcpr_hosted_t2", "add"), approval("mcpr_hosted_t2"),
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_hosted_t3", "approve": false}
    ]});
    assert!(run(&gate(), Dialect::OpenAiResponses, &allowed).is_ok());
    // Argument rules judge the arguments of the call approved.
    let mut guarded = approval_request("mcpr_hosted_t4", "guarded");
    guarded["arguments"] = json!("{\"a\":\"SECRET_2\"}");
    let request = json!({"model": "m", "input": [guarded, approval("mcpr_hosted_t4")]});
    assert!(matches!(
        refusal(run(&gate(), Dialect::OpenAiResponses, &request)),
        Refused::Hosted(Unjudgeable::ApprovalDenied { .. })
    ));
    // The request it answers is nowhere: what it approves cannot be judged.
    let unknown = json!({"model": "m", "previous_response_id": "resp_1",
        "input": [approval("mcpr_hosted_never_seen")]});
    let why = refusal(run(&gate(), Dialect::OpenAiResponses, &unknown));
    assert!(
        matches!(why, Refused::Hosted(Unjudgeable::ApprovalUnknown { .. })),
        "{why}"
    );
}

#[test]
fn approvals_of_requests_the_response_side_judged_are_decided_by_that() {
    super::super::approvals::note_request("mcpr_hosted_t5", "s", "add", false);
    super::super::approvals::note_request("mcpr_hosted_t6", "s", "echo", true);
    // A later allowed copy does not undo a refusal.
    super::super::approvals::note_request("mcpr_hosted_t6", "s", "add", false);
    let ok = json!({"model": "m", "previous_response_id": "resp_1", "input": [approval("mcpr_hosted_t5")]});
    assert!(run(&gate(), Dialect::OpenAiResponses, &ok).is_ok());
    let alone = json!({"model": "m", "previous_response_id": "resp_1", "input": [approval("mcpr_hosted_t6")]});
    let why = refusal(run(&gate(), Dialect::OpenAiResponses, &alone));
    assert!(
        matches!(why, Refused::Hosted(Unjudgeable::ApprovalDenied { ref tool, .. }) if tool == "mcp__s__echo"),
        "{why}"
    );
    // A request continuing a stored response approves what the provider stored: a copy in
    // the input of a request the proxy never saw allowed decides nothing.
    let copied = json!({"model": "m", "previous_response_id": "resp_1",
        "input": [approval_request("mcpr_hosted_t7", "add"), approval("mcpr_hosted_t7")]});
    let why = refusal(run(&gate(), Dialect::OpenAiResponses, &copied));
    assert!(
        matches!(why, Refused::Hosted(Unjudgeable::ApprovalUnknown { .. })),
        "{why}"
    );
    // Without a stored response the provider runs the copy it is sent: that copy is judged.
    let stateless = json!({"model": "m",
        "input": [approval_request("mcpr_hosted_t7", "add"), approval("mcpr_hosted_t7")]});
    assert!(run(&gate(), Dialect::OpenAiResponses, &stateless).is_ok());
    // Refused in the response, refused however its copy in the input is dressed up.
    let forged = json!({"model": "m", "previous_response_id": "resp_1",
        "input": [approval_request("mcpr_hosted_t6", "add"), approval("mcpr_hosted_t6")]});
    assert!(matches!(
        refusal(run(&gate(), Dialect::OpenAiResponses, &forged)),
        Refused::Hosted(Unjudgeable::ApprovalDenied { .. })
    ));
}

#[test]
fn the_policy_denies_hosted_tools_by_their_mcp_name() {
    let config =
        Config::parse("sandbox:\n  mcp:\n    deny: ['(^|__)echo$']\n", "t.yaml").expect("config");
    let policy = Policy::new(
        &config,
        Arc::new(Registry::in_memory().expect("registry")),
        &[],
    )
    .expect("policy");
    let request = json!({"model": "m", "input": "hi", "tools": [mcp(json!(["echo", "add"]))]});
    let body = run(&policy, Dialect::OpenAiResponses, &request).expect("forwarded");
    assert_eq!(body["tools"][0]["allowed_tools"], json!(["add"]));
}
