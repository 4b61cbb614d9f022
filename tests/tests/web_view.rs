//! The daemon's web view in a real browser (Debian's headless Chromium, driven by
//! playwright-core): rows appear live as calls are recorded, and a row opens its layers.

use std::{io::BufRead, process::Command};

use toolwall_tests::{Daemon, http_unix, peers_dir, workspace_root};

fn chrono_now() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%S.%3NZ"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
#[ignore = "privileged: needs Debian's chromium, which `cargo xtask peers` installs as root"]
fn privileged_web_view_shows_calls_live_and_their_layers() {
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "install chromium: `cargo xtask peers` as root"
    );
    let daemon = Daemon::start("correlator:\n  window_ms: 300\n");
    let screenshot = workspace_root().join("target/web-view.png");
    let mut node = Command::new("node")
        .arg(workspace_root().join("tests/web/check_view.cjs"))
        .arg(&daemon.api)
        .arg(&screenshot)
        .arg(std::fs::read_to_string(daemon.socket.with_file_name("web-token")).expect("web token"))
        .env("PEERS_NODE", peers_dir().join("node"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run node");
    let mut lines = std::io::BufReader::new(node.stdout.take().unwrap()).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(first, "live", "the page went live");
    // Record calls while the page watches: a joined one and one blocked at the LLM layer.
    let now = chrono_now();
    let event = |kind: &str, fields: serde_json::Value| {
        let mut e = serde_json::json!({"type": kind, "timestamp": now, "session_id": "web", "server_id": "everything"});
        e.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        e.to_string()
    };
    let intercepted = |tool: &str, action: &str, reason: &str| {
        event(
            "mcp_tool_call_intercepted",
            serde_json::json!({
            "request_id": "r1", "dialect": "anthropic", "tool_name": format!("mcp__everything__{tool}"),
            "tool_call_id": format!("toolu_{tool}"), "input": {"message": tool}, "server_type": "stdio",
            "server_addr": "", "tool_hash": "", "action": action, "reason": reason}),
        )
    };
    let called = event(
        "mcp_tool_called",
        serde_json::json!({
        "server_type": "stdio", "tool_name": "echo", "jsonrpc_id": 1, "input": {"message": "echo"},
        "action": "allow", "reason": "", "layer": "shim"}),
    );
    let body = [
        intercepted("echo", "allow", ""),
        called,
        intercepted("printEnv", "block", "tool denied by deny regex"),
    ]
    .join("\n");
    let (status, answer) = http_unix(&daemon.socket, "POST", "/api/events", &body).unwrap();
    assert_eq!(status, 202, "{answer}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = node.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut node.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        status.success(),
        "browser check failed:\n{}\n{err}",
        rest.join("\n")
    );
    let seen: serde_json::Value =
        serde_json::from_str(rest.last().expect("a report line")).expect("the script prints JSON");
    println!("web view rows: {}", seen["rows"]);
    let rows = seen["rows"].as_array().unwrap();
    let row = |tool: &str| {
        rows.iter()
            .find(|r| r[3] == tool)
            .unwrap_or_else(|| panic!("no row for {tool}: {rows:?}"))
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let echo = row("echo");
    assert_eq!(
        (echo[4].as_str(), echo[5].as_str(), echo[6].as_str()),
        ("allow", "yes", "yes"),
        "joined: {echo:?}"
    );
    let denied = row("printEnv");
    assert_eq!(
        (denied[4].as_str(), denied[5].as_str(), denied[6].as_str()),
        ("block", "blocked", "—"),
        "{denied:?}"
    );
    assert!(denied[9].contains("deny regex"));
    let detail = seen["detail"].as_str().unwrap();
    assert!(
        detail.contains("mcp_tool_call_intercepted"),
        "the detail pane shows the full events: {detail}"
    );
    println!("screenshot: {}", screenshot.display());
}
