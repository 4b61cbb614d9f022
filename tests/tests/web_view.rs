//! The daemon's web view in a real browser (Debian's headless Chromium, driven by
//! playwright-core): rows appear live as calls are recorded, and a row opens its layers.

use std::process::Command;

use toolwall_tests::{Daemon, peers_dir, workspace_root};

#[test]
#[ignore = "privileged: needs Debian's chromium, which `cargo xtask peers` installs as root"]
fn privileged_web_view_shows_calls_live_and_their_layers() {
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "install chromium: `cargo xtask peers` as root"
    );
    let daemon = Daemon::start("correlator:\n  window_ms: 300\n");
    let screenshot = workspace_root().join("target/web-view.png");
    let out = Command::new("node")
        .arg(workspace_root().join("tests/web/check_view.cjs"))
        .arg(&daemon.api)
        .arg(&screenshot)
        .env("PEERS_NODE", peers_dir().join("node"))
        .output()
        .expect("run node");
    assert!(
        out.status.success(),
        "browser check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the script prints JSON");
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
