//! The real coding agents under `toolwall exec`: Claude Code (`@anthropic-ai/claude-code`,
//! Anthropic Messages API) and Codex CLI (`@openai/codex`, OpenAI Responses API), from npm, run
//! non-interactively as a user would, with the reference `server-everything` behind
//! `toolwall shim` as their MCP server. Their model is a fake LLM behind the daemon's proxy
//! (`tests/peers/fake_llm.py`) that asks for `echo` (allowed) and `get-sum` (denied by policy)
//! in each agent's own naming. Shown from what the agent sent back to its model, and from
//! `toolwall mcp calls`: the allowed call ran through the shim, the denied one was replaced at
//! the LLM layer and never ran.

#[path = "../agents_common/mod.rs"]
mod agents_common;
mod asking;
mod results;

use std::{process::Command, time::Duration};

use agents_common::*;
use serde_json::Value;
use toolwall_tests::{Daemon, is_root, peers_dir, server_everything, toolwall_bin};

#[test]
#[ignore = "privileged: needs root (session cgroups); `cargo xtask test` runs it as root"]
fn privileged_claude_code_under_exec_runs_allowed_tools_and_never_sees_denied_ones() {
    assert!(is_root());
    let home = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(home.path());
    let mut daemon = daemon(&llm.url);
    let mcp = serde_json::json!({"mcpServers": {"everything": {
        "command": toolwall_bin(), "args": shim_args(&daemon)}}});
    let mcp_path = home.path().join("mcp.json");
    std::fs::write(&mcp_path, mcp.to_string()).unwrap();
    let args = claude_args(
        &mcp_path,
        "Call the echo tool with message hi, and get-sum of 1 and 2.",
        "mcp__everything__echo,mcp__everything__get-sum",
    );
    let out = exec(
        &daemon,
        "claude",
        home.path(),
        CLAUDE_QUIET,
        &agent_bin("claude"),
        &args,
    );
    assert!(out.status.success());

    let requests = llm.requests();
    let turns: Vec<&Value> = requests
        .iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .unwrap_or("")
                .starts_with("/v1/messages?beta=true")
        })
        .collect();
    assert!(
        turns.len() >= 2,
        "Claude Code reached the model through the proxy, twice: {requests:#?}"
    );
    // get-sum was hidden from Claude Code's tools by the shim; asked for anyway, it was
    // replaced by text: Claude Code sent back the echo result and that text, and ran nothing
    // else (its tool results are the echo's alone).
    let last = turns.last().expect("Claude Code asked the model");
    let history = last["json"]["messages"].to_string();
    assert!(history.contains("Echo: hi"), "{history}");
    assert!(
        history.contains("[toolwall] Tool 'mcp__everything__get-sum' blocked by policy"),
        "{history}"
    );
    let results = last["json"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_result")
        .count();
    assert_eq!(results, 1, "{history}");
    let tools = last["json"]["tools"].to_string();
    assert!(tools.contains("mcp__everything__echo"), "{tools}");
    assert!(
        !tools.contains("get-sum"),
        "the shim hid the denied tool: {tools}"
    );

    assert_calls(&calls(&daemon, "claude"), "llm/anthropic");
    assert!(daemon.stop().success());
}

#[test]
#[ignore = "privileged: needs root (session cgroups); `cargo xtask test` runs it as root"]
fn privileged_codex_cli_under_exec_reaches_the_proxy_and_never_runs_denied_tools() {
    assert!(is_root());
    let home = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(home.path());
    let mut daemon = daemon(&llm.url);
    let args = codex_args(
        &toolwall_bin().display().to_string(),
        &shim_args(&daemon),
        "Call the echo tool with message hi, and get-sum of 1 and 2.",
    );
    let env = codex_env(home.path());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = exec(
        &daemon,
        "codex",
        home.path(),
        &env,
        &agent_bin("codex"),
        &args,
    );
    assert!(out.status.success());

    let requests = llm.requests();
    let turns: Vec<&Value> = requests
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/v1/responses")
        .collect();
    assert!(
        turns.len() >= 2,
        "Codex reached the model through the proxy: {requests:#?}"
    );
    let last = turns.last().unwrap();
    let input = last["json"]["input"].as_array().expect("input items");
    let outputs: Vec<String> = input
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| i["output"].to_string())
        .collect();
    assert_eq!(outputs.len(), 1, "only the allowed call ran: {input:#?}");
    assert!(outputs[0].contains("Echo: hi"), "{outputs:?}");
    let history = last["json"]["input"].to_string();
    let replaced = input.iter().any(|i| {
        i["type"] == "message"
            && i["content"].to_string().contains("[toolwall] Tool '")
            && i["content"].to_string().contains("get_sum")
            && i["content"].to_string().contains("blocked by policy")
    });
    assert!(
        replaced,
        "the replacement message is in the conversation: {history}"
    );
    assert!(
        !input
            .iter()
            .any(|i| i["type"] == "function_call" && i["name"] == "get_sum"),
        "{input:#?}"
    );

    assert_calls(&calls(&daemon, "codex"), "llm/openai-responses");
    assert!(daemon.stop().success());
}
