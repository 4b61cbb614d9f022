//! `toolwall mcp-proxy` keeps each client's view its own, through the real binary, in front of
//! a server without sessions whose tool list depends on who asks (`mcp_identity_upstream.py`):
//!
//! - a tool listed to one identity (an `X-Api-Key`, a 2026-07-28 envelope's capabilities) is
//!   never callable by another: each identity is judged against the list it was given;
//! - a legacy SSE session holds the upstream credentials it was opened with, so it takes
//!   requests from its opener only, whoever knows its id;
//! - a call the upstream refuses (a revoked token's 401) is recorded refused, never `allow`;
//! - a request may not borrow an id another POST of its session still waits under (the
//!   TypeScript SDK's server routes responses by id, so the other's answer could reach it);
//! - a listing on a session's behalf ends within `--timeout` and `--max-message-bytes` in all,
//!   however many pages the server offers;
//! - a call the upstream took but never answered (its connection closed, or a 5xx) is recorded
//!   as judged, saying it may have run, in front of Streamable HTTP and with `--stdio`;
//! - numbers are read and forwarded by their text: a redacted result keeps its other numbers
//!   byte for byte, and a pattern sees a 24-digit number's digits.

mod mcp_common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use mcp_common::*;
use serde_json::Value;

/// The upstream on a free port; its URL.
fn upstream(ran: &Path, revoked: &Path) -> (Proc, String) {
    let script = toolwall_tests::workspace_root().join("tests/peers/mcp_identity_upstream.py");
    let (proc, port) = start_listening("the identity upstream", |port| {
        Proc(
            Command::new(toolwall_tests::python())
                .arg(&script)
                .arg(port.to_string())
                .env("RAN", ran)
                .env("REVOKED", revoked)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("start the identity upstream"),
        )
    });
    (proc, format!("http://127.0.0.1:{port}/mcp"))
}

struct Setup {
    _dir: tempfile::TempDir,
    ran: PathBuf,
    revoked: PathBuf,
    db: PathBuf,
    _upstream: Proc,
    url: String,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("temp dir");
    let ran = dir.path().join("ran");
    let revoked = dir.path().join("revoked");
    let db = dir.path().join("events.db");
    let (upstream, url) = upstream(&ran, &revoked);
    Setup {
        _dir: dir,
        ran,
        revoked,
        db,
        _upstream: upstream,
        url,
    }
}

fn ran(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// One Streamable HTTP POST of `body` with `headers`; its status and body.
fn post(port: u16, headers: &str, body: &str) -> (u16, String) {
    let (status, _, body) = exchange(port, &request("POST", "/mcp", headers, body));
    (status, body)
}

fn call(id: u32, name: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{{}}}}}}"#
    )
}

const V2025: &str = "MCP-Protocol-Version: 2025-06-18\r\n";

