//! `toolwall mcp-proxy` at its edges, through the real binary: methods the
//! transports do not define, bodies past the limit, a process out of file descriptors, and a
//! legacy-SSE upstream that refuses what the proxy forwards.

mod mcp_common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mcp_common::*;

const CALL: &str = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hi"}}}"#;

#[test]
fn only_the_methods_the_transports_define_are_served() {
    let (_server, url) = server_everything_http("streamableHttp");
    let (_proxy, port) = proxy(&url, &["--deny", "^echo$"]);
    for method in ["PUT", "PATCH", "OPTIONS", "post", "TRACE"] {
        let (status, head, body) = exchange(port, &request(method, "/mcp", "", CALL));
        assert_eq!(status, 405, "{method}: {head}\n{body}");
        assert!(
            head.to_ascii_lowercase()
                .contains("allow: get, post, delete"),
            "{method}: {head}"
        );
    }
    for (method, path, allow) in [("PUT", "/sse", "GET"), ("GET", "/message", "POST")] {
        let (status, head, _) = exchange(port, &request(method, path, "", ""));
        assert_eq!(status, 405, "{method} {path}: {head}");
        assert!(head.contains(allow), "{head}");
    }
    // A GET or DELETE with a body: the body would reach the upstream unjudged.
    for method in ["GET", "DELETE"] {
        let (status, _, body) = exchange(port, &request(method, "/mcp", "", CALL));
        assert_eq!(status, 400, "{method}: {body}");
        assert!(body.contains("no body"), "{body}");
    }
    // The proxy still serves a well-formed POST.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let (status, _, body) = exchange(port, &request("POST", "/mcp", "", init));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("serverInfo"), "{body}");
}

