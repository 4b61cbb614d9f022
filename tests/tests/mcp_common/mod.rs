//! Helpers for the MCP end-to-end tests: real servers (`server-everything`), the official
//! Python SDK client (`peers/mcp_client.py`), and the `toolwall` binary, as child processes
//! that are killed when dropped.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A child process killed (and reaped) on drop, so a failed test leaves nothing behind.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub use toolwall_tests::free_port;

/// Waits until the process listens on the port (or died).
pub fn wait_port(proc: &mut Proc, port: u16, what: &str) {
    if let Err(why) = try_wait_port(proc, port, what) {
        panic!("{why}");
    }
}

/// [`wait_port`], saying why it gave up instead of panicking. A listener on the port counts
/// only when it is the process's own (or a child's): another test's process may have bound the
/// port between its choosing and ours starting, and then ours fails to bind and exits.
pub fn try_wait_port(proc: &mut Proc, port: u16, what: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() && listens(proc.0.id(), port) {
            return Ok(());
        }
        if let Ok(Some(status)) = proc.0.try_wait() {
            return Err(format!(
                "{what} exited with {status} before listening on {port}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("{what} did not listen on {port} within 60 s"))
}

/// The sockets listening on TCP `port` at any address, as a process's descriptor links name
/// them (`socket:[INODE]`), read from `/proc/net/tcp{,6}` without connecting (a connection
/// could start what holds the port).
pub fn listening_sockets(port: u16) -> Vec<String> {
    let port = format!("{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|text| {
            // Each line: `sl local_address:port rem_address:port st ... inode`; 0A is LISTEN.
            text.lines()
                .skip(1)
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    (fields.len() > 9
                        && fields[1].rsplit(':').next() == Some(port.as_str())
                        && fields[3] == "0A")
                        .then(|| format!("socket:[{}]", fields[9]))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Whether process `pid` or one of its descendants holds a socket listening on TCP `port`.
fn listens(pid: u32, port: u16) -> bool {
    let inodes = listening_sockets(port);
    let mut pids = vec![pid];
    while let Some(pid) = pids.pop() {
        let owns = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()));
        if owns {
            return true;
        }
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
                pids.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
    }
    false
}

/// Starts `spawn(port)` on a port free a moment ago and waits until it listens; the port can
/// be taken in between by another test's process (tests run in parallel), so a start that
/// exits before listening is tried again on another port, three times in all.
pub fn start_listening(what: &str, mut spawn: impl FnMut(u16) -> Proc) -> (Proc, u16) {
    try_start_listening(what, |port| Ok(spawn(port))).unwrap_or_else(|why| panic!("{why}"))
}

/// [`start_listening`], saying why it gave up (the process could not be started, or never
/// listened) instead of panicking.
pub fn try_start_listening(
    what: &str,
    mut spawn: impl FnMut(u16) -> Result<Proc, String>,
) -> Result<(Proc, u16), String> {
    let mut failures = Vec::new();
    for _ in 0..3 {
        let port = free_port();
        let mut proc = spawn(port)?;
        match try_wait_port(&mut proc, port, what) {
            Ok(()) => return Ok((proc, port)),
            Err(why) => failures.push(why),
        }
    }
    Err(format!("{what} never listened: {failures:?}"))
}

/// `server-everything` speaking `transport` (`sse` or `streamableHttp`); its URL.
pub fn server_everything_http(transport: &str) -> (Proc, String) {
    let port = free_port();
    let child = Command::new(toolwall_tests::server_everything())
        .arg(transport)
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start server-everything");
    let mut proc = Proc(child);
    wait_port(&mut proc, port, "server-everything");
    let path = if transport == "sse" { "sse" } else { "mcp" };
    (proc, format!("http://127.0.0.1:{port}/{path}"))
}

/// `toolwall mcp-proxy --upstream URL --listen 127.0.0.1:PORT ARGS...`, ready to serve: it
/// holds its port from the start, and serves once it listed the upstream's tools (a request
/// before waits in the port's queue), so it is ready when it answered one.
pub fn proxy(upstream: &str, args: &[&str]) -> (Proc, u16) {
    let (proc, port) = proxy_listening(upstream, args);
    toolwall_tests::http_get(&format!("127.0.0.1:{port}"), "/", None);
    (proc, port)
}

/// [`proxy`], returned as soon as its port is held.
fn proxy_listening(upstream: &str, args: &[&str]) -> (Proc, u16) {
    start_listening("toolwall mcp-proxy", |port| {
        Proc(
            Command::new(toolwall_tests::toolwall_bin())
                .args(["mcp-proxy", "--upstream", upstream, "--listen"])
                .arg(format!("127.0.0.1:{port}"))
                .args(args)
                // Its stderr is read once it exited: no line per tool registered, so that an
                // upstream of hundreds of tools cannot fill the pipe and stop the proxy.
                .env("TOOLWALL_LOG", "info,toolwall::registry=warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start toolwall mcp-proxy"),
        )
    })
}

fn client_script() -> PathBuf {
    toolwall_tests::workspace_root().join("tests/peers/mcp_client.py")
}

/// Runs the Python SDK client (`stdio`, `sse` or `http` against `target`), calling `calls`
/// (`[[name, arguments], ...]`); returns its report (tools, call results, resource, prompt).
pub fn python_client(transport: &str, target: &str, calls: &Value) -> Value {
    python_client_with(transport, target, calls, &[])
}

/// [`python_client`] with its environment set (`MCP_CLIENT_CAPABILITIES`,
/// `MCP_CLIENT_CALL_FIRST`: `tests/peers/mcp_client.py`).
pub fn python_client_with(
    transport: &str,
    target: &str,
    calls: &Value,
    env: &[(&str, &str)],
) -> Value {
    let output = Command::new(toolwall_tests::python())
        .arg(client_script())
        .args([transport, target, &calls.to_string()])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run the Python MCP client");
    parse_report(&output, transport, target)
}

fn parse_report(output: &Output, transport: &str, target: &str) -> Value {
    assert!(
        output.status.success(),
        "python client ({transport} {target}) failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "python client printed no report ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// The stdio target (a JSON argv) for `server-everything stdio`, optionally behind the shim.
pub fn stdio_argv(prefix: &[String]) -> String {
    let mut argv: Vec<String> = prefix.to_vec();
    argv.push(toolwall_tests::server_everything().display().to_string());
    argv.push("stdio".into());
    serde_json::to_string(&argv).expect("argv as JSON")
}

/// The tool names of a report.
pub fn names(report: &Value) -> Vec<String> {
    report["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("tool name").to_owned())
        .collect()
}

/// The direct list minus the tools whose names are in `denied`.
pub fn without(report: &Value, denied: &[&str]) -> Vec<Value> {
    report["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter(|t| !denied.contains(&t["name"].as_str().unwrap_or_default()))
        .cloned()
        .collect()
}

/// The recorded call named `name`.
pub fn call<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no call of {name} in {report}"))
}

/// Asserts a proxied/shimmed report against the direct one, with `denied` tools denied
/// (`echo` among them, called; `get-sum` allowed, called).
pub fn assert_filtered(direct: &Value, filtered: &Value, denied: &[&str]) {
    assert_eq!(
        filtered["tools"].as_array().expect("tools"),
        &without(direct, denied),
        "tools through toolwall must be the direct list minus {denied:?}"
    );
    assert_eq!(
        call(filtered, "echo")["error"],
        serde_json::json!({"code": -32602, "message": "Unknown tool: echo"}),
        "a denied call is answered as an unknown tool"
    );
    assert_eq!(
        call(filtered, "get-sum"),
        call(direct, "get-sum"),
        "allowed call"
    );
    assert_eq!(
        filtered["resource"], direct["resource"],
        "resources untouched"
    );
    assert_eq!(filtered["prompts"], direct["prompts"], "prompts untouched");
    assert_eq!(filtered["prompt"], direct["prompt"], "prompt untouched");
}

/// The calls every test makes: one denied (`echo`), one allowed (`get-sum`).
pub fn standard_calls() -> Value {
    serde_json::json!([["echo", {"message": "hi"}], ["get-sum", {"a": 2, "b": 3}]])
}

/// `toolwall shim --config C --db D --server-id ID --` (the server's argv follows).
pub fn shim_prefix(config: &Path, db: &Path, server_id: &str) -> Vec<String> {
    vec![
        toolwall_tests::toolwall_bin().display().to_string(),
        "shim".into(),
        "--config".into(),
        config.display().to_string(),
        "--db".into(),
        db.display().to_string(),
        "--server-id".into(),
        server_id.into(),
        "--".into(),
    ]
}

/// Stops a filter proxy with SIGTERM (it stores what it queued before it exits) and waits.
pub fn stop_proxy(proxy: &mut Proc) {
    Command::new("kill")
        .args(["-TERM", &proxy.0.id().to_string()])
        .status()
        .expect("kill");
    proxy.0.wait().expect("the proxy stops");
}

/// The `mcp_tool_called` records in a database, oldest first (`toolwall mcp events --db`).
pub fn calls_recorded(db: &Path) -> Vec<Value> {
    recorded(db, "mcp_tool_called")
}

/// The records of one event type in a database, oldest first, all of them
/// (`toolwall mcp events --type TYPE --db`).
pub fn recorded(db: &Path, event_type: &str) -> Vec<Value> {
    let out = Command::new(toolwall_tests::toolwall_bin())
        .args(["mcp", "events", "--json", "--limit", "1000000", "--type"])
        .arg(event_type)
        .arg("--db")
        .arg(db)
        .output()
        .expect("toolwall mcp events");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// A Streamable HTTP session opened through the proxy on `port` (initialize, initialized):
/// the headers its later requests carry (its protocol version and session id).
pub fn open_session(port: u16) -> String {
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let (status, head, body) = exchange(port, &request("POST", "/mcp", "", init));
    assert_eq!(status, 200, "{body}");
    let session = format!(
        "MCP-Protocol-Version: 2025-06-18\r\nMcp-Session-Id: {}\r\n",
        session_of(&head)
    );
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let (status, _, _) = exchange(port, &request("POST", "/mcp", &session, initialized));
    assert!(status == 202 || status == 200, "{status}");
    session
}

/// One HTTP/1.1 exchange on a fresh connection (`Connection: close`): status, head, body.
pub fn exchange(port: u16, request: &[u8]) -> (u16, String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the proxy");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    stream.write_all(request).expect("send the request");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    (status, head.to_owned(), body.to_owned())
}

pub fn request(method: &str, path: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The `Mcp-Session-Id` of a response head.
pub fn session_of(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("mcp-session-id:")
                .then(|| l[15..].trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no session id in {head}"))
}

/// The memory a process holds (VmRSS, kB).
pub fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("proc status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}
