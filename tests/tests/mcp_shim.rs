//! `toolwall shim` between the official Python SDK client and `server-everything stdio`.

mod mcp_common;

use std::process::Command;

use mcp_common::*;

fn shim(deny: &[&str]) -> Vec<String> {
    let mut argv = vec![
        toolwall_tests::toolwall_bin().display().to_string(),
        "shim".into(),
    ];
    for d in deny {
        argv.push("--deny".into());
        argv.push((*d).into());
    }
    argv.push("--".into());
    argv
}

#[test]
fn shim_hides_and_refuses_denied_tools() {
    let direct = python_client("stdio", &stdio_argv(&[]), &standard_calls());
    assert!(names(&direct).contains(&"echo".to_owned()), "{direct}");
    let shimmed = python_client(
        "stdio",
        &stdio_argv(&shim(&["^echo$", "^get-tiny-image$"])),
        &standard_calls(),
    );
    assert_filtered(&direct, &shimmed, &["echo", "get-tiny-image"]);
}

#[test]
fn shim_with_no_deny_list_shows_everything_and_with_all_denied_nothing() {
    let direct = python_client("stdio", &stdio_argv(&[]), &standard_calls());
    let open = python_client("stdio", &stdio_argv(&shim(&[])), &standard_calls());
    assert_eq!(open["tools"], direct["tools"]);
    assert_eq!(open["calls"], direct["calls"]);
    let closed = python_client("stdio", &stdio_argv(&shim(&[".*"])), &standard_calls());
    assert_eq!(closed["tools"], serde_json::json!([]));
    assert_eq!(
        call(&closed, "get-sum")["error"]["message"],
        "Unknown tool: get-sum"
    );
}

/// The server's stdin is teed to a file: the denied call must not be in it, the allowed one
/// must.
#[test]
fn the_server_never_sees_a_denied_call() {
    let dir = std::env::temp_dir().join(format!("toolwall-e2e-shim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let log = dir.join("server-stdin.log");
    let script = format!(
        "tee -a '{}' | exec '{}' stdio",
        log.display(),
        toolwall_tests::server_everything().display()
    );
    let mut argv = shim(&["^echo$"]);
    argv.extend(["bash".to_owned(), "-c".to_owned(), script]);
    let report = python_client(
        "stdio",
        &serde_json::to_string(&argv).expect("argv"),
        &standard_calls(),
    );
    assert_eq!(call(&report, "echo")["error"]["code"], -32602);
    let seen = std::fs::read_to_string(&log).expect("server stdin log");
    assert!(
        seen.contains("\"get-sum\""),
        "the allowed call reached the server: {seen}"
    );
    assert!(
        !seen.contains("\"echo\""),
        "the denied call reached the server: {seen}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn invalid_regex_stops_start_up() {
    let output = Command::new(toolwall_tests::toolwall_bin())
        .args(["shim", "--deny", "ok,(unclosed", "--", "true"])
        .output()
        .expect("run toolwall shim");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--deny[1]") && stderr.contains("\"(unclosed\""),
        "{stderr}"
    );
}

#[test]
fn exit_code_of_the_server_is_the_shims() {
    let status = Command::new(toolwall_tests::toolwall_bin())
        .args(["shim", "--", "sh", "-c", "exit 7"])
        .stdin(std::process::Stdio::null())
        .status()
        .expect("run toolwall shim");
    assert_eq!(status.code(), Some(7));
}

#[test]
fn signals_reach_the_server_and_its_fate_is_the_exit_code() {
    let mut child = Command::new(toolwall_tests::toolwall_bin())
        .args(["shim", "--", "sleep", "60"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run toolwall shim");
    // Let the shim start its child and install its handlers.
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: kill has no memory preconditions; the pid is our live child.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let status = child.wait().expect("wait for the shim");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
}

#[test]
fn a_server_that_ignores_stdin_eof_is_terminated() {
    let start = std::time::Instant::now();
    // stdin is /dev/null: EOF at once; `sleep` never reads it, so the shim must SIGTERM it
    // after its grace period.
    let status = Command::new(toolwall_tests::toolwall_bin())
        .args(["shim", "--", "sleep", "60"])
        .stdin(std::process::Stdio::null())
        .status()
        .expect("run toolwall shim");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
}

/// A request may not borrow the id of one still waiting for its answer: the server would
/// answer both under one id, and the second's result (here `get-env`'s environment) be taken
/// for the first's (a slow tool a result rule may exempt). The borrower is refused and never
/// reaches the server.
#[test]
fn a_request_may_not_borrow_an_outstanding_id() {
    use std::io::{BufRead, BufReader, Write};
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("server-stdin.log");
    let script = format!(
        "tee -a '{}' | exec '{}' stdio",
        log.display(),
        toolwall_tests::server_everything().display()
    );
    let mut argv = shim(&[]);
    argv.extend(["bash".to_owned(), "-c".to_owned(), script]);
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the shim");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut send = |line: &str| writeln!(stdin, "{line}").expect("write");
    send(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    let _ = lines.next();
    send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    send(
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"trigger-long-running-operation","arguments":{"duration":2,"steps":1}}}"#,
    );
    send(
        r#"{"jsonrpc":"2.0","id":7.0,"method":"tools/call","params":{"name":"get-env","arguments":{}}}"#,
    );
    // The answers to id 7, until the slow call's result.
    let mut answers = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("a line");
        let message: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        if message.get("method").is_none() && message["id"].as_f64() == Some(7.0) {
            answers.push(message);
            if answers.last().is_some_and(|m| m.get("result").is_some()) {
                break;
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        answers[0]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("already used")),
        "{answers:?}"
    );
    assert!(
        answers[1]
            .to_string()
            .contains("Long running operation completed"),
        "{answers:?}"
    );
    let seen = std::fs::read_to_string(&log).expect("server stdin log");
    assert!(
        !seen.contains("get-env"),
        "the borrower reached the server: {seen}"
    );
}
