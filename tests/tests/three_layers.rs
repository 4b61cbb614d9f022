//! The whole product at once: a scripted agent (official SDKs) runs under `toolwall exec`; its
//! model is a fake LLM behind the daemon's proxy, its MCP servers are the reference
//! `server-everything` over stdio (behind `toolwall shim`) and over Streamable HTTP (watched by
//! the kernel). `toolwall mcp calls` must show every call joined across the layers that saw it.

mod mcp_common;

use std::process::Command;

use serde_json::{Value, json};
use toolwall_tests::{
    Daemon,
    fake_model::{self, ToolCall},
    is_root, python, server_everything, toolwall_bin, workspace_root,
};

/// The model's answer to the scripted agent: three MCP tool calls, one of them denied.
fn scenario_calls() -> Vec<ToolCall> {
    vec![
        ("mcp__everything__echo".into(), json!({"message": "hi"})),
        ("mcp__everything__get-sum".into(), json!({"a": 1, "b": 41})),
        (
            "mcp__netev__echo".into(),
            json!({"message": "over the network"}),
        ),
    ]
}

/// Runs `tests/peers/SCRIPT TOOLWALL CONFIG SERVER_EVERYTHING LAST` under `toolwall exec` in
/// session `session`; the JSON report it prints.
fn run_agent(daemon: &Daemon, session: &str, script: &str, last: &str) -> Value {
    let out = Command::new(toolwall_bin())
        .args(["exec", "--as-root", "--session", session, "--config"])
        .arg(&daemon.config)
        .arg("--")
        .arg(python())
        .arg(workspace_root().join("tests/peers").join(script))
        .arg(toolwall_bin())
        .arg(&daemon.config)
        .arg(server_everything())
        .arg(last)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "agent failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("the agent prints JSON");
    println!("agent report: {report:#}");
    report
}

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_scripted_agent_is_seen_and_enforced_at_every_layer() {
    assert!(is_root());
    let llm = fake_model::start(|_, _| scenario_calls());
    let (_net_server, net_url) = mcp_common::server_everything_http("streamableHttp");
    let mut daemon = Daemon::start(&format!(
        r#"proxy:
  listen: 127.0.0.1:0
  providers:
    anthropic: {llm}
sandbox:
  mcp:
    deny: ["^get-sum$"]
    servers:
      - id: everything
        type: stdio
        command: {everything}
        args: [stdio]
      - id: netev
        type: http
        url: {net_url}
"#,
        everything = server_everything().display()
    ));
    let report = run_agent(&daemon, "scenario", "scripted_agent.py", &net_url);

    // LLM layer: the denied call never reached the agent; the others did, arguments intact.
    assert_eq!(
        report["tool_uses"],
        serde_json::json!(["mcp__everything__echo", "mcp__netev__echo"])
    );
    assert!(
        report["texts"]
            .to_string()
            .contains("[toolwall] Tool 'mcp__everything__get-sum' blocked by policy")
    );
    assert!(
        report["results"]["mcp__everything__echo"]["ok"]
            .to_string()
            .contains("hi")
    );
    assert!(
        report["results"]["mcp__netev__echo"]["ok"]
            .to_string()
            .contains("over the network")
    );
    // MCP layer: the call the model never asked for is refused as an unknown tool.
    assert!(
        report["direct_get_sum"]["error"]
            .as_str()
            .unwrap()
            .contains("Unknown tool: get-sum"),
        "{report}"
    );

    std::thread::sleep(std::time::Duration::from_millis(2500)); // past the correlation window
    let records = daemon.json_lines(&["mcp", "calls", "--json", "--session", "scenario"]);
    for r in &records {
        println!(
            "call: {:<10} {:<8} {:<16} {:<5} llm={} exec={} conn={}",
            r["server_id"].as_str().unwrap(),
            r["tool"].as_str().unwrap(),
            r["kind"].as_str().unwrap(),
            r["action"].as_str().unwrap(),
            r["intercept"]["layer"],
            r["execution"]["layer"],
            r["connection"]["layer"]
        );
    }
    let find = |server: &str, tool: &str, kind: &str| {
        records
            .iter()
            .find(|r| r["server_id"] == server && r["tool"] == tool && r["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} record for {server}/{tool} in {records:#?}"))
    };
    let echo = find("everything", "echo", "joined");
    assert_eq!(echo["action"], "allow");
    assert_eq!(echo["execution"]["layer"], "shim");
    let blocked = find("everything", "get-sum", "intercept_only");
    assert_eq!(blocked["action"], "block");
    assert_eq!(blocked["intercept"]["layer"], "llm/anthropic");
    let bypass = find("everything", "get-sum", "execution_only");
    assert_eq!(
        bypass["action"], "block",
        "the direct call was refused by the shim"
    );
    let net = records
        .iter()
        .find(|r| r["server_id"] == "netev" && r["tool"] == "echo")
        .unwrap_or_else(|| panic!("no netev/echo record in {records:#?}"));
    assert_eq!(net["intercept"]["action"], "allow");
    assert_eq!(
        net["connection"]["layer"], "kernel",
        "the kernel saw the agent connect to the network server"
    );
    assert!(daemon.stop().success());
}

/// A server's rate limit is counted once, by the daemon, across the LLM layer and every shim
/// process of the session: two calls the model proposed and the agent then ran (each in a shim
/// of its own) spend the burst of two, once each; a third call nobody proposed is refused.
/// Counted per shim process, all three would pass; counted at both layers, the second would
/// already be refused.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_rate_limits_are_counted_once_per_call_across_the_session() {
    assert!(is_root());
    let llm = fake_model::start(|_, _| {
        vec![
            ("mcp__everything__echo".into(), json!({"message": "one"})),
            ("mcp__everything__echo".into(), json!({"message": "two"})),
        ]
    });
    let mut daemon = Daemon::start(&format!(
        r#"proxy:
  listen: 127.0.0.1:0
  providers:
    anthropic: {llm}
sandbox:
  mcp:
    servers:
      - id: everything
        type: stdio
        command: {everything}
        args: [stdio]
    rate_limits:
      enabled: true
      per_server:
        everything: {{calls_per_minute: 1, burst: 2}}
"#,
        everything = server_everything().display()
    ));
    let report = run_agent(&daemon, "rated", "rate_agent.py", "1");
    assert_eq!(
        report["tool_uses"],
        serde_json::json!(["mcp__everything__echo", "mcp__everything__echo"])
    );
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert!(
        results[0]["ok"].as_str().unwrap().contains("one"),
        "{report}"
    );
    assert!(
        results[1]["ok"].as_str().unwrap().contains("two"),
        "{report}"
    );
    assert!(
        results[2]["error"]
            .as_str()
            .unwrap()
            .contains("Unknown tool: echo"),
        "{report}"
    );

    // The refusal's recorded reason is the daemon's rate limit.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let events = daemon.json_lines(&["mcp", "events", "--json", "--type", "mcp_tool_called"]);
    let actions: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["reason"].as_str().unwrap()))
        .collect();
    println!("executions: {actions:?}");
    assert_eq!(actions.len(), 3, "{events:#?}");
    assert_eq!(actions.iter().filter(|(a, _)| *a == "allow").count(), 2);
    let blocked = actions.iter().find(|(a, _)| *a == "block").unwrap();
    assert!(
        blocked.1.contains("rate limit") && blocked.1.contains("\"everything\""),
        "{blocked:?}"
    );
    assert!(daemon.stop().success());
}