#[test]
fn a_server_without_sessions_lists_each_identity_as_itself() {
    let s = setup();
    let (_proxy, port) = proxy(&s.url, &[]);
    let guest = &format!("{V2025}X-Api-Key: guest\r\n");
    let admin = &format!("{V2025}X-Api-Key: admin\r\n");
    // The guest calls first: listed for as itself, it was never given admin_reset.
    let (_, body) = post(port, guest, &call(1, "admin_reset"));
    assert!(body.contains("Unknown tool"), "{body}");
    // The admin lists and is given admin_reset; the guest is still refused it.
    let (_, body) = post(
        port,
        admin,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    );
    assert!(body.contains("admin_reset"), "{body}");
    let (_, body) = post(port, guest, &call(3, "admin_reset"));
    assert!(body.contains("Unknown tool"), "{body}");
    let (_, body) = post(port, admin, &call(4, "admin_reset"));
    assert!(body.contains("ran admin_reset"), "{body}");
    assert_eq!(ran(&s.ran), ["admin_reset admin"]);

    // 2026-07-28: the envelope each request carries says who asks.
    let v2026 = "MCP-Protocol-Version: 2026-07-28\r\n";
    let envelope = |capabilities: &str| {
        format!(
            r#""_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{{"name":"t","version":"1"}},"io.modelcontextprotocol/clientCapabilities":{capabilities}}}"#
        )
    };
    let list = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{{{}}}}}"#,
        envelope(r#"{"sampling":{}}"#)
    );
    let (_, body) = post(port, &format!("{v2026}Mcp-Method: tools/list\r\n"), &list);
    assert!(body.contains("sample_llm"), "{body}");
    let sample = |id: u32, capabilities: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"sample_llm","arguments":{{}},{}}}}}"#,
            envelope(capabilities)
        )
    };
    let routed = format!("{v2026}Mcp-Method: tools/call\r\nMcp-Name: sample_llm\r\n");
    let (_, body) = post(port, &routed, &sample(6, "{}"));
    assert!(body.contains("Unknown tool"), "{body}");
    let (_, body) = post(port, &routed, &sample(7, r#"{"sampling":{}}"#));
    assert!(body.contains("ran sample_llm"), "{body}");
    // One body speaking for two clients is refused whole.
    let two = format!("[{},{}]", sample(8, r#"{"sampling":{}}"#), sample(9, "{}"));
    let (status, body) = post(port, &routed, &two);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("different _meta envelopes"), "{body}");
    assert_eq!(ran(&s.ran), ["admin_reset admin", "sample_llm None"]);
    // Capabilities in `_meta` at any revision, with or without a protocol version, say who
    // asks.
    let (_, body) = post(
        port,
        V2025,
        r#"{"jsonrpc":"2.0","id":10,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/clientCapabilities":{"sampling":{}}}}}"#,
    );
    assert!(body.contains("sample_llm"), "{body}");
    let (_, body) = post(port, V2025, &call(11, "sample_llm"));
    assert!(body.contains("Unknown tool"), "{body}");
    assert_eq!(ran(&s.ran), ["admin_reset admin", "sample_llm None"]);
}

/// A legacy SSE client's stream.
struct SseStream {
    reader: BufReader<TcpStream>,
}

impl SseStream {
    fn open(port: u16, headers: &str) -> Self {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("read timeout");
        write!(
            stream,
            "GET /sse HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\nCache-Control: no-store\r\n{headers}\r\n"
        )
        .expect("send");
        SseStream {
            reader: BufReader::new(stream),
        }
    }

    /// The data of the first event that `matches`.
    fn until(&mut self, matches: impl Fn(&str) -> bool) -> String {
        loop {
            let mut line = String::new();
            match self.reader.read_line(&mut line) {
                Ok(0) | Err(_) => panic!("the stream ended before the event looked for"),
                Ok(_) => {
                    if let Some(data) = line.strip_prefix("data:")
                        && matches(data.trim())
                    {
                        return data.trim().to_owned();
                    }
                }
            }
        }
    }

    /// The message that answers request `id`.
    fn answer(&mut self, id: u32) -> Value {
        let data = self.until(|d| {
            serde_json::from_str::<Value>(d)
                .is_ok_and(|m| m["id"] == id && m.get("method").is_none())
        });
        serde_json::from_str(&data).expect("JSON")
    }
}

/// The `mcp_tool_called` records of a proxy's database (the proxy stopped), as (action, reason).
fn calls_recorded_by(proxy: &mut Proc, db: &Path) -> Vec<(String, String)> {
    stop_proxy(proxy);
    reasons_in(db)
}

/// The `mcp_tool_called` records of a database, as (action, reason).
fn reasons_in(db: &Path) -> Vec<(String, String)> {
    calls_recorded(db)
        .iter()
        .map(|v| {
            (
                v["action"].as_str().unwrap_or_default().to_owned(),
                v["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_legacy_sse_session_takes_requests_from_its_opener_only_and_records_refusals() {
    let s = setup();
    let db = s.db.to_str().expect("a UTF-8 path");
    let (mut proxy, port) = proxy(&s.url, &["--db", db]);
    let opener = "Authorization: Bearer alice\r\nX-Api-Key: admin\r\n";
    let mut stream = SseStream::open(port, opener);
    let endpoint = stream.until(|d| d.starts_with("/message?sessionId="));
    let message =
        |headers: &str, body: &str| exchange(port, &request("POST", &endpoint, headers, body)).0;
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    // Knowing the session's id is not enough: no credentials, another's, or part of them.
    for stranger in [
        "",
        "Authorization: Bearer mallory\r\nX-Api-Key: admin\r\n",
        "Authorization: Bearer alice\r\n",
        "Authorization: Bearer alice\r\nX-Api-Key: admin\r\nCookie: a=b\r\n",
    ] {
        assert_eq!(message(stranger, initialize), 403, "{stranger:?}");
    }
    assert_eq!(message(opener, initialize), 202);
    stream.answer(1);
    assert_eq!(
        message(
            opener,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#
        ),
        202
    );
    assert_eq!(message(opener, &call(2, "admin_reset")), 202);
    let ran_it = stream.answer(2);
    assert!(ran_it.to_string().contains("ran admin_reset"), "{ran_it}");
    // The token is revoked: the upstream refuses the next call with 401.
    std::fs::write(&s.revoked, "").expect("revoke");
    assert_eq!(message(opener, &call(3, "echo")), 202);
    let refused = stream.answer(3);
    assert!(refused.get("error").is_some(), "{refused}");
    assert_eq!(ran(&s.ran), ["admin_reset admin"]);
    let recorded = calls_recorded_by(&mut proxy, &s.db);
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    assert_eq!(recorded[0].0, "allow", "{recorded:?}");
    assert_eq!(recorded[1].0, "block", "{recorded:?}");
    assert!(recorded[1].1.contains("refused"), "{recorded:?}");
}

/// The pages a server without end served to one call's listing, by `limits`.
fn pages_served(limits: &[&str], page_bytes: usize) -> (usize, String) {
    let s = setup();
    let (_proxy, port) = proxy(&s.url, limits);
    let (_, body) = post(
        port,
        &format!("{V2025}X-Pages: {page_bytes}\r\n"),
        &call(1, "echo"),
    );
    let pages = ran(&s.ran).iter().filter(|l| *l == "PAGE").count();
    assert!(!ran(&s.ran).iter().any(|l| l.starts_with("echo")), "{body}");
    (pages, body)
}

#[test]
fn a_listing_on_a_sessions_behalf_is_bounded_in_time_and_bytes() {
    // A page a second, for ever: the listing ends at --timeout, not after 100 pages.
    let (pages, body) = pages_served(&["--timeout", "3"], 10);
    assert!((2..=4).contains(&pages), "{pages} pages: {body}");
    assert!(body.contains("Unknown tool"), "{body}");
    // Pages of 400 kB: the third passes 1 MiB in all, and the listing ends there.
    let (pages, body) = pages_served(
        &["--timeout", "60", "--max-message-bytes", "1048576"],
        400_000,
    );
    assert_eq!(pages, 3, "{body}");
    assert!(body.contains("Unknown tool"), "{body}");
}

#[test]
fn a_request_may_not_borrow_an_id_another_post_of_its_session_waits_under() {
    let (_server, url) = server_everything_http("streamableHttp");
    let (_proxy, port) = proxy(&url, &[]);
    let session = open_session(port);
    let slow = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"trigger-long-running-operation","arguments":{"duration":3,"steps":1}}}"#;
    let waiting = {
        let session = session.clone();
        std::thread::spawn(move || exchange(port, &request("POST", "/mcp", &session, slow)))
    };
    std::thread::sleep(Duration::from_millis(1000));
    // 7, 7.0 and 7e0 are one id to the servers, and "7" to the Python SDK's.
    for id in ["7", "7.0", "7e0", "\"7\""] {
        let echo = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"message":"borrowed"}}}}}}"#
        );
        let (status, _, body) = exchange(port, &request("POST", "/mcp", &session, &echo));
        assert_eq!(status, 400, "{id}: {body}");
        assert!(body.contains("already in use"), "{body}");
    }
    let (status, _, body) = waiting.join().expect("the slow call");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Long running operation completed"), "{body}");
    // A client that leaves before its answer came leaves its id held: the server still runs
    // the request, and would send its answer to the next request given that id.
    let abandoned = slow.replace(r#""id":7"#, r#""id":11"#);
    {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .write_all(&request("POST", "/mcp", &session, &abandoned))
            .expect("send");
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_millis(200));
    let echo11 = r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"echo","arguments":{"message":"borrowed"}}}"#;
    let (status, _, body) = exchange(port, &request("POST", "/mcp", &session, echo11));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("already in use"), "{body}");
    // A DELETE the upstream refuses (an unknown protocol version) ends nothing: the session
    // goes on, and so does the request its id waits for.
    let bogus = session.replace("2025-06-18", "1999-01-01");
    let (status, _, _) = exchange(port, &request("DELETE", "/mcp", &bogus, ""));
    assert!(!(200..300).contains(&status), "{status}");
    let (status, _, body) = exchange(port, &request("POST", "/mcp", &session, echo11));
    assert_eq!(status, 400, "{body}");
    // Answered: the id is free again.
    let echo = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"message":"again"}}}"#;
    let (status, _, body) = exchange(port, &request("POST", "/mcp", &session, echo));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("again"), "{body}");
}

