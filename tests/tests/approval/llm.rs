//! At the LLM layer: a call the model proposes is held in the daemon's proxy until a person
//! answers, and once approved it runs at the MCP layer without a second question.

use super::*;

/// `tests/peers/fake_llm.py`: its model proposes `echo {"message": "hi"}` and
/// `get-sum {"a": 1, "b": 2}` to a request that offers the `everything` tools.
struct FakeLlm {
    child: Child,
    url: String,
}

impl FakeLlm {
    fn start(dir: &Path) -> FakeLlm {
        let port_file = dir.join("port");
        let child = Command::new("python3")
            .arg(workspace_root().join("tests/peers/fake_llm.py"))
            .arg("--log")
            .arg(dir.join("requests.jsonl"))
            .arg("--port-file")
            .arg(&port_file)
            .spawn()
            .expect("start fake_llm.py");
        let deadline = Instant::now() + Duration::from_secs(10);
        let port = loop {
            if let Ok(port) = std::fs::read_to_string(&port_file) {
                break port;
            }
            assert!(Instant::now() < deadline, "fake_llm.py did not start");
            std::thread::sleep(Duration::from_millis(50));
        };
        FakeLlm {
            child,
            url: format!("http://127.0.0.1:{}", port.trim()),
        }
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One agent turn through the daemon's LLM proxy (the Anthropic TypeScript SDK).
fn agent_turn(daemon: &Daemon, mode: &str) -> Child {
    Command::new("node")
        .arg(workspace_root().join("tests/peers/llm_ask.mjs"))
        .arg(daemon.proxy.as_deref().expect("the LLM proxy is on"))
        .arg(mode)
        .env("TOOLWALL_PEERS_DIR", peers_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run node")
}

#[test]
fn a_proposed_call_is_held_until_answered_and_once_approved_runs_without_a_second_question() {
    let dir = tempfile::tempdir().expect("dir");
    let llm = FakeLlm::start(dir.path());
    // fake_llm proposes get-sum with a = 1: ask about small sums here.
    let yaml = config(
        60,
        &format!(
            "proxy:\n  listen: 127.0.0.1:0\n  providers:\n    anthropic: {}",
            llm.url
        ),
    )
    .replace("range: { min: 100 }", "range: { max: 10 }")
    // Declared, so the model's `mcp__everything__get-sum` is known as that server's tool.
    .replace(
        "  mcp:\n",
        "  mcp:\n    servers:\n      - id: everything\n        type: stdio\n        command: npx\n        args: [server-everything]\n",
    );
    let daemon = Daemon::start(&yaml);

    for (mode, approve) in [("stream", true), ("whole", false)] {
        let turn = agent_turn(&daemon, mode);
        let q = next_question(&daemon);
        assert_eq!(
            (&q["layer"], &q["arguments"]),
            (&json!("llm"), &json!({"a": 1, "b": 2}))
        );
        let (id, _) = id_and_digest(&q);
        let verdict = if approve { "approve" } else { "deny" };
        assert!(daemon.toolwall(&[verdict, &id]).status.success());
        let out = turn.wait_with_output().expect("node ends");
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let seen: Value = serde_json::from_slice(&out.stdout).expect("a JSON line");
        let names: Vec<&str> = seen["tool_calls"]
            .as_array()
            .expect("tool calls")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        if approve {
            assert_eq!(
                names,
                ["mcp__everything__echo", "mcp__everything__get-sum"],
                "{mode}: {seen}"
            );
            assert_eq!(seen["tool_calls"][1]["input"], json!({"a": 1, "b": 2}));
        } else {
            assert_eq!(names, ["mcp__everything__echo"], "{mode}: {seen}");
            assert!(
                seen["text"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("denied by uid 0 (cli)"),
                "the model reads why: {seen}"
            );
        }
    }
    let intercepted = daemon.json_lines(&[
        "mcp",
        "events",
        "--json",
        "--type",
        "mcp_tool_call_intercepted",
    ]);
    let actions: Vec<&str> = intercepted
        .iter()
        .filter(|e| e["tool_name"] == "mcp__everything__get-sum")
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(actions, ["allow", "block"], "{intercepted:?}");

    // The approved call runs at the MCP layer without a second question — once.
    let client = shim_client(&daemon, &json!([["get-sum", {"a": 1, "b": 2}]]));
    let report = finished(client);
    assert_eq!(
        report["calls"][0]["result"]["content"][0]["text"], "The sum of 1 and 2 is 3.",
        "{report}"
    );
    let reasons = called_reasons(&daemon);
    assert!(
        reasons[0]
            .1
            .contains("approved by uid 0 (cli) when the model proposed it (approval ")
            && reasons[0].1.contains("-1;"),
        "{reasons:?}"
    );
    let client = shim_client(&daemon, &json!([["get-sum", {"a": 1, "b": 2}]]));
    let q = next_question(&daemon);
    assert_eq!(q["layer"], "shim", "a second run is asked anew: {q}");
    assert!(
        daemon
            .toolwall(&["deny", &id_and_digest(&q).0])
            .status
            .success()
    );
    let report = finished(client);
    assert!(
        report["calls"][0]["error"]["message"].is_string(),
        "{report}"
    );
}