#[test]
fn request_bodies_past_the_limit_are_refused_without_reading_them() {
    let (_server, url) = server_everything_http("streamableHttp");
    let (proxy, port) = proxy(&url, &["--max-message-bytes", "4096"]);
    // Declared larger than the limit: refused at once, nothing read.
    let huge = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 3221225472\r\n\r\n{\"jsonrpc\":";
    let (status, _, body) = exchange(port, huge.as_bytes());
    assert_eq!(status, 413, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("a JSON-RPC error body");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--max-message-bytes")),
        "{error}"
    );
    // Chunked, with no length: refused once past the limit, however much more is sent.
    let before = rss_kb(proxy.0.id());
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    stream
        .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        .expect("head");
    let chunk = format!("{:x}\r\n{}\r\n", 1 << 20, "x".repeat(1 << 20));
    let mut sent = 0usize;
    for _ in 0..256 {
        if stream.write_all(chunk.as_bytes()).is_err() {
            break;
        }
        sent += 1 << 20;
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    let after = rss_kb(proxy.0.id());
    assert!(
        after < before + 64 * 1024,
        "the proxy grew from {before} kB to {after} kB while {sent} bytes were sent"
    );
    // An allowed message within the limit still goes through.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let (status, _, body) = exchange(port, &request("POST", "/mcp", "", init));
    assert_eq!(status, 200, "{body}");
}

#[test]
fn out_of_file_descriptors_the_proxy_waits_and_stays_up() {
    let (_server, url) = server_everything_http("streamableHttp");
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("proxy.log");
    let port = free_port();
    let mut command = Command::new(toolwall_tests::toolwall_bin());
    command
        .args(["mcp-proxy", "--upstream", &url, "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"));
    // SAFETY: setrlimit is async-signal-safe and touches only the child's limits.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut proc = Proc(command.spawn().expect("start toolwall mcp-proxy"));
    wait_port(&mut proc, port, "toolwall mcp-proxy");
    // Hold more connections than the proxy has descriptors, across a watchdog probe (5 s).
    let held: Vec<TcpStream> = (0..120)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    std::thread::sleep(Duration::from_secs(7));
    assert!(
        proc.0.try_wait().expect("try_wait").is_none(),
        "the proxy exited while out of descriptors: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let text = std::fs::read_to_string(&log).expect("log");
    let accept_lines = text.matches("cannot accept").count();
    assert!(accept_lines >= 1, "no accept failure logged:\n{text}");
    assert!(
        accept_lines <= 20 && text.len() < 64 * 1024,
        "{accept_lines} accept failures logged ({} bytes) in 7 s",
        text.len()
    );
    drop(held);
    // Descriptors free again: the proxy serves.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _, body) = exchange(port, &request("POST", "/mcp", "", init));
        if status == 200 {
            assert!(body.contains("serverInfo"), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no answer after the descriptors came back: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_request_the_legacy_upstream_refuses_is_answered() {
    let (_server, url) = server_everything_http("sse");
    let (_proxy, port) = proxy(&url, &["--timeout", "10"]);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let (status, head, body) = exchange(port, &request("POST", "/mcp", "", init));
    assert_eq!(status, 200, "{body}");
    let header = format!("Mcp-Session-Id: {}\r\n", session_of(&head));
    let (status, _, _) = exchange(
        port,
        &request(
            "POST",
            "/mcp",
            &header,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ),
    );
    assert!(status == 202 || status == 200, "{status}");
    // server-everything's legacy SSE transport answers a batch with HTTP 400.
    let batch =
        r#"[{"jsonrpc":"2.0","id":5,"method":"ping"},{"jsonrpc":"2.0","id":6,"method":"ping"}]"#;
    let started = Instant::now();
    let (status, _, body) = exchange(port, &request("POST", "/mcp", &header, batch));
    assert_eq!(status, 200, "{body}");
    let replies: serde_json::Value = serde_json::from_str(&body).expect("JSON replies");
    let ids: Vec<i64> = replies
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["id"].as_i64()).collect())
        .unwrap_or_default();
    assert_eq!(ids, [5, 6], "{body}");
    assert!(
        replies
            .as_array()
            .is_some_and(|a| a.iter().all(|r| r["error"]["message"].is_string())),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// One request the upstream breaks (Node resets a connection whose headers pass its 16 KiB
/// limit while the body is still coming) is answered with an error; the proxy stays up for
/// everyone else (it does not take that for a lost upstream and exit).
#[test]
fn a_response_the_upstream_breaks_fails_that_request_only() {
    let (_server, url) = server_everything_http("streamableHttp");
    let (mut proxy, port) = proxy(&url, &[]);
    let pad = format!("X-Pad: {}\r\n", "a".repeat(20 * 1024));
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"ping","params":{{"_meta":{{"pad":"{}"}}}}}}"#,
        "b".repeat(1024 * 1024)
    );
    for _ in 0..3 {
        let (status, _, body) = exchange(port, &request("POST", "/mcp", &pad, &big));
        assert!(status >= 400, "{status}: {body}");
    }
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        proxy.0.try_wait().expect("try_wait").is_none(),
        "the proxy exited after one broken response"
    );
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let (status, _, body) = exchange(port, &request("POST", "/mcp", "", init));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("serverInfo"), "{body}");
}

/// The descriptors the proxy holds.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Streamable HTTP clients bridged to a legacy SSE upstream that leave without a DELETE: each
/// session held an upstream stream for ever (30 clients, 60 descriptors). Idle ones are now
/// ended after `--session-idle-timeout`; one with its GET stream open is kept.
#[test]
fn bridged_sessions_left_without_delete_are_ended() {
    let (_server, url) = server_everything_http("sse");
    let (proxy, port) = proxy(&url, &["--session-idle-timeout", "2"]);
    let pid = proxy.0.id();
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    // One client that stays: its GET stream is open.
    let (status, head, body) = exchange(port, &request("POST", "/mcp", "", init));
    assert_eq!(status, 200, "{body}");
    let kept = session_of(&head);
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .write_all(
            format!(
                "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\nMcp-Session-Id: {kept}\r\n\r\n"
            )
            .as_bytes(),
        )
        .expect("open the GET stream");
    let baseline = open_fds(pid);
    // A session is bridged only for an initialize (junk POSTs held an upstream stream each),
    // and a session id is bounded.
    for _ in 0..20 {
        let (status, _, _) = exchange(port, &request("POST", "/mcp", "", "x"));
        assert_eq!(status, 400);
    }
    let huge = format!("Mcp-Session-Id: {}\r\n", "a".repeat(300));
    let (status, _, _) = exchange(port, &request("GET", "/mcp", &huge, ""));
    assert_eq!(status, 400, "a 300-byte session id is refused");
    assert!(open_fds(pid) <= baseline + 2, "junk POSTs hold descriptors");
    let mut left = Vec::new();
    for _ in 0..30 {
        let (status, head, body) = exchange(port, &request("POST", "/mcp", "", init));
        assert_eq!(status, 200, "{body}");
        left.push(session_of(&head));
    }
    let grown = open_fds(pid);
    assert!(grown >= baseline + 30, "{baseline} -> {grown} descriptors");
    let deadline = Instant::now() + Duration::from_secs(20);
    while open_fds(pid) > baseline + 2 {
        assert!(
            Instant::now() < deadline,
            "still {} descriptors (baseline {baseline}) 20 s after the clients left",
            open_fds(pid)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ping = r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#;
    let (status, _, _) = exchange(
        port,
        &request(
            "POST",
            "/mcp",
            &format!("Mcp-Session-Id: {}\r\n", left[0]),
            ping,
        ),
    );
    assert_eq!(status, 404, "an ended session still answered");
    let (status, _, body) = exchange(
        port,
        &request("POST", "/mcp", &format!("Mcp-Session-Id: {kept}\r\n"), ping),
    );
    assert_eq!(
        status, 200,
        "the session with a GET stream was ended: {body}"
    );
    drop(stream);
}

/// A quick call's response stream is answered whole (one write); a slow one still streams:
/// its progress reaches the client before its result.
#[test]
fn a_slow_calls_progress_streams_before_its_result() {
    let (_server, url) = server_everything_http("streamableHttp");
    let (_proxy, port) = proxy(&url, &[]);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let (status, head, body) = exchange(port, &request("POST", "/mcp", "", init));
    assert_eq!(status, 200, "{body}");
    let header = format!(
        "Mcp-Session-Id: {}\r\nMCP-Protocol-Version: 2025-06-18\r\n",
        session_of(&head)
    );
    let (status, _, _) = exchange(
        port,
        &request(
            "POST",
            "/mcp",
            &header,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ),
    );
    assert!(status == 202 || status == 200, "{status}");
    let quick = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get-sum","arguments":{"a":1,"b":2}}}"#;
    let (status, head, body) = exchange(port, &request("POST", "/mcp", &header, quick));
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#""text":"The sum of 1 and 2 is 3."#),
        "{body}"
    );
    assert!(
        head.to_ascii_lowercase().contains("content-length:"),
        "a quick call was not answered whole: {head}"
    );
    let slow = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"trigger-long-running-operation","arguments":{"duration":1,"steps":2},"_meta":{"progressToken":"p"}}}"#;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    stream
        .write_all(&request("POST", "/mcp", &header, slow))
        .expect("send");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let mut progress_before_result = None;
    loop {
        let n = stream.read(&mut buf).expect("read the stream");
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&seen);
        let done = text.contains("Long running operation completed");
        if progress_before_result.is_none() && text.contains("notifications/progress") {
            progress_before_result = Some(!done);
        }
        if done {
            break;
        }
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.contains("Long running operation completed"),
        "no result: {text}"
    );
    assert_eq!(
        progress_before_result,
        Some(true),
        "the progress did not stream ahead of the result: {text}"
    );
}

