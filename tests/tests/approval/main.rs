//! Asking a person, through the real binary: argument rules with `action: ask`
//! hold a call until it is approved or denied — with `toolwall approve|deny`, in the web view
//! (a real browser), or by nobody in time — at the MCP layer (the official Python SDK through
//! `toolwall shim` and `toolwall mcp-proxy`, which ask the daemon) and at the LLM layer (the
//! official Anthropic TypeScript SDK through the daemon's proxy), and each question is posted
//! to the configured webhook. Only the daemon's user, outside every session, can answer, and
//! an answer names its question by its id and digest (`approval_answers.rs`: a restart, a
//! stale digest).

mod answering;
#[path = "../approval_common/mod.rs"]
mod approval_common;
mod llm;
#[path = "../mcp_common/mod.rs"]
mod mcp_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use approval_common::*;
use mcp_common::*;
use serde_json::{Value, json};
use toolwall_tests::{Daemon, peers_dir, workspace_root};

/// The config with a webhook (`approval.webhook`) inserted.
fn with_webhook(yaml: &str, url: &str) -> String {
    yaml.replacen(
        "    approval:\n",
        &format!("    approval:\n      webhook:\n        url: {url}\n        headers:\n          Authorization: Bearer hook-secret\n"),
        1,
    )
}

/// A webhook receiver: every POST body it got, as JSON, with its `Authorization`.
struct Webhook {
    url: String,
    got: Arc<Mutex<Vec<(String, Value)>>>,
}

impl Webhook {
    fn start() -> Webhook {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let got = Arc::new(Mutex::new(Vec::new()));
        let seen = got.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream);
                let (mut length, mut auth) = (0usize, String::new());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                    let l = line.trim_end().to_owned();
                    line.clear();
                    if l.is_empty() {
                        break;
                    }
                    let lower = l.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    if lower.starts_with("authorization:") {
                        auth = l["authorization:".len()..].trim().to_owned();
                    }
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_ok()
                    && let Ok(value) = serde_json::from_slice(&body)
                {
                    seen.lock().unwrap().push((auth, value));
                }
                let _ = reader
                    .get_mut()
                    .write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
            }
        });
        Webhook { url, got }
    }
}

