//! What `toolwall mcp-proxy` holds for clients that do not read, through the real binary: a
//! session's server messages are charged to its byte budget (`--max-session-bytes`) and to the
//! total (`--max-held-bytes`); past them the upstream is read no further, so the proxy's memory
//! stays within the bounds however much the upstream sends and however many clients stall.
//! And one client's large message, judged off the proxy's thread, holds up no other client.

mod mcp_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// The large upstream (`tests/peers/mcp_large_upstream.py`), logging what it did to `log`;
/// its Streamable HTTP URL.
fn large_upstream(log: &Path) -> (Proc, String) {
    let script = toolwall_tests::workspace_root().join("tests/peers/mcp_large_upstream.py");
    let (proc, port) = start_listening("the large upstream", |port| {
        Proc(
            Command::new(toolwall_tests::python())
                .arg(&script)
                .env("PORT", port.to_string())
                .env("LOG", log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start the large upstream"),
        )
    });
    (proc, format!("http://127.0.0.1:{port}/mcp"))
}

/// The lines of the large upstream's log, once it holds `count` lines equal to `line`.
fn logged_once(log: &Path, line: &str, count: usize) -> Vec<String> {
    for _ in 0..6000 {
        let lines: Vec<String> = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        if lines.iter().filter(|l| *l == line).count() >= count {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the upstream never logged {line:?} {count} times");
}

/// Reads `stream` until it ends, or until `end` came (empty: until it ends); returns when
/// `marker` first came, and what was read.
fn read_until(mut stream: TcpStream, marker: &str, end: &str) -> (Option<Instant>, String) {
    let (mut answer, mut came) = (Vec::new(), None);
    let mut chunk = vec![0u8; 64 << 10];
    // What is looked for may straddle two reads: look back by its length.
    let seen = |text: &[u8], what: &str, n: usize| {
        let from = text.len().saturating_sub(n + what.len());
        text[from..]
            .windows(what.len())
            .any(|w| w == what.as_bytes())
    };
    while let Ok(n @ 1..) = stream.read(&mut chunk) {
        answer.extend_from_slice(&chunk[..n]);
        if came.is_none() && seen(&answer, marker, n) {
            came = Some(Instant::now());
        }
        if !end.is_empty() && seen(&answer, end, n) {
            break;
        }
    }
    (came, String::from_utf8_lossy(&answer).into_owned())
}

/// Sends `body` in `session` on a fresh connection in a thread of its own; the thread keeps
/// when `marker` first came in the answer, and returns it with the whole answer.
fn in_thread(
    port: u16,
    session: &str,
    body: String,
    marker: &'static str,
) -> std::thread::JoinHandle<(Option<Instant>, u16, String)> {
    let request = request("POST", "/mcp", session, &body);
    std::thread::spawn(move || {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        stream.write_all(&request).expect("send");
        let (came, text) = read_until(stream, marker, "");
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (came, status, text)
    })
}

#[test]
fn a_large_message_being_judged_does_not_hold_up_other_clients() {
    // A listing of about 4 MB takes the proxy a while to judge (seconds in a debug build).
    // Another client's call made meanwhile is answered before the listing, in both of the
    // forms a listing comes in (an SSE stream, after an event that passes before it; a JSON
    // body) and in a bridged session, the listing judged all the same; and while a client's
    // own large call is judged the upstream gets the other client's call first.
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("upstream.log");
    let (_upstream, url) = large_upstream(&log);
    let (_proxy, port) = proxy(&url, &["--deny", "^tool-0007$"]);
    let lister = open_session(port);
    let caller = open_session(port);
    let call = |id: u32, name: &str, arguments: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{arguments}}}}}"#
        )
    };
    // The caller's session lists first, so its calls are judged against a list it was given.
    let (_, status, _) = in_thread(
        port,
        &caller,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.into(),
        "tool-0000",
    )
    .join()
    .expect("list");
    assert_eq!(status, 200);
    for (round, id) in [(1, r#""sse""#), (2, "7")] {
        let list = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#);
        let listing = in_thread(port, &lister, list, "tool-0000");
        // The whole listing is with the proxy (or on its way in): it is judged now. (The
        // proxy's own listing at start and the caller's came before.)
        logged_once(&log, "listing sent", round + 2);
        let (answered, status, text) = in_thread(
            port,
            &caller,
            call(10 + round as u32, "get-sum", "{}"),
            "sum=3",
        )
        .join()
        .expect("call");
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("sum=3"), "{text}");
        let (listed, status, text) = listing.join().expect("listing");
        assert_eq!(status, 200, "{}", &text[..text.len().min(300)]);
        assert!(text.contains("tool-0499"), "the whole listing passed");
        assert!(!text.contains("tool-0007"), "the listing was judged");
        if round == 1 {
            let note = text
                .find("before the listing")
                .expect("the event before the listing");
            assert!(
                note < text.find("tool-0000").expect("the listing"),
                "in order"
            );
        }
        assert!(
            answered.expect("answered") < listed.expect("listed"),
            "the call (listing id {id}) waited for another client's listing to be judged"
        );
    }
    // A legacy SSE client's session is bridged (not passed through): the same there.
    let (stream, path) = open_sse(port);
    post(
        port,
        &path,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    );
    post(
        port,
        &path,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    post(
        port,
        &path,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    );
    let reading = std::thread::spawn(move || read_until(stream, "tool-0000", "tool-0499"));
    logged_once(&log, "listing sent", 5);
    let (answered, status, text) = in_thread(port, &caller, call(13, "get-sum", "{}"), "sum=3")
        .join()
        .expect("call");
    assert_eq!(status, 200, "{text}");
    let (listed, text) = reading.join().expect("read");
    assert!(
        text.contains("tool-0499") && !text.contains("tool-0007"),
        "judged whole"
    );
    assert!(
        answered.expect("answered") < listed.expect("listed"),
        "the call waited for a bridged session's listing to be judged"
    );
    // A call of 4 MB: the other client's small call made meanwhile reaches the upstream first.
    let big = call(
        20,
        "take-big",
        &format!(r#"{{"data":"{}"}}"#, "b".repeat(4 << 20)),
    );
    let taking = in_thread(port, &caller, big, "taken");
    // Time for the 4 MB to reach the proxy (a few milliseconds), so that the small call comes
    // while the large one is judged: what is asserted is the order the upstream saw.
    std::thread::sleep(Duration::from_millis(50));
    let (_, status, text) = in_thread(port, &lister, call(21, "get-sum", "{}"), "sum=3")
        .join()
        .expect("call");
    assert_eq!(status, 200, "{text}");
    let (_, status, text) = taking.join().expect("the large call");
    assert_eq!(status, 200, "{}", &text[..text.len().min(300)]);
    let calls: Vec<String> = logged_once(&log, "call take-big", 1)
        .into_iter()
        .filter(|l| l.starts_with("call "))
        .collect();
    assert_eq!(
        calls.last().map(String::as_str),
        Some("call take-big"),
        "the small call waited for another client's large call to be judged: {calls:?}"
    );
}

#[test]
fn a_list_behind_a_large_message_is_applied_in_the_order_it_came() {
    // A session's first listing is a stream of a 4 MB notification and then a list with
    // `victim`; its second, asked while that notification is judged (off the proxy's thread), a
    // small list without it. The first list is judged last, yet the session keeps the second:
    // `victim` is refused, as when every message was judged where it came in.
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("upstream.log");
    let (_upstream, url) = large_upstream(&log);
    let (_proxy, port) = proxy(&url, &[]);
    let session = open_session(port);
    let list = |id: &str| format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#);
    let late = in_thread(port, &session, list(r#""late""#), "victim");
    // Its stream is with the proxy (after the proxy's own listing at start).
    logged_once(&log, "listing sent", 2);
    let (_, status, text) = in_thread(port, &session, list(r#""small""#), "get-sum")
        .join()
        .expect("the small list");
    assert_eq!(status, 200, "{text}");
    assert!(!text.contains("victim"), "{text}");
    let (_, status, text) = late.join().expect("the late list");
    assert_eq!(status, 200);
    assert!(
        text.contains("victim"),
        "its client gets the list it asked for"
    );
    let call = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"victim","arguments":{}}}"#;
    let (_, status, text) = in_thread(port, &session, call.into(), "victim")
        .join()
        .expect("the call");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("Unknown tool: victim"), "{text}");
}