/// A charset that would run a denied tool: the client's `Content-Type` names `charset=utf-7`;
/// a proxy that judged the body as UTF-8 (a call of `harmless`) and passed the header on would
/// let an express.json() server decode another call (`secret`, the last `name`). The body that
/// goes upstream is the filter's JSON, so the header that goes with it is always plain JSON.
#[test]
fn a_charset_in_content_type_cannot_change_the_call_upstream() {
    let marker_dir = tempfile::tempdir().expect("temp dir");
    let marker = marker_dir.path().join("marker");
    let port = free_port();
    let mut server = Proc(
        Command::new("node")
            .arg(toolwall_tests::workspace_root().join("tests/peers/mcp_marker_server.mjs"))
            .args(["express", &port.to_string()])
            .env("TOOLWALL_MARKER", &marker)
            .env("TOOLWALL_PEERS_DIR", toolwall_tests::peers_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the express MCP server"),
    );
    wait_port(&mut server, port, "the express MCP server");
    let url = format!("http://127.0.0.1:{port}/mcp");
    let (_proxy, proxy_port) = proxy(&url, &["--deny", "^secret$"]);
    // UTF-7 of `","` and `":"`: as UTF-8 the string `x` holds them; as UTF-7 it closes early
    // and a second `name` follows.
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"harmless","arguments":{},"x":"+ACIALAAi-name+ACIAOgAi-secret"}}"#;
    let utf7 = "Content-Type: application/json; charset=utf-7\r\n";
    let attack = |port: u16| {
        let mut req = request("POST", "/mcp", "", call);
        // `request` writes its own Content-Type: put ours in its place.
        let text = String::from_utf8(req.clone()).expect("ascii");
        req = text
            .replace("Content-Type: application/json\r\n", utf7)
            .into_bytes();
        exchange(port, &req)
    };
    // Direct, the attack is real: the server runs `secret`.
    let _ = attack(port);
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(
        ran.contains("secret"),
        "the attack does not work directly: {ran:?}"
    );
    std::fs::remove_file(&marker).expect("reset the marker");
    // Through the proxy, the server runs what the proxy judged.
    let (status, _, body) = attack(proxy_port);
    assert_eq!(status, 200, "{body}");
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(
        !ran.contains("secret"),
        "a denied tool ran: {ran:?}\n{body}"
    );
    assert!(
        ran.contains("harmless"),
        "the judged call ran: {ran:?}\n{body}"
    );
}

