//! Argument rules through the real binary: the official Python SDK client calls
//! `server-everything` through `toolwall shim` and `toolwall mcp-proxy`, each with a config
//! whose rules refuse one call of a tool and allow another of the same tool, and redact a
//! value from the record.

mod mcp_common;

use std::path::Path;
use std::process::Command;

use mcp_common::*;
use serde_json::{Value, json};

const RULES: &str = r#"sandbox:
  mcp:
    argument_rules:
      - name: small-sums
        server: everything
        tool: get-sum
        action: block
        reason: sums from 100 up need a person
        when:
          - pointer: /a
            range: { min: 100 }
      - name: secrets-in-echo
        tool: echo
        action: redact
        when:
          - pointer: /message
            regex: 'secret'
"#;

fn calls() -> Value {
    json!([
        ["get-sum", {"a": 2, "b": 3}],
        ["get-sum", {"a": 500, "b": 1}],
        ["echo", {"message": "token=secret123"}]
    ])
}

fn check(report: &Value, db: &Path) {
    let calls = report["calls"].as_array().expect("calls");
    assert_eq!(
        calls[0]["result"]["content"][0]["text"], "The sum of 2 and 3 is 5.",
        "{report}"
    );
    assert_eq!(calls[1]["error"]["code"], -32602, "{report}");
    let refusal = calls[1]["error"]["message"].as_str().unwrap_or_default();
    assert!(
        refusal.starts_with("toolwall: arguments refused by argument rule")
            && refusal.contains("\"small-sums\"")
            && refusal.contains("need a person"),
        "the client is told why: {refusal}"
    );
    assert_eq!(
        calls[2]["result"]["content"][0]["text"], "Echo: token=secret123",
        "a redacting rule lets the call run unchanged: {report}"
    );
    assert!(
        names(report).contains(&"get-sum".to_owned()),
        "argument rules never hide a tool"
    );
    let events = calls_recorded(db);
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[0]["action"], "allow");
    assert_eq!(events[1]["action"], "block");
    assert!(
        events[1]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("\"small-sums\"")),
        "{}",
        events[1]
    );
    assert_eq!(events[1]["input"], json!({"a": 500, "b": 1}));
    assert_eq!(events[2]["action"], "allow");
    assert_eq!(
        events[2]["input"],
        json!({"message": "[toolwall:redacted]"})
    );
    assert!(
        events[2]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("\"secrets-in-echo\"")),
        "{}",
        events[2]
    );
    // Nowhere in the database, its journal included.
    for file in [db.to_path_buf(), db.with_extension("db-wal")] {
        if let Ok(bytes) = std::fs::read(&file) {
            assert!(
                !bytes.windows(9).any(|w| w == b"secret123"),
                "{} holds the redacted value",
                file.display()
            );
        }
    }
}

#[test]
fn the_shim_refuses_one_call_of_a_tool_allows_another_and_redacts_the_record() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("toolwall.yaml");
    std::fs::write(&config, RULES).expect("config");
    let db = dir.path().join("events.db");
    let shim = shim_prefix(&config, &db, "everything");
    let report = python_client("stdio", &stdio_argv(&shim), &calls());
    check(&report, &db);

    // The registry now knows get-sum's inputSchema (`a` is a number): `config check` refuses a
    // rule whose string test could never hold on it, with the file and line.
    let wrong = dir.path().join("wrong.yaml");
    std::fs::write(
        &wrong,
        format!(
            "store:\n  path: {}\nsandbox:\n  mcp:\n    argument_rules:\n      - tool: get-sum\n        action: block\n        when:\n          - pointer: /a\n            regex: '^1'\n",
            db.display()
        ),
    )
    .expect("config");
    let out = Command::new(toolwall_tests::toolwall_bin())
        .args(["config", "check"])
        .arg(&wrong)
        .output()
        .expect("config check");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("wrong.yaml:9") && said.contains("everything/get-sum: /a is declared number"),
        "{said}"
    );
}

#[test]
fn the_filter_proxy_refuses_one_call_of_a_tool_allows_another_and_redacts_the_record() {
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
