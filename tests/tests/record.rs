//! The record as a user reads it through the real binary: pages that do not grow with the
//! store, joins only on comparable arguments, rows that cannot be read shown in their place,
//! and a damaged store set aside at start.

use std::io::{Read, Write};

use serde_json::{Value, json};
use toolwall_tests::{Daemon, http_unix};

/// Call `i` as the LLM layer and the shim record it, `ms` after `base` (unix ms).
fn call_pair(i: usize, base: i64, input: Value, executed: Value) -> String {
    let at = |ms: i64| chrono_like(base + ms);
    let ms = i as i64 * 20;
    let intercept = json!({
        "type": "mcp_tool_call_intercepted", "timestamp": at(ms), "session_id": "rec",
        "request_id": format!("r{i}"), "dialect": "anthropic", "tool_name": "mcp__srv__add",
        "server_tool": "add", "tool_call_id": format!("toolu_{i}"), "input": input,
        "server_id": "srv", "server_type": "stdio", "server_addr": "", "tool_hash": "",
        "action": "allow", "reason": ""
    });
    let called = json!({
        "type": "mcp_tool_called", "timestamp": at(ms + 5), "session_id": "rec",
        "server_id": "srv", "server_type": "stdio", "tool_name": "add", "jsonrpc_id": i,
        "input": executed, "action": "allow", "reason": "", "layer": "shim"
    });
    format!("{intercept}\n{called}")
}

/// RFC 3339 of a unix time in ms, without a date crate.
fn chrono_like(ms: i64) -> String {
    let out = std::process::Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("@{}.{:03}", ms / 1000, ms % 1000),
            "+%Y-%m-%dT%H:%M:%S.%3NZ",
        ])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `GET path` on the daemon's socket: the body and the `Link` header's next path, if any.
fn get_page(daemon: &Daemon, path: &str) -> (Vec<Value>, Option<String>) {
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: toolwall\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
    let next = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("link: ")
                .or_else(|| l.strip_prefix("Link: "))
        })
        .and_then(|l| l.strip_prefix('<'))
        .and_then(|l| l.split_once('>'))
        .map(|(p, _)| p.to_owned());
    (serde_json::from_str(body).unwrap(), next)
}

fn post(daemon: &Daemon, lines: &[String]) {
    for chunk in lines.chunks(200) {
        let (status, body) =
            http_unix(&daemon.socket, "POST", "/api/events", &chunk.join("\n")).unwrap();
        assert_eq!(status, 202, "{body}");
    }
}

#[test]
fn calls_are_read_a_page_at_a_time_and_every_page_joins_as_the_whole() {
    let daemon = Daemon::start("");
    let base = now_ms() - 120_000;
    let lines: Vec<String> = (0..1200)
        .map(|i| call_pair(i, base, json!({"a": i}), json!({"a": i})))
        .collect();
    post(&daemon, &lines);
    // The default view: the latest 50, oldest first, each joined.
    let out = daemon.toolwall(&["mcp", "calls", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let latest: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(latest.len(), 50);
    assert!(latest.iter().all(|r| r["kind"] == "joined"), "{latest:?}");
    assert_eq!(latest[49]["intercept"]["reason"], "");
    let ids: Vec<i64> = latest
        .iter()
        .map(|r| r["intercept"]["event_id"].as_i64().unwrap())
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]) && ids[49] == 2399,
        "{ids:?}"
    );
    // Every call from `--since`, page after page; and the API's pages by their links.
    let all = daemon.json_lines(&["mcp", "calls", "--json", "--since", "1d"]);
    assert_eq!(all.len(), 1200);
    let mut seen = std::collections::BTreeSet::new();
    let mut next = Some("/api/calls?limit=170".to_owned());
    let mut pages = 0;
    while let Some(path) = next {
        let (records, then) = get_page(&daemon, &path);
        assert!(records.len() <= 170);
        for r in &records {
            assert_eq!(r["kind"], "joined", "{r}");
            assert!(
                seen.insert(r["intercept"]["event_id"].as_i64().unwrap()),
                "twice: {r}"
            );
        }
        next = then;
        pages += 1;
        assert!(pages < 20, "the pages end");
    }
    assert_eq!(seen.len(), 1200);
    // Events page the same way.
    let (events, next) = get_page(&daemon, "/api/events?limit=100");
    assert_eq!(events.len(), 100);
    assert_eq!(events[99]["id"], 2400);
    assert!(next.is_some_and(|n| n.contains("before=2301")));
}

