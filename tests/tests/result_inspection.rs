//! Result inspection through the real binary: the official Python SDK client calls
//! `server-everything`'s `echo` through `toolwall shim` and `toolwall mcp-proxy`, and what
//! the server answers reaches the client redacted (a secret), withheld (an owner's pattern)
//! or unchanged; the records say which rule found what where, never the value.

mod mcp_common;

use std::path::Path;
use std::process::Command;

use mcp_common::*;
use serde_json::{Value, json};

/// A fake AWS access key id (gitleaks' `aws-access-token`).
const AWS: &str = "AKIAQYLPMN5HHHFPZAM2";

const RULES: &str = r#"sandbox:
  mcp:
    result_inspection:
      secrets: redact
      patterns:
        - name: internal-host
          regex: 'db[0-9]+\.corp\.example'
          action: withhold
"#;

fn calls() -> Value {
    json!([
        ["echo", {"message": format!("the key is {AWS}, keep it")}],
        ["echo", {"message": "connect to db7.corp.example"}],
        ["echo", {"message": "nothing to see"}]
    ])
}

fn check(report: &Value, db: &Path) {
    let calls = report["calls"].as_array().expect("calls");
    assert_eq!(
        calls[0]["result"]["content"][0]["text"],
        "Echo: the key is [toolwall:redacted:aws-access-token], keep it",
        "{report}"
    );
    assert_eq!(calls[1]["result"]["isError"], true, "{report}");
    let withheld = calls[1]["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        withheld.starts_with("toolwall withheld this result") && withheld.contains("internal-host"),
        "the model is told why: {withheld}"
    );
    assert!(!withheld.contains("db7"), "{withheld}");
    assert_eq!(
        calls[2]["result"]["content"][0]["text"], "Echo: nothing to see",
        "{report}"
    );
    let events = recorded(db, "mcp_result_inspected");
    let text = serde_json::to_string(&events).expect("json");
    assert_eq!(events.len(), 2, "{text}");
    assert!(!text.contains(AWS) && !text.contains("db7"), "{text}");
    assert_eq!(events[0]["tool_name"], "echo");
    assert_eq!(events[0]["inspection"], "redact");
    assert_eq!(events[0]["action"], "allow");
    assert_eq!(events[0]["findings"][0]["rule"], "aws-access-token");
    assert_eq!(
        events[0]["findings"][0]["pointer"],
        "/result/content/0/text"
    );
    assert_eq!(events[1]["inspection"], "withhold");
    assert_eq!(events[1]["action"], "block");
    assert_eq!(events[1]["findings"][0]["rule"], "internal-host");
    assert_eq!(events[1]["findings"][0]["kind"], "pattern");
    // `toolwall mcp calls` shows them beside the calls.
    let out = Command::new(toolwall_tests::toolwall_bin())
        .args(["mcp", "calls", "--db"])
        .arg(db)
        .output()
        .expect("toolwall mcp calls");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("result inspected: echo"), "{shown}");
}

#[test]
fn the_shim_redacts_a_secret_and_withholds_a_pattern_in_results() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("toolwall.yaml");
    std::fs::write(&config, RULES).expect("config");
    let db = dir.path().join("events.db");
    let shim = shim_prefix(&config, &db, "everything");
    let report = python_client("stdio", &stdio_argv(&shim), &calls());
    check(&report, &db);
}

#[test]
fn the_filter_proxy_redacts_a_secret_and_withholds_a_pattern_in_results() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("toolwall.yaml");
    std::fs::write(&config, RULES).expect("config");
    let db = dir.path().join("events.db");
    let (_upstream, url) = server_everything_http("streamableHttp");
    let (mut proxy, port) = proxy(
        &url,
        &[
            "--config",
            &config.display().to_string(),
            "--db",
            &db.display().to_string(),
            "--server-id",
            "everything",
        ],
    );
    let report = python_client("http", &format!("http://127.0.0.1:{port}/mcp"), &calls());
    stop_proxy(&mut proxy);
    check(&report, &db);
}

#[test]
fn a_pattern_that_does_not_compile_is_refused_with_its_line() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("bad.yaml");
    std::fs::write(
        &config,
        "sandbox:\n  mcp:\n    result_inspection:\n      patterns:\n        - name: broken\n          regex: '(unclosed'\n",
    )
    .expect("config");
    let out = Command::new(toolwall_tests::toolwall_bin())
        .args(["config", "check"])
        .arg(&config)
        .output()
        .expect("config check");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("bad.yaml:6") && said.contains("result_inspection.patterns[0].regex"),
        "{said}"
    );
}
