//! Real agents waiting for a person: Claude Code and Codex hold a call until it is approved, then
//! run what was approved.

use super::*;

/// Approves every question `daemon` gets until `done`; returns them.
fn approve_all(daemon: &Daemon, done: &std::sync::atomic::AtomicBool) -> Vec<Value> {
    let mut seen: Vec<Value> = Vec::new();
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        for q in daemon.json_lines(&["approvals", "--json"]) {
            if !seen.iter().any(|s| s["id"] == q["id"]) {
                let out = daemon.toolwall(&["approve", q["id"].as_str().expect("an id")]);
                assert!(out.status.success(), "{out:?}");
                seen.push(q);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    seen
}

/// Asking a person with real agents: the policy asks about every `get-sum` call. The agent's
/// turn stops at the proposed call until the test approves it (`toolwall approve`), then the
/// call reaches the agent, and its run at the shim (the daemon's, inside the session) needs
/// no second question.
#[test]
#[ignore = "privileged: needs root (session cgroups); `cargo xtask test` runs it as root"]
fn privileged_claude_code_and_codex_wait_for_a_person_and_run_what_was_approved() {
    assert!(is_root());
    let home = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(home.path());
    let mut daemon = daemon_with(
        &llm.url,
        "argument_rules:\n      - name: sums\n        server: everything\n        tool: get-sum\n        action: ask\n        when:\n          - pointer: /a\n            present: true",
    );
    let done = std::sync::atomic::AtomicBool::new(false);

    // Claude Code.
    let mcp = serde_json::json!({"mcpServers": {"everything": {
        "command": toolwall_bin(), "args": shim_args(&daemon)}}});
    let mcp_path = home.path().join("mcp.json");
    std::fs::write(&mcp_path, mcp.to_string()).unwrap();
    let args = claude_args(
        &mcp_path,
        "Call the echo tool with message hi, and get-sum of 1 and 2.",
        "mcp__everything__echo,mcp__everything__get-sum",
    );
    // Claude Code's call is approved in the web view, in a real browser.
    let token = std::fs::read_to_string(daemon.socket.with_file_name("web-token")).unwrap();
    let (out, browser) = std::thread::scope(|scope| {
        let browser = scope.spawn(|| {
            Command::new("node")
                .arg(toolwall_tests::workspace_root().join("tests/web/approve_view.cjs"))
                .args([&daemon.api, token.trim(), "approve"])
                .arg(toolwall_tests::workspace_root().join("target/web-view-claude.png"))
                .env("PEERS_NODE", peers_dir().join("node"))
                .output()
                .expect("run node")
        });
        let out = exec(
            &daemon,
            "claude-ask",
            home.path(),
            CLAUDE_QUIET,
            &agent_bin("claude"),
            &args,
        );
        (out, browser.join().expect("the browser thread"))
    });
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&browser.stdout);
    assert!(
        browser.status.success(),
        "browser: {said}\n{}",
        String::from_utf8_lossy(&browser.stderr)
    );
    let row: Value = serde_json::from_str(said.lines().next().unwrap_or_default()).expect("row");
    let cells: Vec<&str> = row["row"]
        .as_array()
        .expect("cells")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // Id, digest, then the session, server and tool.
    assert_eq!(
        cells[2..5],
        ["claude-ask", "everything", "get-sum"],
        "asked once, at the LLM layer, in the web view: {row}"
    );
    assert!(daemon.json_lines(&["approvals", "--json"]).is_empty());
    let requests = llm.requests();
    let last = requests
        .iter()
        .rfind(|r| {
            r["path"]
                .as_str()
                .unwrap_or("")
                .starts_with("/v1/messages?beta=true")
        })
        .expect("Claude Code asked the model");
    let history = last["json"]["messages"].to_string();
    assert!(history.contains("Echo: hi"), "{history}");
    assert!(
        history.contains("The sum of 1 and 2 is 3."),
        "the approved call ran: {history}"
    );
    let records = calls(&daemon, "claude-ask");
    let sum = records
        .iter()
        .find(|r| r["tool"] == "get-sum" && r["execution"].is_object())
        .unwrap_or_else(|| panic!("get-sum ran: {records:#?}"));
    assert_eq!(sum["action"], "allow");
    assert!(
        sum["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("approved by the web view"),
        "{sum:#}"
    );

    // Codex CLI.
    done.store(false, std::sync::atomic::Ordering::Relaxed);
    let args = codex_args(
        &toolwall_bin().display().to_string(),
        &shim_args(&daemon),
        "Call the echo tool with message hi, and get-sum of 1 and 2.",
    );
    let env = codex_env(home.path());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (out, asked) = std::thread::scope(|scope| {
        let answering = scope.spawn(|| approve_all(&daemon, &done));
        let out = exec(
            &daemon,
            "codex-ask",
            home.path(),
            &env,
            &agent_bin("codex"),
            &args,
        );
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (out, answering.join().expect("the answering thread"))
    });
    assert!(out.status.success());
    assert_eq!(asked.len(), 1, "asked once, at the LLM layer: {asked:#?}");
    assert_eq!(asked[0]["layer"], "llm");
    assert_eq!(asked[0]["arguments"], serde_json::json!({"a": 1, "b": 2}));
    let requests = llm.requests();
    let last = requests
        .iter()
        .rfind(|r| r["method"] == "POST" && r["path"] == "/v1/responses")
        .expect("Codex asked the model");
    let outputs: Vec<String> = last["json"]["input"]
        .as_array()
        .expect("input items")
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| i["output"].to_string())
        .collect();
    assert_eq!(outputs.len(), 2, "both calls ran: {outputs:?}");
    assert!(
        outputs
            .iter()
            .any(|o| o.contains("The sum of 1 and 2 is 3.")),
        "the approved call ran: {outputs:?}"
    );
    assert!(daemon.stop().success());
    // The servers' cgroups went with the daemon (none stays behind, empty and pinned).
    let root = toolwall::cgroup2_mount().expect("cgroup2").join("toolwall");
    let left: Vec<String> = std::fs::read_dir(&root)
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("claude-ask") || n.starts_with("codex-ask"))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
}
