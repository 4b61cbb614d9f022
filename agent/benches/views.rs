//! `views`: what a reader of a big store waits for, and what the daemon holds meanwhile.
//!
//! A store of 10M events (`TOOLWALL_BENCH_VIEWS_EVENTS` to change it) is made once under
//! `target/bench` and kept for later runs: calls of 20 sessions over 30 days, each proposed by
//! the LLM layer and run at the shim, one in four with its kernel connection. The release
//! daemon then serves it, and each view's first page is timed against the baseline, a plain
//! SQLite query of the same rows (the newest 500 call events, decoded); then 8 readers page
//! through `/api/calls` at once while the daemon's resident memory is watched. Goals: each
//! view under 1 s, the daemon under 100 MB.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use toolwall::Action;
use toolwall::bench::{NetworkConnection, Store, ToolCallIntercepted, ToolCalled};

use super::{free_port, start_daemon};

pub(super) fn bench_views() {
    println!("views: the record's views over a big store (first page; 8 readers at once)");
    let Some(bin) = std::env::var_os("TOOLWALL_BIN").map(PathBuf::from) else {
        println!("   SKIPPED: set TOOLWALL_BIN (cargo xtask bench sets it)");
        return;
    };
    let events: u64 = std::env::var("TOOLWALL_BENCH_VIEWS_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    if let Err(e) = run(&bin, events) {
        println!("   FAILED: {e}");
    }
}

