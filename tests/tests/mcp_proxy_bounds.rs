//! What `toolwall mcp-proxy` holds for clients that do not read, through the real binary: a
//! session's server messages are charged to its byte budget (`--max-session-bytes`) and to the
//! total (`--max-held-bytes`); past them the upstream is read no further, so the proxy's memory
//! stays within the bounds however much the upstream sends and however many clients stall.

mod mcp_common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use mcp_common::*;

/// The flood upstream (`tests/peers/mcp_flood_upstream.py`): COUNT events of SIZE bytes per
/// call of its tool `flood`; its legacy SSE URL.
fn flood_upstream(count: usize, size: usize) -> (Proc, String) {
    let script = toolwall_tests::workspace_root().join("tests/peers/mcp_flood_upstream.py");
    let (proc, port) = start_listening("the flood upstream", |port| {
        Proc(
            Command::new(toolwall_tests::python())
                .arg(&script)
                .env("PORT", port.to_string())
                .env("COUNT", count.to_string())
                .env("SIZE", size.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start the flood upstream"),
        )
    });
    (proc, format!("http://127.0.0.1:{port}/sse"))
}

/// A legacy SSE session through the proxy: its stream (read up to the `endpoint` event and
/// then not at all) and its message path.
fn open_sse(port: u16) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .write_all(b"GET /sse HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
        .expect("open the stream");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut line = String::new();
    let path = loop {
        line.clear();
        assert!(
            reader.read_line(&mut line).expect("read") > 0,
            "stream ended"
        );
        if let Some(path) = line.trim().strip_prefix("data: ") {
            break path.to_owned();
        }
    };
    (stream, path)
}

fn post(port: u16, path: &str, body: &str) {
    let (status, head, _) = exchange(port, &request("POST", path, "", body));
    assert_eq!(status, 202, "{head}");
}

/// Asks for a flood the client never reads.
fn flood(port: u16, path: &str) {
    post(
        port,
        path,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    post(
        port,
        path,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    post(
        port,
        path,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"flood","arguments":{}}}"#,
    );
}

#[test]
fn clients_that_do_not_read_hold_no_more_than_the_byte_budgets() {
    // Four sessions, each sent 64 MiB it never reads: the proxy may hold 4 MiB of each and
    // 8 MiB in all (plus what the sockets' buffers take, which is the kernel's).
    let (_upstream, url) = flood_upstream(64, 1 << 20);
    let (proxy, port) = proxy(
        &url,
        &[
            "--max-message-bytes",
            "2097152",
            "--max-session-bytes",
            "4194304",
            "--max-held-bytes",
            "8388608",
        ],
    );
    let before = rss_kb(proxy.0.id());
    let sessions: Vec<(TcpStream, String)> = (0..4).map(|_| open_sse(port)).collect();
    for (_, path) in &sessions {
        flood(port, path);
    }
    // The upstream writes as fast as it is read. Without the budgets a debug build takes
    // about 10 MiB a second of it (2 MiB of it reaches the clients' sockets) and is past
    // 100 MiB by the end; with them it holds still within seconds.
    let mut peak = before;
    for _ in 0..120 {
        std::thread::sleep(Duration::from_millis(100));
        peak = peak.max(rss_kb(proxy.0.id()));
    }
    let grown_mib = (peak.saturating_sub(before)) / 1024;
    // The bounds hold 8 MiB; each message is also copied while it is filtered and written,
    // and the allocator keeps what it freed.
    assert!(
        grown_mib < 50,
        "the proxy grew by {grown_mib} MiB holding messages its clients do not read (bounds: 8 MiB)"
    );
    // The stalled sessions gone, their bytes are given back: a new session is served.
    drop(sessions);
    std::thread::sleep(Duration::from_millis(500));
    let (mut stream, path) = open_sse(port);
    post(
        port,
        &path,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut line = String::new();
    let answered = loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            break false;
        }
        if line.contains("serverInfo") {
            break true;
        }
    };
    let _ = stream.flush();
    assert!(answered, "a new session after the stalled ones is answered");
}
