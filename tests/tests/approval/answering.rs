//! Who answers: a person in the web view (a real browser) approves and denies, and a root agent
//! inside a session can neither answer its own call nor hold its question past the time-out.

use super::*;

#[test]
#[ignore = "privileged: needs Debian's chromium, which `cargo xtask peers` installs as root"]
fn privileged_the_web_view_approves_and_denies_a_waiting_call() {
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "install chromium: `cargo xtask peers` as root"
    );
    let daemon = Daemon::start(&config(120, ""));
    let token = std::fs::read_to_string(daemon.socket.with_file_name("web-token")).expect("token");
    let client = shim_client(
        &daemon,
        &json!([
            ["get-sum", {"a": 500, "b": 1}],
            ["get-sum", {"a": 700, "b": 1, "note": "x\u{202E}y"}]
        ]),
    );
    for (verdict, a) in [("approve", "500"), ("deny", "700")] {
        let screenshot = workspace_root().join(format!("target/web-view-{verdict}.png"));
        let out = Command::new("node")
            .arg(workspace_root().join("tests/web/approve_view.cjs"))
            .args([&daemon.api, token.trim(), verdict])
            .arg(&screenshot)
            .env("PEERS_NODE", peers_dir().join("node"))
            .output()
            .expect("run node");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "browser: {said}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut lines = said.lines();
        let row: Value = serde_json::from_str(lines.next().unwrap_or_default()).expect("row");
        let cells: Vec<&str> = row["row"]
            .as_array()
            .expect("cells")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(row["visible"], true);
        assert_eq!(cells[3..5], ["everything", "get-sum"], "{row}");
        assert!(cells[5].contains(&format!("\"a\":{a}")), "{row}");
        assert_eq!(lines.next(), Some("answered"));
        // The dialog named the question's id and digest; a bidirectional override in the
        // arguments is shown as its escape, in the row and in the dialog.
        let dialog: Value = serde_json::from_str(lines.next().unwrap_or_default()).expect("dialog");
        let dialog = dialog["dialog"].as_str().unwrap_or_default();
        assert!(
            dialog.contains(&format!("{} (digest {}):", cells[0], cells[1])),
            "{dialog}"
        );
        if a == "700" {
            assert!(cells[5].contains(r"x\u{202e}y"), "{row}");
            assert!(dialog.contains(r"x\u{202e}y"), "{dialog}");
        }
    }
    let report = finished(client);
    assert_eq!(
        report["calls"][0]["result"]["content"][0]["text"], "The sum of 500 and 1 is 501.",
        "{report}"
    );
    assert!(
        report["calls"][1]["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("denied by the web view: not from the web"),
        "{report}"
    );
    let reasons = called_reasons(&daemon);
    assert!(
        reasons[0].1.starts_with("approved by the web view"),
        "{reasons:?}"
    );
}

/// A root agent inside a session: the loopback API (where the web token it can read would
/// let it answer its own calls) is out of its reach, and a client that never reads its
/// progress notifications still has its question end at the time-out.
#[test]
#[ignore = "privileged: needs root (session cgroups); `cargo xtask test` runs it as root"]
fn privileged_a_root_agent_cannot_answer_its_own_call_nor_hold_its_question_past_the_time_out() {
    assert!(toolwall_tests::is_root());
    let daemon = Daemon::start(&config(2, ""));
    let dir = tempfile::tempdir().expect("dir");
    let agent = dir.path().join("agent.py");
    // Reaches for the API with the token; then asks through the session's shim, never reading
    // what comes back (60 lists fill the pipe first), and stays.
    std::fs::write(
        &agent,
        format!(
            r#"import json, socket, subprocess, sys, time
token = open({token:?}).read().strip()
host, port = {api:?}.split(":")
try:
    socket.create_connection((host, int(port)), timeout=3).close()
    print("API: reached")
except OSError as e:
    print("API: refused", e.errno)
sys.stdout.flush()
shim = subprocess.Popen([{bin:?}, "shim", "--server-id", "everything", "--", {everything:?}, "stdio"],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
def send(m):
    shim.stdin.write((json.dumps(m) + "\n").encode()); shim.stdin.flush()
send({{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {{"protocolVersion": "2025-06-18", "capabilities": {{}}, "clientInfo": {{"name": "a", "version": "1"}}}}}})
send({{"jsonrpc": "2.0", "method": "notifications/initialized"}})
for i in range(60):
    send({{"jsonrpc": "2.0", "id": 100 + i, "method": "tools/list"}})
send({{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {{"name": "get-sum", "arguments": {{"a": 500, "b": 1}}, "_meta": {{"progressToken": "p"}}}}}})
time.sleep(12)
"#,
            token = daemon.socket.with_file_name("web-token").display().to_string(),
            api = daemon.api,
            bin = toolwall_tests::toolwall_bin().display().to_string(),
            everything = toolwall_tests::server_everything().display().to_string(),
        ),
    )
    .expect("agent script");
    let mut exec = Command::new(toolwall_tests::toolwall_bin())
        .args(["exec", "--as-root", "--session", "own-answer", "--config"])
        .arg(&daemon.config)
        .args(["--", "python3"])
        .arg(&agent)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("toolwall exec");
    let mut said = String::new();
    BufReader::new(exec.stdout.take().expect("stdout"))
        .read_line(&mut said)
        .expect("the agent says");
    assert!(said.starts_with("API: refused"), "{said}");
    let q = next_question(&daemon);
    assert_eq!(q["session_id"], "own-answer");
    let asked = Instant::now();
    while !daemon.json_lines(&["approvals", "--json"]).is_empty() {
        assert!(
            asked.elapsed() < Duration::from_secs(8),
            "the question outlived its 2 s time-out"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        matches!(exec.try_wait(), Ok(None)),
        "the agent still holds its pipe"
    );
    // Its session closes when it ends (killed, it left its session's cgroup behind).
    assert!(exec.wait().expect("the agent ends").success());
}