#[test]
fn numbers_are_judged_and_forwarded_by_their_text() {
    let s = setup();
    let config = s.db.with_file_name("toolwall.yaml");
    let config_arg = config.to_str().expect("a UTF-8 path");
    let numbers = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"numbers","arguments":{}}}"#;
    // The key in the result is redacted; the numbers beside it are forwarded as written.
    std::fs::write(
        &config,
        "sandbox:\n  mcp:\n    result_inspection:\n      secrets: redact\n",
    )
    .expect("config");
    let (mut redacting, port) = proxy(&s.url, &["--config", config_arg]);
    let (status, body) = post(port, V2025, numbers);
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("[toolwall:redacted:aws-access-token]"),
        "{body}"
    );
    // Digits as written (an exponent is written `e+N`, one number to every reader).
    for kept in [
        r#""big":987654321098765432101234"#,
        r#""small":1.50"#,
        r#""exp":1e+2"#,
    ] {
        assert!(body.contains(kept), "{kept}: {body}");
    }
    stop_proxy(&mut redacting);
    // A pattern of twenty digits or more sees the number's digits, as it would a string's.
    std::fs::write(
        &config,
        "sandbox:\n  mcp:\n    result_inspection:\n      patterns:\n        - name: long-number\n          regex: '[0-9]{20,}'\n          action: withhold\n",
    )
    .expect("config");
    let (_withholding, port) = proxy(&s.url, &["--config", config_arg]);
    let (status, body) = post(port, V2025, numbers);
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("987654321098765432101234"), "{body}");
    assert!(body.contains("long-number"), "{body}");
}