fn run(bin: &Path, events: u64) -> Result<(), String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let db = dir.join(format!("views-{events}.db"));
    if !db.exists() {
        let started = Instant::now();
        generate(&db, events)?;
        println!(
            "   made {} ({events} events) in {:.0} s; kept for later runs",
            db.display(),
            started.elapsed().as_secs_f64()
        );
    }
    let size = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
    println!("   store: {events} events, {:.1} GB", size as f64 / 1e9);

    // The baseline: the newest 500 call events, read and decoded straight from SQLite.
    let baseline = best_of(5, || {
        let conn = rusqlite::Connection::open(&db).map_err(|e| e.to_string())?;
        let mut stmt = conn
            .prepare(
                "SELECT id, body FROM events WHERE type IN ('mcp_tool_call_intercepted','mcp_tool_called','mcp_network_connection') ORDER BY ts_ns DESC LIMIT 500",
            )
            .map_err(|e| e.to_string())?;
        let rows: Vec<serde_json::Value> = stmt
            .query_map([], |r| r.get::<_, String>(1))
            .map_err(|e| e.to_string())?
            .filter_map(|b| b.ok().and_then(|b| serde_json::from_str(&b).ok()))
            .collect();
        assert_eq!(rows.len(), 500);
        Ok(())
    })?;
    println!(
        "   baseline: plain SQLite, newest 500 call events decoded  {:>8.1} ms",
        ms(baseline)
    );

    let run_dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let socket = run_dir.path().join("api.sock");
    let config = run_dir.path().join("toolwall.yaml");
    let port = free_port();
    std::fs::write(
        &config,
        format!(
            "proxy: {{mode: disabled}}\nnetmon: {{enabled: false}}\nstore: {{path: {}}}\napi: {{listen: 127.0.0.1:{port}, socket: {}}}\n",
            db.display(),
            socket.display()
        ),
    )
    .map_err(|e| format!("write the daemon's config: {e}"))?;
    let daemon = start_daemon(bin, &config, &socket)?;
    let pid = daemon.0.id();
    let rss_start = rss_kb(pid);
    let token = std::fs::read_to_string(socket.with_file_name("web-token"))
        .map_err(|e| format!("web token: {e}"))?;

    let report = |what: &str, t: Duration| {
        let verdict = if t < Duration::from_secs(1) {
            "ok"
        } else {
            "OVER 1 s"
        };
        println!(
            "   {what:<52} {:>8.1} ms  {:>6.1}x baseline  ({verdict})",
            ms(t),
            t.as_secs_f64() / baseline.as_secs_f64()
        );
    };
    report(
        "`toolwall mcp calls` (the latest 50)",
        best_of(3, || {
            let out = Command::new(bin)
                .args(["mcp", "calls", "--config"])
                .arg(&config)
                .output()
                .map_err(|e| e.to_string())?;
            if !out.status.success() || out.stdout.is_empty() {
                return Err(format!("mcp calls: {out:?}"));
            }
            Ok(())
        })?,
    );
    report(
        "GET /api/calls (a page of 500)",
        best_of(3, || get(&socket, "/api/calls").map(drop))?,
    );
    report(
        "web view: the page, then its first page of 200 calls",
        best_of(3, || {
            http(port, "/", None)?;
            http(port, "/api/calls?limit=200", Some(token.trim())).map(drop)
        })?,
    );
    report(
        "GET /api/calls?tool=t7 (a filter: the newest 500 of one tool)",
        best_of(3, || get(&socket, "/api/calls?tool=t7").map(drop))?,
    );

    // 8 readers at once, each walking 10 pages back through the calls.
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (peak, watching) = (peak.clone(), watching.clone());
        std::thread::spawn(move || {
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(rss_kb(pid), std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let started = Instant::now();
    let readers: Vec<_> = (0..8)
        .map(|r| {
            let socket = socket.clone();
            std::thread::spawn(move || -> Result<Duration, String> {
                let mut slowest = Duration::ZERO;
                let mut path = if r % 2 == 0 {
                    "/api/calls".to_owned()
                } else {
                    format!("/api/calls?session=s{r}")
                };
                for _ in 0..10 {
                    let t = Instant::now();
                    let next = get(&socket, &path)?;
                    slowest = slowest.max(t.elapsed());
                    match next {
                        Some(next) => path = next,
                        None => break,
                    }
                }
                Ok(slowest)
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for reader in readers {
        slowest = slowest.max(reader.join().map_err(|_| "a reader panicked")??);
    }
    let all = started.elapsed();
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = watcher.join();
    let peak_mb = peak.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0;
    report("8 readers × 10 pages: the slowest page", slowest);
    println!(
        "   8 readers × 10 pages: {:.1} s in all; daemon RSS {:.1} MB at start, {peak_mb:.1} MB at most ({})",
        all.as_secs_f64(),
        rss_start as f64 / 1024.0,
        if peak_mb < 100.0 {
            "ok: goal < 100 MB"
        } else {
            "OVER the 100 MB goal"
        }
    );
    drop(daemon);
    Ok(())
}

/// Makes the store: calls of 20 sessions and 40 tools, one every 250 ms on average over 30
/// days, each an intercept and its execution 5 ms later, one in four with a connection.
fn generate(db: &Path, events: u64) -> Result<(), String> {
    let partial = db.with_extension("partial");
    let _ = std::fs::remove_file(&partial);
    let mut store = Store::open(&partial).map_err(|e| e.to_string())?;
    let start = chrono::Utc::now() - chrono::Duration::days(30);
    let step_us = (30 * 86_400 * 1_000_000) / (events as i64 / 2).max(1);
    let mut batch = Vec::with_capacity(20_000);
    let mut made = 0u64;
    let mut call = 0i64;
    while made < events {
        let at = start + chrono::Duration::microseconds(call * step_us);
        let session = format!("s{}", call % 20);
        let tool = format!("t{}", call % 40);
        let input = Some(serde_json::json!({"path": format!("/srv/data/{call}.txt"), "n": call}));
        if call % 4 == 0 {
            batch.push(toolwall::Event::McpNetworkConnection(NetworkConnection {
                policy_revision: None,
                timestamp: at - chrono::Duration::milliseconds(1),
                session_id: session.clone(),
                remote_addr: "127.0.0.1:3001".into(),
                server_id: "srv".into(),
                server_type: "http".into(),
                action: Action::Allow,
                pid: 4242,
                tid: 4242,
                uid: 1000,
                comm: "node".into(),
                exe: None,
                cmdline: None,
                ppid: None,
                cgroup_id: 7,
                socket_cookie: call as u64,
                protocol: "tcp".into(),
                family: "ipv4".into(),
                count: 1,
                since: None,
            }));
            made += 1;
        }
        batch.push(toolwall::Event::McpToolCallIntercepted(
            ToolCallIntercepted {
                policy_revision: None,
                timestamp: at,
                session_id: session.clone(),
                request_id: format!("llm-{call}"),
                dialect: "anthropic".into(),
                tool_name: format!("mcp__srv__{tool}"),
                server_tool: tool.clone(),
                tool_call_id: format!("toolu_{call:016}"),
                input: input.clone(),
                server_id: "srv".into(),
                server_type: "http".into(),
                server_addr: "127.0.0.1:3001".into(),
                tool_hash: String::new(),
                action: Action::Allow,
                reason: String::new(),
            },
        ));
        batch.push(toolwall::Event::McpToolCalled(ToolCalled {
            policy_revision: None,
            timestamp: at + chrono::Duration::milliseconds(5),
            session_id: session,
            server_id: "srv".into(),
            server_type: "http".into(),
            tool_name: tool,
            jsonrpc_id: serde_json::json!(call),
            input,
            action: Action::Allow,
            reason: String::new(),
            layer: "mcp-proxy".into(),
        }));
        made += 2;
        call += 1;
        if batch.len() >= 20_000 || made >= events {
            store.insert(&batch).map_err(|e| e.to_string())?;
            batch.clear();
        }
    }
    drop(store);
    let conn = rusqlite::Connection::open(&partial).map_err(|e| e.to_string())?;
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .map_err(|e| e.to_string())?;
    drop(conn);
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", partial.display()));
    }
    std::fs::rename(&partial, db).map_err(|e| e.to_string())
}

fn best_of(n: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<Duration, String> {
    let mut best = Duration::MAX;
    for _ in 0..n {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
    }
    Ok(best)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// `GET path` on the daemon's socket; the next page's path, if any.
fn get(socket: &Path, path: &str) -> Result<Option<String>, String> {
    let mut stream = UnixStream::connect(socket).map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: toolwall\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    read_answer(stream, path)
}

/// `GET path` on the loopback API, as the web view asks.
fn http(port: u16, path: &str, token: Option<&str>) -> Result<Option<String>, String> {
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Connection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    read_answer(stream, path)
}

fn read_answer(mut stream: impl Read, path: &str) -> Result<Option<String>, String> {
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&answer);
    let head = text.split("\r\n\r\n").next().unwrap_or("");
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "{path}: {}",
            text.chars().take(300).collect::<String>()
        ));
    }
    Ok(head
        .lines()
        .find_map(|l| l.strip_prefix("link: <"))
        .and_then(|l| l.split_once('>'))
        .map(|(p, _)| p.to_owned()))
}
