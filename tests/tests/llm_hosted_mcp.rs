//! Hosted MCP tools — the provider connects to the MCP server and runs the tool itself — driven
//! through the real `toolwall run` by the official Python SDKs (`tests/peers/llm_hosted_mcp.py`:
//! `openai` `responses.create` with `type: "mcp"` tools, a forcing `tool_choice`, approvals;
//! `anthropic` `beta.messages.create` with `mcp_servers` and `mcp_toolset`). A fake provider
//! records every request body it receives. Through toolwall it is never asked to run the denied
//! tool (`echo`, by `deny: ["(^|__)echo$"]`): no forwarded request allows or enables it, forces
//! it, or approves a call of it, and what toolwall refuses never reaches it; the allowed hosted
//! tool (`add`) still does. Run direct (the SDK straight at the fake), the same scenarios do
//! ask for `echo`, so each one is a real test of the proxy.

use std::process::Command;

use serde_json::Value;
use toolwall_tests::{Daemon, python, workspace_root};

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// Whether a request body lets the provider run (or forces, or approves) `tool` of server `s`.
fn asks_for(body: &Value, tool: &str) -> bool {
    let tools = body["tools"].as_array().into_iter().flatten();
    // No list (or a filter without names): any tool of the server.
    let by_openai = tools.clone().any(|t| {
        let allowed = &t["allowed_tools"];
        t["type"] == "mcp"
            && ((allowed.is_array() && strings(allowed).contains(&tool))
                || (allowed.is_object() && allowed["tool_names"].is_null())
                || strings(&allowed["tool_names"]).contains(&tool)
                || allowed.is_null())
    });
    let forced = body["tool_choice"]["type"] == "mcp" && body["tool_choice"]["name"] == tool;
    let by_toolset = tools.clone().any(|t| {
        let default_on = t["default_config"]["enabled"].as_bool().unwrap_or(true);
        t["type"] == "mcp_toolset"
            && t["configs"][tool]["enabled"]
                .as_bool()
                .unwrap_or(default_on)
    });
    // A server's `tool_configuration` (mcp-client-2025-04-04; absent, all its tools unless a
    // toolset configures them).
    let by_server = body["mcp_servers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| {
            let config = &s["tool_configuration"];
            let with_toolset = tools
                .clone()
                .any(|t| t["type"] == "mcp_toolset" && t["mcp_server_name"] == s["name"]);
            config["enabled"] != false
                && ((config.is_null() && !with_toolset)
                    || (!config.is_null() && config["allowed_tools"].is_null())
                    || strings(&config["allowed_tools"]).contains(&tool))
        });
    let approved = body["input"].as_array().into_iter().flatten().any(|i| {
        i["type"] == "mcp_approval_response"
            && i["approve"] == true
            && i["approval_request_id"]
                .as_str()
                .is_some_and(|id| id.contains(&format!("_{tool}_")))
    });
    by_openai || forced || by_toolset || by_server || approved
}

/// Runs the peer against `base`, serving the fake provider on `port`.
fn run_peer(port: u16, base: &str) -> Value {
    let out = Command::new(python())
        .arg(workspace_root().join("tests/peers/llm_hosted_mcp.py"))
        .arg(port.to_string())
        .arg(base)
        .output()
        .expect("run the SDK peer");
    assert!(
        out.status.success(),
        "llm_hosted_mcp.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the peer prints JSON")
}

/// Scenarios toolwall refuses whole (nothing reaches the provider), the others forwarded.
const REFUSED: [&str; 5] = [
    "openai_forced_echo",
    "openai_unlisted",
    "openai_approve_echo",
    "openai_approve_proposed",
    "anthropic_toolset_default",
];
/// Scenarios whose forwarded request must still let the provider run `add`.
const ADD_REACHES: [&str; 5] = [
    "openai_list",
    "openai_filter",
    "openai_approve_add",
    "anthropic_toolset",
    "anthropic_tool_configuration",
];

#[test]
fn the_provider_is_never_asked_to_run_a_denied_hosted_mcp_tool() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let daemon = Daemon::start(&format!(
        "sandbox:\n  mcp:\n    deny: [\"(^|__)echo$\"]\nproxy:\n  listen: 127.0.0.1:0\n  providers:\n    anthropic: http://127.0.0.1:{port}\n    openai: http://127.0.0.1:{port}\nnetmon:\n  enabled: false\n"
    ));
    let proxy = daemon.proxy.clone().expect("the LLM proxy is on");
    let proxied = run_peer(port, &proxy);
    let direct = run_peer(port, &format!("http://127.0.0.1:{port}"));
    let scenarios = direct.as_object().expect("scenarios");
    assert!(scenarios.len() >= 12, "{direct}");
    let mut failures = Vec::new();
    for (name, without) in scenarios {
        let with = &proxied[name];
        let bodies = |r: &Value| r["bodies"].as_array().cloned().unwrap_or_default();
        // Without toolwall the SDK asks the provider for echo (the proposal scenario is the
        // provider's own doing: its SDK then shows an approval request for echo).
        let direct_echo = bodies(without).iter().any(|b| asks_for(b, "echo"))
            || strings(&without["ok"]).contains(&"mcp_approval_request:s:echo");
        if !direct_echo {
            failures.push(format!("{name}: direct, nothing asks for echo: {without}"));
        }
        if let Some(b) = bodies(with).iter().find(|b| asks_for(b, "echo")) {
            failures.push(format!(
                "{name}: through toolwall the provider was asked for echo: {b}"
            ));
        }
        if REFUSED.contains(&name.as_str()) {
            let refused = with["status"] == 400
                && with["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("toolwall:"));
            if !refused || !bodies(with).is_empty() {
                failures.push(format!("{name}: not refused before the provider: {with}"));
            }
        } else if with["ok"].is_null() || bodies(with).is_empty() {
            failures.push(format!("{name}: not forwarded: {with}"));
        }
        if ADD_REACHES.contains(&name.as_str()) && !bodies(with).iter().any(|b| asks_for(b, "add"))
        {
            failures.push(format!(
                "{name}: the allowed tool add did not reach the provider: {with}"
            ));
        }
    }
    // Approving the call toolwall took out of the response is refused as that call, denied.
    let approval = &proxied["openai_approve_proposed"]["error"];
    if !approval
        .as_str()
        .is_some_and(|e| e.contains("approves \"mcp__s__echo\", which the policy denies"))
    {
        failures.push(format!(
            "the approval of the proposed echo call: {approval}"
        ));
    }
    // The provider's proposal to run echo never reaches the SDK as something to approve.
    let proposal = strings(&proxied["openai_proposes_echo"]["ok"]);
    if proposal
        .iter()
        .any(|t| t.starts_with("mcp_approval_request"))
    {
        failures.push(format!(
            "the SDK was shown an approval request: {proposal:?}"
        ));
    }
    if !failures.is_empty() {
        failures.push(format!("daemon stderr:\n{}", daemon.stderr()));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