#[test]
fn a_call_the_upstream_took_but_never_answered_is_recorded_as_possibly_run() {
    let s = setup();
    let db = s.db.to_str().expect("a UTF-8 path");
    let (mut proxy, port) = proxy(&s.url, &["--db", db]);
    let (status, body) = post(port, V2025, &call(1, "vanish"));
    assert_eq!(status, 502, "{body}");
    let (status, body) = post(port, V2025, &call(2, "gateway"));
    assert_eq!(status, 504, "{body}");
    // They ran: the records say they may have, not that they were refused.
    assert_eq!(ran(&s.ran), ["vanish None", "gateway None"]);
    let recorded = calls_recorded_by(&mut proxy, &s.db);
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    for ((action, reason), why) in recorded.iter().zip([
        "the upstream sent no answer (HTTP 502 Bad Gateway to the client)",
        "the upstream answered HTTP 504 Gateway Timeout",
    ]) {
        assert_eq!(action, "allow", "{recorded:?}");
        assert!(
            reason.contains(&format!("forwarded, but {why}: it may have run")),
            "{recorded:?}"
        );
    }

    // The same with `--stdio`, where the proxy is the client of the upstream.
    std::fs::remove_file(&s.ran).expect("clear the log");
    let stdio_db = s.db.with_file_name("stdio.db");
    let mut stdio = Command::new(toolwall_tests::toolwall_bin())
        .args(["mcp-proxy", "--stdio", "--upstream", &s.url, "--db"])
        .arg(&stdio_db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start mcp-proxy --stdio");
    let mut input = stdio.stdin.take().expect("stdin");
    let mut output = BufReader::new(stdio.stdout.take().expect("stdout"));
    let mut answer = |line: &str, id: u32| -> Value {
        writeln!(input, "{line}").expect("write");
        input.flush().expect("flush");
        loop {
            let mut got = String::new();
            assert!(
                output.read_line(&mut got).expect("read") > 0,
                "stdout ended"
            );
            let v: Value = serde_json::from_str(&got).expect("a JSON line");
            if v["id"] == id {
                return v;
            }
        }
    };
    answer(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        1,
    );
    answer(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#, 2);
    for (id, name) in [(3, "gateway"), (4, "vanish")] {
        let refused = answer(&call(id, name), id);
        assert!(refused.get("error").is_some(), "{refused}");
    }
    // One connection closed mid-call ends nothing: the session goes on (the upstream is up).
    let after = answer(&call(5, "echo"), 5);
    assert!(after.get("result").is_some(), "{after}");
    drop(input);
    let _ = stdio.wait();
    assert_eq!(ran(&s.ran), ["gateway None", "vanish None", "echo None"]);
    let recorded = reasons_in(&stdio_db);
    assert_eq!(recorded.len(), 3, "{recorded:?}");
    assert!(
        recorded.iter().all(|(action, _)| action == "allow"),
        "{recorded:?}"
    );
    for (_, reason) in &recorded[..2] {
        assert!(reason.contains("it may have run"), "{recorded:?}");
    }
    assert!(!recorded[2].1.contains("it may have run"), "{recorded:?}");
}
