//! Every MCP protocol revision through `toolwall shim` and `toolwall mcp-proxy`:
//! the official Python SDK client pinned to 2026-07-28 (stateless, no handshake), `auto`
//! (`server/discover`, then fallback), 2025-11-25, 2025-06-18, 2025-03-26 and the legacy
//! HTTP+SSE 2024-11-05, against the SDK's dual-era server (`peers/mcp_marker_server.py`), a
//! 2026-07-28-only server and a legacy HTTP+SSE one.
//! Each run lists the tools (the denied `secret` is hidden), calls `harmless` (it runs) and
//! `secret` (refused as an unknown tool); the server's marker file says what really ran.

mod mcp_common;

use std::process::{Command, Stdio};

use mcp_common::*;
use serde_json::{Value, json};

const REVISIONS: [&str; 5] = [
    "2026-07-28",
    "auto",
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
];

fn peer(name: &str) -> String {
    toolwall_tests::workspace_root()
        .join("tests/peers")
        .join(name)
        .display()
        .to_string()
}

fn python() -> String {
    toolwall_tests::python().display().to_string()
}

/// Runs the pinned client; its report and what the server ran.
fn run_client(marker: &std::path::Path, args: &[&str]) -> (Value, String) {
    let _ = std::fs::remove_file(marker);
    let output = Command::new(python())
        .arg(peer("mcp_revision_client.py"))
        .args(args)
        .env("TOOLWALL_MARKER", marker)
        .stdin(Stdio::null())
        .output()
        .expect("run the Python client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "client {args:?} printed no report: {}\n{stdout}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    (report, std::fs::read_to_string(marker).unwrap_or_default())
}

fn assert_filtered(report: &Value, ran: &str, revision: &str, route: &str) {
    let expected = if revision == "auto" {
        "2026-07-28"
    } else {
        revision
    };
    assert_eq!(report["negotiated"], expected, "{route}: {report}");
    assert_eq!(
        report["tools"],
        json!(["harmless"]),
        "{route} {revision}: {report}"
    );
    assert_eq!(
        report["calls"]["harmless"]["text"], "harmless ran",
        "{route} {revision}: {report}"
    );
    assert_eq!(
        report["calls"]["secret"]["error"]["message"], "Unknown tool: secret",
        "{route} {revision}: {report}"
    );
    assert_eq!(
        ran, "harmless\n",
        "{route} {revision}: the server ran {ran:?}"
    );
}

#[test]
fn every_revision_through_the_shim() {
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = dir.path().join("ran");
    let toolwall = toolwall_tests::toolwall_bin().display().to_string();
    let server = peer("mcp_marker_server.py");
    let python = python();
    for revision in REVISIONS.iter().copied().chain(["2024-11-05"]) {
        let (report, ran) = run_client(
            &marker,
            &[
                "stdio", "-", revision, "--", &toolwall, "shim", "--deny", "^secret$", "--",
                &python, &server, "stdio",
            ],
        );
        assert_filtered(&report, &ran, revision, "shim");
    }
}

/// The marker server over HTTP (`http` or `sse`), ready; its URL.
fn marker_server(transport: &str, marker: &std::path::Path) -> (Proc, String) {
    let port = free_port();
    let child = Command::new(python())
        .arg(peer("mcp_marker_server.py"))
        .args([transport, &port.to_string()])
        .env("TOOLWALL_MARKER", marker)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the marker server");
    let mut proc = Proc(child);
    wait_port(&mut proc, port, "mcp_marker_server.py");
    let path = if transport == "sse" { "sse" } else { "mcp" };
    (proc, format!("http://127.0.0.1:{port}/{path}"))
}

#[test]
fn every_revision_through_the_proxy() {
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = dir.path().join("ran");
    // A Streamable HTTP upstream speaking every revision: each client revision, Streamable
    // HTTP to the proxy; and the legacy SSE client on the proxy's /sse.
    let (_server, url) = marker_server("http", &marker);
    let (_proxy, port) = proxy(&url, &["--deny", "^secret$"]);
    let mcp = format!("http://127.0.0.1:{port}/mcp");
    for revision in REVISIONS {
        let (report, ran) = run_client(&marker, &["http", &mcp, revision]);
        assert_filtered(&report, &ran, revision, "proxy to Streamable HTTP");
    }
    let sse = format!("http://127.0.0.1:{port}/sse");
    let (report, ran) = run_client(&marker, &["sse", &sse, "2024-11-05"]);
    assert_filtered(&report, &ran, "2024-11-05", "proxy to Streamable HTTP");

    // A server that speaks only 2026-07-28 (no initialize): the proxy's discovery, which is
    // the daemon's, negotiates with `server/discover` and lists at 2026-07-28.
    let (_modern, modern_url) = marker_server("modern", &marker);
    let (_front, front_port) = proxy(&modern_url, &["--deny", "^secret$"]);
    let mcp = format!("http://127.0.0.1:{front_port}/mcp");
    for revision in ["2026-07-28", "auto"] {
        let (report, ran) = run_client(&marker, &["http", &mcp, revision]);
        assert_filtered(&report, &ran, revision, "proxy to a 2026-07-28-only server");
    }

    // A legacy HTTP+SSE (2024-11-05) upstream, bridged for both kinds of client.
    let (_legacy, legacy_url) = marker_server("sse", &marker);
    let (_bridge, bridge_port) = proxy(&legacy_url, &["--deny", "^secret$"]);
    let sse = format!("http://127.0.0.1:{bridge_port}/sse");
    let (report, ran) = run_client(&marker, &["sse", &sse, "2024-11-05"]);
    assert_filtered(&report, &ran, "2024-11-05", "proxy to legacy SSE");
    let mcp = format!("http://127.0.0.1:{bridge_port}/mcp");
    let (report, ran) = run_client(&marker, &["http", &mcp, "2025-06-18"]);
    assert_filtered(&report, &ran, "2025-06-18", "proxy to legacy SSE");
}

/// A 2026-07-28 POST whose `Mcp-Name` names another tool than its body: a server (or a
/// gateway) routing on the header would run the denied tool while toolwall judged the body.
#[test]
fn routing_headers_that_disagree_with_the_body_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = dir.path().join("ran");
    let (_server, url) = marker_server("http", &marker);
    let db = dir.path().join("events.db");
    let db_arg = db.to_str().expect("a UTF-8 path");
    let (mut proxy_proc, port) = proxy(&url, &["--deny", "^secret$", "--db", db_arg]);
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    let post = |name_header: &str, tool: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{tool}","arguments":{{}},{meta}}}}}"#
        );
        let request = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {name_header}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        std::io::Write::write_all(&mut stream, request.as_bytes()).expect("send");
        let mut response = String::new();
        let _ = std::io::Read::read_to_string(&mut stream, &mut response);
        response
    };
    let refused = post("secret", "harmless");
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    assert!(
        refused.contains("-32020") && refused.contains("[toolwall]"),
        "{refused}"
    );
    let refused = post("=?base64?c2VjcmV0?=", "harmless");
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    // Agreeing headers: the call runs (a 2026 request is judged like any other).
    let _ = std::fs::remove_file(&marker);
    let ran = post("harmless", "harmless");
    assert!(ran.starts_with("HTTP/1.1 200"), "{ran}");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default(),
        "harmless\n"
    );
    // The record says what happened: the two refused calls refused, the third allowed.
    stop_proxy(&mut proxy_proc);
    let actions: Vec<String> = calls_recorded(&db)
        .iter()
        .map(|v| v["action"].to_string())
        .collect();
    assert_eq!(actions, ["\"block\"", "\"block\"", "\"allow\""]);
}
