//! Helpers for the approval end-to-end tests (`approval/`, `approval_answers.rs`): a config
//! whose rule asks about big sums, the Python SDK client through the stand-alone shim, the
//! waiting questions as `toolwall approvals --json` lists them, and raw answers on the loopback
//! API as the web view sends them.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use toolwall_tests::{Daemon, workspace_root};

use crate::mcp_common::stdio_argv;

/// Calls of `get-sum` whose `a` is from 100 up wait for a person.
pub fn config(timeout_secs: u64, extra: &str) -> String {
    format!(
        r#"{extra}
sandbox:
  mcp:
    approval:
      timeout_secs: {timeout_secs}
    argument_rules:
      - name: big-sums
        server: everything
        tool: get-sum
        action: ask
        reason: sums from 100 up need a person
        when:
          - pointer: /a
            range: {{ min: 100 }}
"#
    )
}

/// `question`'s id and digest, checked for their form: a run's prefix and a count, 16 hex.
pub fn id_and_digest(question: &Value) -> (String, String) {
    let id = question["id"].as_str().unwrap_or_default().to_owned();
    let digest = question["digest"].as_str().unwrap_or_default().to_owned();
    let (prefix, count) = id.split_once('-').unwrap_or_default();
    assert!(
        prefix.len() == 4
            && prefix.chars().all(|c| c.is_ascii_alphanumeric())
            && count.parse::<u64>().is_ok(),
        "{question}"
    );
    assert!(
        digest.len() == 16 && digest.chars().all(|c| c.is_ascii_hexdigit()),
        "{question}"
    );
    (id, digest)
}

/// Waits until `toolwall approvals --json` lists a question (at most 60 s); returns the first.
pub fn next_question(daemon: &Daemon) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(q) = daemon
            .json_lines(&["approvals", "--json"])
            .into_iter()
            .next()
        {
            return q;
        }
        assert!(
            Instant::now() < deadline,
            "no question came; daemon said:\n{}",
            daemon.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The Python SDK client through `toolwall shim` (which asks `daemon`), asking for progress.
pub fn shim_client(daemon: &Daemon, calls: &Value) -> Child {
    let shim = vec![
        toolwall_tests::toolwall_bin().display().to_string(),
        "shim".into(),
        "--config".into(),
        daemon.config.display().to_string(),
        "--server-id".into(),
        "everything".into(),
        "--".into(),
    ];
    Command::new(toolwall_tests::python())
        .arg(workspace_root().join("tests/peers/mcp_client.py"))
        .args(["stdio", &stdio_argv(&shim), &calls.to_string()])
        .env("MCP_CLIENT_PROGRESS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the Python MCP client")
}

pub fn finished(child: Child) -> Value {
    let out = child.wait_with_output().expect("the client ends");
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

/// One raw HTTP/1.1 request to the loopback API; returns the status.
pub fn loopback(api: &str, request: &str) -> u16 {
    loopback_answer(api, request).0
}

/// One raw HTTP/1.1 request to the loopback API; returns the status and the body.
pub fn loopback_answer(api: &str, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(api).expect("connect the API");
    stream.write_all(request.as_bytes()).expect("send");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    toolwall_tests::status_and_body(&answer)
}

/// The web view's answer to approval `id`: `body` POSTed with the web token.
pub fn web_answer(daemon: &Daemon, id: &str, body: &Value) -> (u16, String) {
    let token = std::fs::read_to_string(daemon.socket.with_file_name("web-token")).expect("token");
    let api = &daemon.api;
    let body = body.to_string();
    loopback_answer(
        api,
        &format!(
            "POST /api/approvals/{id} HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            token.trim(),
            body.len()
        ),
    )
}
