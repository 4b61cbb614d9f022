//! `toolwall mcp-proxy` between the official Python SDK client and `server-everything` over
//! both HTTP transports, serving Streamable HTTP, legacy SSE and stdio clients.

mod mcp_common;

use std::io::Read;
use std::process::Command;
use std::time::{Duration, Instant};

use mcp_common::*;

const DENY: &[&str] = &["echo", "get-tiny-image"];

fn check_all_client_transports(upstream_transport: &str, client: &str) {
    let (_server, url) = server_everything_http(upstream_transport);
    let direct = python_client(client, &url, &standard_calls());
    let (_proxy, port) = proxy(&url, &["--deny", "^echo$,^get-tiny-image$"]);
    for (transport, target) in [
        ("http", format!("http://127.0.0.1:{port}/mcp")),
        ("sse", format!("http://127.0.0.1:{port}/sse")),
    ] {
        let filtered = python_client(transport, &target, &standard_calls());
        assert_filtered(&direct, &filtered, DENY);
    }
    let argv = serde_json::json!([
        toolwall_tests::toolwall_bin().display().to_string(),
        "mcp-proxy",
        "--stdio",
        "--upstream",
        url,
        "--deny",
        "^echo$",
        "--deny",
        "^get-tiny-image$"
    ]);
    let filtered = python_client("stdio", &argv.to_string(), &standard_calls());
    assert_filtered(&direct, &filtered, DENY);
}

#[test]
fn streamable_http_upstream() {
    check_all_client_transports("streamableHttp", "http");
}

#[test]
fn legacy_sse_upstream() {
    check_all_client_transports("sse", "sse");
}

/// Each client session is listed what the upstream lists to *it*: `server-everything` lists
/// sampling, elicitation and roots tools only to clients that declare those capabilities.
/// A session that calls before it lists is listed for first, in its own session; its calls
/// are judged against that list, not another session's.
fn sessions_listed_as_themselves(upstream_transport: &str, client: &str) {
    let (_server, url) = server_everything_http(upstream_transport);
    let all = [("MCP_CLIENT_CAPABILITIES", "sampling,elicitation,roots")];
    let none = [("MCP_CLIENT_CAPABILITIES", "")];
    let calls = serde_json::json!([]);
    let direct_all = python_client_with(client, &url, &calls, &all);
    let direct_none = python_client_with(client, &url, &calls, &none);
    assert!(
        names(&direct_all).len() > names(&direct_none).len(),
        "the server lists more to a client with capabilities: {:?} vs {:?}",
        names(&direct_all),
        names(&direct_none)
    );
    let (_proxy, port) = proxy(&url, &["--deny", "^get-env$"]);
    let stdio = serde_json::json!([
        toolwall_tests::toolwall_bin().display().to_string(),
        "mcp-proxy",
        "--stdio",
        "--upstream",
        url,
        "--deny",
        "^get-env$"
    ])
    .to_string();
    for (transport, target) in [
        ("http", format!("http://127.0.0.1:{port}/mcp")),
        ("sse", format!("http://127.0.0.1:{port}/sse")),
        ("stdio", stdio),
    ] {
        for (env, direct) in [(&all, &direct_all), (&none, &direct_none)] {
            let through = python_client_with(transport, &target, &calls, env);
            let mut want = names(direct);
            want.retain(|n| n != "get-env");
            assert_eq!(names(&through), want, "{transport} client with {env:?}");
        }
        // Calls before any listing: with roots declared, the roots tool is this session's and
        // runs; the sampling tool was never listed to it, and a denied tool stays unknown.
        let calls = serde_json::json!([
            ["get-roots-list", {}],
            ["trigger-sampling-request", {"prompt": "hi"}],
            ["get-env", {}]
        ]);
        let first = python_client_with(
            transport,
            &target,
            &calls,
            &[
                ("MCP_CLIENT_CAPABILITIES", "roots"),
                ("MCP_CLIENT_CALL_FIRST", "1"),
            ],
        );
        assert!(
            call(&first, "get-roots-list").get("result").is_some(),
            "{transport}: {first}"
        );
        for refused in ["trigger-sampling-request", "get-env"] {
            let message = call(&first, refused)["error"]["message"]
                .as_str()
                .unwrap_or_default();
            assert!(
                message.contains("Unknown tool"),
                "{transport} {refused}: {first}"
            );
        }
    }
}

#[test]
fn streamable_http_upstream_lists_each_session_as_itself() {
    sessions_listed_as_themselves("streamableHttp", "http");
}

#[test]
fn legacy_sse_upstream_lists_each_session_as_itself() {
    sessions_listed_as_themselves("sse", "sse");
}