fn called_reasons(daemon: &Daemon) -> Vec<(String, String)> {
    daemon
        .json_lines(&["mcp", "events", "--json", "--type", "mcp_tool_called"])
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap_or_default().to_owned(),
                e["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_call_the_rules_ask_about_waits_for_a_person_at_the_shim_and_only_the_owner_answers() {
    let hook = Webhook::start();
    let daemon = Daemon::start(&with_webhook(&config(60, ""), &hook.url));
    let client = shim_client(
        &daemon,
        &json!([
            ["get-sum", {"a": 500, "b": 1}],
            ["get-sum", {"a": 600, "b": 1}],
            ["get-sum", {"a": 2, "b": 3}]
        ]),
    );

    let first = next_question(&daemon);
    let (first_id, first_digest) = id_and_digest(&first);
    assert!(first_id.ends_with("-1"), "{first}");
    assert_eq!(
        (&first["layer"], &first["server_id"], &first["tool"]),
        (&json!("shim"), &json!("everything"), &json!("get-sum"))
    );
    assert_eq!(first["arguments"], json!({"a": 500, "b": 1}));
    assert!(
        first["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("\"big-sums\" asks a person: sums from 100 up need a person"),
        "{first}"
    );

    // Nobody else answers: another user on the socket, a page without the token, the token
    // in a link, or a page of another origin.
    if toolwall_tests::is_root() {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(toolwall_tests::toolwall_bin())
            .args(["approve", &first_id, "--config"])
            .arg(&daemon.config)
            .output()
            .expect("setpriv");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && said.contains("this API serves uid 0"),
            "{said}"
        );
    }
    let token = std::fs::read_to_string(daemon.socket.with_file_name("web-token")).expect("token");
    let api = daemon.api.clone();
    let post = |auth: &str, origin: &str, query: &str| {
        let body = json!({"approve": true, "digest": first_digest}).to_string();
        loopback(
            &api,
            &format!(
                "POST /api/approvals/{first_id}{query} HTTP/1.1\r\nHost: {api}\r\n{auth}{origin}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    assert_eq!(
        loopback(
            &api,
            &format!("GET /api/approvals HTTP/1.1\r\nHost: {api}\r\nConnection: close\r\n\r\n")
        ),
        401
    );
    assert_eq!(
        post("", "", &format!("?token={token}")),
        403,
        "a link cannot answer"
    );
    assert_eq!(
        post(
            &format!("Authorization: Bearer {token}\r\n"),
            "Origin: http://evil.example\r\n",
            ""
        ),
        403,
        "another origin cannot answer"
    );
    assert_eq!(
        daemon.json_lines(&["approvals", "--json"]).len(),
        1,
        "still waiting"
    );

    // The CLI answers what waits under the id, by its digest, and says what it answered.
    let out = daemon.toolwall(&["approve", &first_id]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!(
            r#"approved approval {first_id} (digest {first_digest}): get-sum on everything (session -) with {{"a":500,"b":1}}; asked because "#
        )) && said.contains("\"big-sums\" asks a person"),
        "{out:?}"
    );
    let second = next_question(&daemon);
    assert_eq!(second["arguments"], json!({"a": 600, "b": 1}));
    let (second_id, second_digest) = id_and_digest(&second);
    assert_eq!(
        second_id.split_once('-').map(|p| p.0),
        first_id.split_once('-').map(|p| p.0),
        "one prefix per run"
    );
    assert!(
        daemon
            .toolwall(&[
                "deny",
                &second_id,
                "--digest",
                &second_digest,
                "--reason",
                "too big"
            ])
            .status
            .success()
    );
    let report = finished(client);
    let calls = report["calls"].as_array().expect("calls");
    assert_eq!(
        calls[0]["result"]["content"][0]["text"], "The sum of 500 and 1 is 501.",
        "{report}"
    );
    let refusal = calls[1]["error"]["message"].as_str().unwrap_or_default();
    assert!(
        refusal.contains(&format!(
            "denied by uid 0 (cli): too big (approval {second_id};"
        )),
        "the client is told who denied it and why: {report}"
    );
    assert_eq!(
        calls[2]["result"]["content"][0]["text"],
        "The sum of 2 and 3 is 5."
    );
    let progress: Vec<&str> = report["progress"]
        .as_array()
        .map(|p| p.iter().filter_map(|n| n["message"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        progress.iter().any(|m| m.contains(&format!(
            "waits for a person (toolwall approve {first_id} / toolwall deny {first_id})"
        ))),
        "the client heard its call waits: {progress:?}"
    );

    // Answered once; the record says who decided.
    let again = daemon.toolwall(&["approve", &first_id]);
    assert!(
        !again.status.success()
            && String::from_utf8_lossy(&again.stderr)
                .contains(&format!("no call waits under approval {first_id}")),
        "{again:?}"
    );
    let reasons = called_reasons(&daemon);
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(
        reasons[0].0 == "allow" && reasons[0].1.starts_with("approved by uid"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].0 == "block" && reasons[1].1.contains("too big"),
        "{reasons:?}"
    );
    assert_eq!(reasons[2], ("allow".into(), String::new()));

    // Each question reached the webhook, with its headers, its digest and the commands that
    // answer exactly it.
    let got = hook.got.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0, "Bearer hook-secret");
    assert_eq!(got[0].1["question"]["id"], first_id.as_str());
    assert_eq!(got[0].1["question"]["digest"], first_digest.as_str());
    assert_eq!(got[0].1["question"]["arguments"], json!({"a": 500, "b": 1}));
    assert_eq!(
        got[0].1["approve"],
        format!("toolwall approve {first_id} --digest {first_digest}")
    );
    assert!(
        got[0].1["text"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!(
                "approval {first_id} (digest {first_digest}): get-sum on everything"
            )),
        "{got:?}"
    );
    assert_eq!(
        got[1].1["deny"],
        format!("toolwall deny {second_id} --digest {second_digest}")
    );
}

/// A filter proxy in front of server-everything (`streamableHttp`) whose calls ask `daemon`:
/// the upstream (kept while the test runs), the proxy and its port.
fn proxy_asking(daemon: &Daemon) -> (Proc, Proc, u16) {
    let (upstream, url) = server_everything_http("streamableHttp");
    let (proxy, port) = proxy(
        &url,
        &[
            "--config",
            &daemon.config.display().to_string(),
            "--server-id",
            "everything",
        ],
    );
    (upstream, proxy, port)
}

#[test]
fn a_call_no_one_answers_is_denied_at_the_filter_proxy_when_its_time_is_up() {
    let daemon = Daemon::start(&config(2, ""));
    let (_upstream, mut proxy, port) = proxy_asking(&daemon);
    let started = Instant::now();
    let report = python_client(
        "http",
        &format!("http://127.0.0.1:{port}/mcp"),
        &json!([["get-sum", {"a": 500, "b": 1}], ["get-sum", {"a": 2, "b": 3}]]),
    );
    stop_proxy(&mut proxy);
    let calls = report["calls"].as_array().expect("calls");
    let refusal = calls[0]["error"]["message"].as_str().unwrap_or_default();
    assert!(
        refusal.contains("no one answered within 2 s: denied (approval ")
            && refusal.contains("-1;"),
        "{report}"
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(
        calls[1]["result"]["content"][0]["text"],
        "The sum of 2 and 3 is 5."
    );
    assert!(daemon.json_lines(&["approvals", "--json"]).is_empty());
    let reasons = called_reasons(&daemon);
    assert!(
        reasons[0].0 == "block" && reasons[0].1.contains("no one answered"),
        "{reasons:?}"
    );
}

#[test]
fn without_a_daemon_to_ask_the_shim_refuses_the_call_and_says_why() {
    let dir = tempfile::tempdir().expect("dir");
    let cfg = dir.path().join("toolwall.yaml");
    let yaml = config(
        60,
        &format!(
            "api:\n  socket: {}\nstore:\n  path: {}",
            dir.path().join("nobody.sock").display(),
            dir.path().join("events.db").display()
        ),
    );
    std::fs::write(&cfg, yaml).expect("config");
    let shim = shim_prefix(&cfg, &dir.path().join("events.db"), "everything");
    let report = python_client(
        "stdio",
        &stdio_argv(&shim),
        &json!([["get-sum", {"a": 500, "b": 1}]]),
    );
    let refusal = report["calls"][0]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        refusal.contains("asks a person") && refusal.contains("no toolwall daemon is listening"),
        "{report}"
    );
}

/// Waits (at most 10 s each) until the question of a client that left is gone and a call is
/// recorded; the recorded calls' (action, reason).
fn withdrawn(daemon: &Daemon) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !daemon.json_lines(&["approvals", "--json"]).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the question outlived its client"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reasons = called_reasons(daemon);
        if !reasons.is_empty() || Instant::now() > deadline {
            return reasons;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// At the filter proxy a client leaves by closing its POST's connection: its question goes
/// with it, and its call is recorded refused, as a stdio client's that hangs up.
#[test]
fn an_http_client_that_leaves_mid_question_is_recorded_refused_at_the_filter_proxy() {
    let daemon = Daemon::start(&config(60, ""));
    let (_upstream, mut proxy, port) = proxy_asking(&daemon);
    let session = open_session(port);
    let call = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"get-sum","arguments":{"a":500,"b":1}}}"#;
    let mut client = TcpStream::connect(("127.0.0.1", port)).expect("connect to the proxy");
    client
        .write_all(&request("POST", "/mcp", &session, call))
        .expect("send the call");
    assert_eq!(next_question(&daemon)["arguments"]["a"], 500);
    drop(client);
    let reasons = withdrawn(&daemon);
    stop_proxy(&mut proxy);
    assert!(
        reasons.len() == 1
            && reasons[0].0 == "block"
            && reasons[0]
                .1
                .starts_with("the client left before anyone answered: not run"),
        "{reasons:?}"
    );
}

/// The Python SDK client through the stand-alone shim, killed once its call waits.
#[test]
fn a_client_that_hangs_up_takes_its_question_with_it_and_padded_arguments_are_not_asked() {
    let daemon = Daemon::start(&config(60, ""));
    let mut client = shim_client(&daemon, &json!([["get-sum", {"a": 500, "b": 1}]]));
    next_question(&daemon);
    client.kill().expect("kill the client");
    let _ = client.wait();
    let reasons = withdrawn(&daemon);
    assert!(
        reasons.len() == 1
            && reasons[0].0 == "block"
            && reasons[0]
                .1
                .starts_with("the client left before anyone answered: not run"),
        "{reasons:?}"
    );

    // A client that, while its call waits, sends more than its message limit and leaves:
    // unread, its leaving could not be seen; it is taken as gone at once (or its call would
    // run for no one).
    let flood = format!(
        r#"import json, subprocess, sys, time
shim = subprocess.Popen([{bin:?}, "shim", "--config", {cfg:?}, "--server-id", "everything", "--max-message-bytes", "100000", "--", {everything:?}, "stdio"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
def send(m):
    shim.stdin.write((json.dumps(m) + "\n").encode()); shim.stdin.flush()
send({{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {{"protocolVersion": "2025-06-18", "capabilities": {{}}, "clientInfo": {{"name": "a", "version": "1"}}}}}})
send({{"jsonrpc": "2.0", "method": "notifications/initialized"}})
send({{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}})
send({{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {{"name": "get-sum", "arguments": {{"a": 900, "b": 1}}}}}})
time.sleep(float(sys.argv[1]))
shim.stdin.write(b"x" * 200010); shim.stdin.flush()
time.sleep(30)
"#,
        bin = toolwall_tests::toolwall_bin().display().to_string(),
        cfg = daemon.config.display().to_string(),
        everything = toolwall_tests::server_everything().display().to_string(),
    );
    let mut flooder = Command::new("python3")
        .args(["-c", &flood, "2"])
        .spawn()
        .expect("python3");
    assert_eq!(next_question(&daemon)["arguments"]["a"], 900);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !daemon.json_lines(&["approvals", "--json"]).is_empty() {
        assert!(
            Instant::now() < deadline,
            "a client past its limit kept its question"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = flooder.kill();
    let _ = flooder.wait();

    // A value the rule asks about, padded past what a person can be shown (nested deeper
    // than the record keeps): denied at once.
    let pad = (0..40).fold(json!("x"), |v, _| json!([v]));
    let report = finished(shim_client(
        &daemon,
        &json!([["get-sum", {"a": 500, "b": 1, "pad": pad}]]),
    ));
    let refusal = report["calls"][0]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        refusal.contains("cannot be shown to a person whole"),
        "{refusal}"
    );
}