/// An upstream hid an unfiltered tool list (with the denied `echo`) behind lone CRs inside
/// another event's line; the proxy split lines at `\n` only and passed it, while the SDK
/// clients' SSE parsers split at a lone CR too and read a `message`. Judged by the Python
/// SDK's own parser: no message the client reads through the proxy names the denied tool.
#[test]
fn a_message_hidden_behind_lone_crs_is_filtered_as_the_client_reads_it() {
    let (_upstream, port) = edges_upstream();
    let (_proxy, proxy_port) = proxy(
        &format!("http://127.0.0.1:{port}/mcp"),
        &["--deny", "^echo$"],
    );
    let call = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"get-sum","arguments":{}}}"#;
    let (status, _, body) = exchange(
        proxy_port,
        &request(
            "POST",
            "/mcp",
            "Mcp-Session-Id: s1\r\nMCP-Protocol-Version: 2025-06-18\r\n",
            call,
        ),
    );
    assert_eq!(status, 200, "{body}");
    let parse = "import json, sys\nfrom httpx2._sse import _SSEParser\np = _SSEParser()\nfor e in list(p.decode(sys.stdin.read())) + list(p.flush()):\n    print(json.dumps({'event': e.event, 'data': e.data}))\n";
    let mut child = Command::new(toolwall_tests::python())
        .args(["-c", parse])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the Python SDK's SSE parser");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("feed the parser");
    let out = child.wait_with_output().expect("parse");
    let events = String::from_utf8_lossy(&out.stdout);
    let messages: Vec<serde_json::Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "message")
        .collect();
    assert!(!messages.is_empty(), "the client read no message: {body:?}");
    for m in &messages {
        let data = m["data"].as_str().unwrap_or_default();
        assert!(
            !data.contains("\"echo\""),
            "the client read a message naming the denied tool: {data}\n{body:?}"
        );
    }
}