#[test]
fn empty_deny_list_shows_everything_all_denied_shows_nothing() {
    let (_server, url) = server_everything_http("streamableHttp");
    let direct = python_client("http", &url, &standard_calls());
    let (_open, open_port) = proxy(&url, &["--transport", "streamable-http"]);
    let open = python_client(
        "http",
        &format!("http://127.0.0.1:{open_port}/mcp"),
        &standard_calls(),
    );
    assert_eq!(open["tools"], direct["tools"]);
    assert_eq!(open["calls"], direct["calls"]);
    // A second instance side by side with a different deny list.
    let (_closed, closed_port) = proxy(&url, &["--deny", ".*"]);
    let closed = python_client(
        "sse",
        &format!("http://127.0.0.1:{closed_port}/sse"),
        &standard_calls(),
    );
    assert_eq!(closed["tools"], serde_json::json!([]));
    assert_eq!(
        call(&closed, "get-sum")["error"]["message"],
        "Unknown tool: get-sum"
    );
}

fn wait_exit(proc: &mut Proc, within: Duration) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = proc.0.try_wait().expect("try_wait") {
            let mut stderr = String::new();
            if let Some(mut e) = proc.0.stderr.take() {
                let _ = e.read_to_string(&mut stderr);
            }
            return (status, stderr);
        }
        assert!(
            Instant::now() < deadline,
            "the proxy did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn upstream_killed_mid_session_ends_the_proxy() {
    for transport in ["streamableHttp", "sse"] {
        let (server, url) = server_everything_http(transport);
        let (mut proxy, port) = proxy(&url, &["--deny", "^echo$"]);
        let report = python_client(
            "http",
            &format!("http://127.0.0.1:{port}/mcp"),
            &standard_calls(),
        );
        assert!(!names(&report).is_empty());
        drop(server);
        let (status, stderr) = wait_exit(&mut proxy, Duration::from_secs(20));
        assert!(!status.success(), "{transport}: {status}");
        assert!(
            stderr.contains("lost the upstream MCP server") && stderr.contains(&url),
            "{transport}: {stderr}"
        );
    }
}

#[test]
fn unreachable_upstream_and_invalid_regex_stop_start_up() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let output = Command::new(toolwall_tests::toolwall_bin())
        .args(["mcp-proxy", "--upstream", &url, "--listen", "127.0.0.1:0"])
        .output()
        .expect("run toolwall mcp-proxy");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&url) && stderr.contains("cannot connect"),
        "{stderr}"
    );

    let output = Command::new(toolwall_tests::toolwall_bin())
        .args(["mcp-proxy", "--upstream", &url, "--deny", "^a$,[z-a]"])
        .output()
        .expect("run toolwall mcp-proxy");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--deny[1]") && stderr.contains("\"[z-a]\""),
        "{stderr}"
    );
}

#[test]
fn discovery_client_lists_every_tool() {
    // The daemon's discovery client, driven through the proxy's start-up path: the proxy logs
    // how many upstream tools it found; compare with the SDK's direct count.
    for transport in ["streamableHttp", "sse"] {
        let (_server, url) = server_everything_http(transport);
        let direct = python_client(
            if transport == "sse" { "sse" } else { "http" },
            &url,
            &serde_json::json!([]),
        );
        let total = names(&direct).len();
        let (mut proxy, _port) = proxy(&url, &["--deny", "^echo$"]);
        let _ = proxy.0.kill();
        let (_, stderr) = wait_exit(&mut proxy, Duration::from_secs(10));
        assert!(
            stderr.contains(&format!("{} of {total} upstream tools exposed", total - 1)),
            "{transport}: {stderr}"
        );
    }
}

/// `Last-Event-ID` on a GET replays, through the proxy, what the server sent after that event
/// (server-everything keeps an event store): event ids and the header pass through.
#[test]
fn last_event_id_resumption_passes_through() {
    let (_server, url) = server_everything_http("streamableHttp");
    let (_proxy, port) = proxy(&url, &["--deny", "^echo$"]);
    let script = toolwall_tests::workspace_root().join("tests/peers/mcp_resume.py");
    for target in [url.clone(), format!("http://127.0.0.1:{port}/mcp")] {
        let output = Command::new(toolwall_tests::python())
            .arg(&script)
            .arg(&target)
            .output()
            .expect("run mcp_resume.py");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("report");
        assert_eq!(
            report,
            serde_json::json!({"ids": true, "replayed": true}),
            "{target}"
        );
    }
}

/// Legacy `GET /sse` streams are bounded like bridged Streamable HTTP sessions: each holds an
/// upstream session, so past 256 open at once a new one is refused (503) until one closes.
#[test]
fn legacy_sse_streams_are_bounded() {
    use std::io::{BufRead, BufReader, Write};
    let (_server, url) = server_everything_http("sse");
    let (_proxy, port) = proxy(&url, &[]);
    let open = || {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        stream
            .write_all(b"GET /sse HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
            .expect("send");
        let mut reader = BufReader::new(stream);
        let mut status = String::new();
        reader.read_line(&mut status).expect("status line");
        (status, reader)
    };
    let mut held = Vec::new();
    for i in 0..256 {
        let (status, reader) = open();
        assert!(status.contains(" 200 "), "stream {i}: {status}");
        held.push(reader);
    }
    let (status, _) = open();
    assert!(status.contains(" 503 "), "the 257th: {status}");
    // One closes: the next opens (its end is noticed once the proxy writes to it, or at once).
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, reader) = open();
        if status.contains(" 200 ") {
            held.push(reader);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no room after a stream closed: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