#[test]
fn cut_arguments_join_nothing_and_an_unreadable_row_is_shown_in_its_place() {
    let daemon = Daemon::start("");
    let base = now_ms() - 10_000;
    // A rogue call padded past the record's bound, beside the model's proposal of `add {a: 1}`.
    let padded = json!({"a": 666, "pad": "x".repeat(300 * 1024)});
    post(&daemon, &[call_pair(0, base, json!({"a": 1}), padded)]);
    let calls = daemon.json_lines(&["mcp", "calls", "--json"]);
    let kinds: Vec<&str> = calls.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["intercept_only", "execution_only"], "{calls:?}");
    assert!(
        calls[1]["reason"].as_str().unwrap().contains("not joined"),
        "{}",
        calls[1]["reason"]
    );
    // A row of a type this build does not know, written by another hand.
    let db = rusqlite::Connection::open(&daemon.db).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    db.execute(
        "INSERT INTO events (ts_ns, type, session_id, server_id, tool_name, action, schema_version, body)
         VALUES (?1, 'mcp_tool_called', 'rec', 'srv', 'add', 'allow', 1, '{\"type\":\"mcp_tool_called\"')",
        [(base + 5_000) * 1_000_000],
    )
    .unwrap();
    post(
        &daemon,
        &[call_pair(1, base + 6_000, json!({"a": 2}), json!({"a": 2}))],
    );
    let events = daemon.json_lines(&["mcp", "events", "--json"]);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.len(), 5, "{kinds:?}");
    assert_eq!(kinds[2], "unreadable_row", "{kinds:?}");
    let calls = daemon.json_lines(&["mcp", "calls", "--json"]);
    assert!(
        calls
            .iter()
            .any(|r| r["tool"] == "unreadable row: mcp_tool_called"),
        "{calls:?}"
    );
    assert!(
        calls.iter().any(|r| r["kind"] == "joined"),
        "the rows after it read: {calls:?}"
    );
    // The table too.
    let out = daemon.toolwall(&["mcp", "calls"]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn a_damaged_store_is_set_aside_at_start_and_health_says_so() {
    let mut daemon = Daemon::start("");
    let base = now_ms() - 10_000;
    let lines: Vec<String> = (0..2000)
        .map(|i| {
            call_pair(
                i,
                base,
                json!({"a": i, "pad": "y".repeat(300)}),
                json!({"a": i, "pad": "y".repeat(300)}),
            )
        })
        .collect();
    post(&daemon, &lines);
    daemon.stop();
    // Every page in the database file itself, none left in its write-ahead log.
    rusqlite::Connection::open(&daemon.db)
        .unwrap()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    {
        use std::io::{Seek, SeekFrom};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&daemon.db)
            .unwrap();
        let len = file.metadata().unwrap().len();
        file.seek(SeekFrom::Start(len / 2)).unwrap();
        file.write_all(&vec![0xA5; 16 * 4096]).unwrap();
    }
    daemon.relaunch("stderr-2");
    let (status, health) = http_unix(&daemon.socket, "GET", "/health", "").unwrap();
    assert_eq!(status, 200);
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["status"], "degraded", "{health}");
    let checked = health["store"]["checked_at_start"].as_str().unwrap();
    assert!(checked.contains("set aside"), "{checked}");
    let kept = std::fs::read_dir(daemon.db.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().contains(".damaged-"));
    assert!(kept, "the damaged file is kept beside the fresh one");
    // The fresh store records again.
    post(
        &daemon,
        &[call_pair(0, base, json!({"a": 1}), json!({"a": 1}))],
    );
    assert_eq!(daemon.json_lines(&["mcp", "calls", "--json"]).len(), 1);
}

/// A stand-alone shim with the daemon's configuration writes its calls to the daemon's store
/// itself; `/metrics` and the live stream follow the store, so they count them as well.
#[test]
fn a_stand_alone_shims_calls_are_counted_and_streamed() {
    let daemon = Daemon::start("");
    // Follow the live stream of events from before the shim starts.
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    write!(
        stream,
        "GET /api/stream/events HTTP/1.1\r\nHost: toolwall\r\n\r\n"
    )
    .unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let script = format!(
        r#"import json, subprocess
shim = subprocess.Popen([{bin:?}, "shim", "--config", {cfg:?}, "--server-id", "everything", "--", {everything:?}, "stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
def ask(m):
    shim.stdin.write((json.dumps(m) + "\n").encode()); shim.stdin.flush()
    if "id" in m:
        while True:
            answer = json.loads(shim.stdout.readline())
            if answer.get("id") == m["id"]:
                return answer
ask({{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {{"protocolVersion": "2025-06-18", "capabilities": {{}}, "clientInfo": {{"name": "a", "version": "1"}}}}}})
ask({{"jsonrpc": "2.0", "method": "notifications/initialized"}})
ask({{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}})
for i in range(15):
    assert "result" in ask({{"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call", "params": {{"name": "echo", "arguments": {{"message": str(i)}}}}}})
shim.stdin.close(); shim.wait()
"#,
        bin = toolwall_tests::toolwall_bin().display().to_string(),
        cfg = daemon.config.display().to_string(),
        everything = toolwall_tests::server_everything().display().to_string(),
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python3");
    assert!(out.status.success(), "{out:?}");
    let stored = daemon.json_lines(&["mcp", "events", "--json", "--type", "mcp_tool_called"]);
    assert_eq!(stored.len(), 15, "the shim stored its calls");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let counted = loop {
        let (_, text) = http_unix(&daemon.socket, "GET", "/metrics", "").unwrap();
        let counted = text.lines().find_map(|l| {
            l.strip_prefix("toolwall_events_stored_total{type=\"mcp_tool_called\"} ")
                .and_then(|n| n.parse::<u64>().ok())
        });
        if counted == Some(15) || std::time::Instant::now() > deadline {
            break (counted, text);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(counted.0, Some(15), "{}", counted.1);
    assert!(
        counted.1.contains("layer=\"shim\"") && counted.1.contains("tool=\"echo\""),
        "{}",
        counted.1
    );
    // Every call came down the live stream too.
    let mut seen = 0;
    let mut text = String::new();
    let mut buf = [0u8; 65536];
    while seen < 15 {
        let n = stream.read(&mut buf).expect("the live stream");
        assert!(n > 0, "the stream ended");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
        seen = text.matches("\"type\":\"mcp_tool_called\"").count();
    }
}