/// A bridged session's response is matched to its request by id as the peers compare ids: the
/// upstream answers `8.0` with `8` (as the Python server does), and the POST gets its answer
/// instead of waiting out `--timeout` while the answer sat in a queue.
#[test]
fn a_response_whose_id_the_server_rewrote_reaches_its_post() {
    let (_server, url) = server_everything_http("sse");
    let (_proxy, port) = proxy(&url, &["--timeout", "10"]);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let (status, head, body) = exchange(port, &request("POST", "/mcp", "", init));
    assert_eq!(status, 200, "{body}");
    let session = format!("Mcp-Session-Id: {}\r\n", session_of(&head));
    let started = Instant::now();
    let call = r#"{"jsonrpc":"2.0","id":8.0,"method":"tools/call","params":{"name":"echo","arguments":{"message":"eight"}}}"#;
    let (status, _, body) = exchange(port, &request("POST", "/mcp", &session, call));
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("eight") && !body.contains("did not answer"),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "waited out the timeout: {body}"
    );
}

/// An upstream whose call stream breaks: the client's stream breaks too, after what passed
/// (no end chunk, so no client takes the stream as ended by the server and waits for an
/// answer that cannot come); one that breaks before any event is answered 502. Both were a
/// cleanly ended response. An event past the message limit counts as a break unless the
/// answers were all in.
#[test]
fn a_call_stream_the_upstream_breaks_reaches_the_client_broken() {
    let (_upstream, port) = edges_upstream();
    let (mut proxy, proxy_port) = proxy(
        &format!("http://127.0.0.1:{port}/mcp"),
        &["--max-message-bytes", "4096"],
    );
    let call = |id: u32, name: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{{}},"_meta":{{"progressToken":"p"}}}}}}"#
        );
        let mut stream = TcpStream::connect(("127.0.0.1", proxy_port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        let headers = "Mcp-Session-Id: s1\r\nMCP-Protocol-Version: 2025-06-18\r\n";
        stream
            .write_all(&request("POST", "/mcp", headers, &body))
            .expect("send");
        let mut seen = Vec::new();
        let _ = stream.read_to_end(&mut seen);
        String::from_utf8_lossy(&seen).into_owned()
    };
    let late = call(7, "breaks-late");
    assert!(late.starts_with("HTTP/1.1 200 "), "{late}");
    assert!(
        late.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{late}"
    );
    assert!(late.contains("notifications/progress"), "{late}");
    assert!(
        !late.ends_with("0\r\n\r\n"),
        "the broken stream reached the client as ended: {late}"
    );
    let early = call(8, "breaks-early");
    assert!(early.starts_with("HTTP/1.1 502 "), "{early}");
    // An event past the message limit ends a stream as a break does, what passed first
    // delivered (in the same read as the event)...
    let big = call(9, "big-after-progress");
    assert!(big.starts_with("HTTP/1.1 200 "), "{big}");
    assert!(big.contains("notifications/progress"), "{big}");
    assert!(
        !big.ends_with("0\r\n\r\n") && !big.contains("xxxx"),
        "{big}"
    );
    // ...but once the answer passed, what follows it is not the client's: answered whole.
    let answered = call(10, "big-after-answer");
    assert!(answered.starts_with("HTTP/1.1 200 "), "{answered}");
    assert!(answered.contains(r#""text": "done""#), "{answered}");
    assert!(!answered.contains("xxxx"), "{answered}");
    assert!(
        proxy.0.try_wait().expect("try_wait").is_none(),
        "the proxy exited"
    );
}

/// The edge tests' hostile upstream (`tests/peers/mcp_edges_upstream.py`), started, and its port.
fn edges_upstream() -> (Proc, u16) {
    let port = free_port();
    let mut upstream = Proc(
        Command::new(toolwall_tests::python())
            .arg(toolwall_tests::workspace_root().join("tests/peers/mcp_edges_upstream.py"))
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the hostile upstream"),
    );
    wait_port(&mut upstream, port, "the hostile upstream");
    (upstream, port)
}
