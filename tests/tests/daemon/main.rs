//! `toolwall run`, `toolwall exec` and the views, driven through the real binary.

mod exec;
mod store;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use toolwall_tests::{Daemon, http_unix, is_root, toolwall_bin};

fn event_line(i: usize) -> String {
    serde_json::json!({
        "type": "mcp_tool_called",
        "timestamp": "2026-11-22T10:00:00Z",
        "session_id": "load",
        "server_id": "srv",
        "server_type": "stdio",
        "tool_name": format!("t{i}"),
        "jsonrpc_id": i,
        "input": {"i": i},
        "action": "allow",
        "reason": "",
        "layer": "shim"
    })
    .to_string()
}

#[test]
fn daemon_reports_every_layer_serves_health_and_stops_cleanly() {
    let mut daemon = Daemon::start("");
    let (status, body) = http_unix(&daemon.socket, "GET", "/health", "").unwrap();
    assert_eq!(status, 200, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    let layers: Vec<&str> = health["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    for layer in ["kernel", "correlator"] {
        assert!(layers.contains(&layer), "{layer} missing from {layers:?}");
    }
    // The web view is served on the loopback HTTP address.
    let page = Command::new("python3")
        .args([
            "-c",
            &format!(
                "import urllib.request;print(urllib.request.urlopen('http://{}/').read().decode())",
                daemon.api
            ),
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&page.stdout).contains("<title>toolwall"),
        "web view served"
    );
    let status = daemon.stop();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        daemon.stderr()
    );
    assert!(daemon.stderr().contains("stopped cleanly"));
    // A log written to a file carries no colour codes (they are for terminals only).
    assert!(
        !daemon.stderr().contains('\x1b'),
        "escape codes in the log:\n{}",
        daemon.stderr()
    );
    assert!(!daemon.socket.exists(), "socket removed");
}

#[test]
fn cross_origin_writes_are_refused() {
    let daemon = Daemon::start("");
    let out = Command::new("python3")
        .args([
            "-c",
            &format!(
                "import urllib.request,urllib.error\nreq=urllib.request.Request('http://{}/api/sessions',data=b'{{\"name\":\"x\"}}',headers={{'Origin':'http://evil.example'}})\ntry:\n  urllib.request.urlopen(req)\nexcept urllib.error.HTTPError as e: print(e.code)",
                daemon.api
            ),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "403");
}

/// Two daemons on one event store would mix their records (one user's `mcp calls` showing
/// another configuration's calls): the second is refused at start, naming the store, the
/// daemon that holds it and what to do.
#[test]
fn a_second_daemon_on_the_same_store_is_refused_naming_the_first() {
    let mut first = Daemon::start("");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("other.yaml");
    std::fs::write(
        &config,
        format!(
            "api:\n  listen: 127.0.0.1:0\n  socket: {}/api.sock\nstore:\n  path: {}\nproxy:\n  listen: 127.0.0.1:0\nnetmon:\n  enabled: false\n",
            dir.path().display(),
            first.db.display()
        ),
    )
    .unwrap();
    let second = Command::new(toolwall_bin())
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains(&format!("the event store {} is in use", first.db.display()))
            && err.contains(&format!("pid {}", first.child.id()))
            && err.contains(&first.config.display().to_string())
            && err.contains("store.path"),
        "{err}"
    );
    assert!(first.stop().success());
}

#[test]
fn the_loopback_api_is_read_only_and_answers_only_its_own_name() {
    let daemon = Daemon::start("");
    // Only the holder of the token, which the daemon's user alone can read, reads events here
    // (not every local user).
    let token_file = daemon.socket.with_file_name("web-token");
    let token = std::fs::read_to_string(&token_file).expect("the token file");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&token_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the daemon's user only");
    let script = format!(
        r#"
import http.client
def ask(method, host, path="/api/events", auth="Bearer {token}"):
    c = http.client.HTTPConnection("{api}")
    c.putrequest(method, path, skip_host=True)
    c.putheader("Host", host)
    if auth:
        c.putheader("Authorization", auth)
    c.putheader("Content-Length", "0")
    c.endheaders()
    return c.getresponse().status
print(ask("GET", "{api}"), ask("GET", "evil.example:80"), ask("POST", "{api}"),
      ask("GET", "{api}", auth=None), ask("GET", "{api}", auth="Bearer wrong"),
      ask("GET", "{api}", path="/api/calls?token={token}", auth=None),
      ask("GET", "{api}", path="/", auth=None))
"#,
        api = daemon.api
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "200 403 403 401 401 200 200",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The socket takes changes. Other users may connect (0666 in a 0711 directory) so that
    // unprivileged agents' shims can post; the API serves them only from inside a session
    // (agent/src/daemon/api.rs, `Peer::Socket`).
    let (status, _) = http_unix(&daemon.socket, "POST", "/api/events", &event_line(1)).unwrap();
    assert_eq!(status, 202);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&daemon.socket).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o666);
}

/// `api.socket` pointing at a file that is not a socket (a typo naming the event database)
/// stops the daemon with a clear error and leaves the file as it was (rather than deleting it).
#[test]
fn an_api_socket_path_that_is_not_a_socket_is_refused_and_kept() {
    let dir = tempfile::tempdir().expect("temp dir");
    let precious = dir.path().join("events.db");
    std::fs::write(&precious, b"the record").expect("write");
    let config = dir.path().join("toolwall.yaml");
    std::fs::write(
        &config,
        format!(
            "api:\n  listen: 127.0.0.1:0\n  socket: {}\nstore:\n  path: {}\nproxy:\n  listen: 127.0.0.1:0\nnetmon:\n  enabled: false\n",
            precious.display(),
            dir.path().join("real.db").display()
        ),
    )
    .expect("write config");
    let out = std::process::Command::new(toolwall_bin())
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .expect("run toolwall");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the daemon must refuse: {stderr}");
    assert!(
        stderr.contains("exists and is not a socket"),
        "says why: {stderr}"
    );
    assert_eq!(
        std::fs::read(&precious).expect("the file is still there"),
        b"the record"
    );
}

/// `api.socket` in a directory another user owns (nobody could rename the live socket and bind
/// their own) stops the daemon at start, naming the directory, its owner and what to do; and
/// nothing is bound there.
#[test]
#[ignore = "privileged: needs root to give a directory to nobody; `cargo xtask test` runs it as root"]
fn privileged_an_api_socket_in_another_users_directory_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown to nobody");
    let socket = theirs.join("api.sock");
    let config = dir.path().join("toolwall.yaml");
    std::fs::write(
        &config,
        format!(
            "api:\n  listen: 127.0.0.1:0\n  socket: {}\nstore:\n  path: {}\nproxy:\n  listen: 127.0.0.1:0\nnetmon:\n  enabled: false\n",
            socket.display(),
            dir.path().join("events.db").display()
        ),
    )
    .expect("write config");
    let out = std::process::Command::new(toolwall_bin())
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .expect("run toolwall");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the daemon must refuse: {stderr}");
    assert!(
        stderr.contains(&theirs.display().to_string())
            && stderr.contains("owned by uid 65534")
            && stderr.contains("set `api.socket`"),
        "says where, whose and what to do: {stderr}"
    );
    assert!(!socket.exists(), "nothing was bound there");
}

/// A configuration of deeply nested brackets is refused at once, naming file and line, before
/// the YAML parser spends its quadratic time on it (44 s of CPU for 200 KB).
#[test]
fn a_deeply_nested_config_is_refused_at_once_with_its_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("deep.yaml");
    let deep = format!(
        "sandbox:\n  mcp:\n    deny: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    std::fs::write(&config, deep).expect("write");
    let started = std::time::Instant::now();
    let out = std::process::Command::new(toolwall_bin())
        .args(["config", "check"])
        .arg(&config)
        .output()
        .expect("run toolwall");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:3:", config.display())) && stderr.contains("nested deeper"),
        "names the file and line: {stderr}"
    );
    // Not a timing goal: the unbounded parse took 44 s; anything near that is the old path.
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let big = dir.path().join("big.yaml");
    std::fs::write(&big, format!("# {}\n", "x".repeat(2 << 20))).expect("write");
    let out = std::process::Command::new(toolwall_bin())
        .args(["config", "check"])
        .arg(&big)
        .output()
        .expect("run toolwall");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("over the limit"),
        "{stderr}"
    );
}

/// One hostile tool call must not break the record: a call whose arguments nest 127 deep is
/// stored bounded (a marker with the original's hash), and every view still reads every row
/// (stored whole, `/api/events`, `/api/calls` and `toolwall mcp calls/events` all fail on it).
#[test]
fn a_deeply_nested_tool_call_does_not_break_the_views() {
    use std::io::{Read, Write};
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = upstream.local_addr().expect("addr").port();
    // Arguments nesting 127 deep: the interceptor parses them (serde_json's limit is 128), the
    // event around them pushed the stored row past that limit.
    let mut args = "1".to_owned();
    for _ in 0..127 {
        args = format!("[{args}]");
    }
    let body = format!(
        "{{\"id\":\"c\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"g\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{{\"id\":\"t\",\"type\":\"function\",\"function\":{{\"name\":\"echo\",\"arguments\":\"{args}\"}}}}]}},\"finish_reason\":\"tool_calls\"}}]}}"
    );
    std::thread::spawn(move || {
        if let Ok((mut sock, _)) = upstream.accept() {
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&seen).contains("{}") {
                match sock.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                sock,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let daemon = Daemon::start(&format!(
        "sandbox:\n  mcp:\n    deny: [\"^echo$\"]\nproxy:\n  listen: 127.0.0.1:0\n  providers:\n    anthropic: http://127.0.0.1:{port}\n    openai: http://127.0.0.1:{port}\nnetmon:\n  enabled: false\n"
    ));
    let proxy = daemon.proxy.clone().expect("proxy on");
    let mut sock =
        std::net::TcpStream::connect(proxy.trim_start_matches("http://")).expect("connect proxy");
    write!(
        sock,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
    )
    .expect("request");
    let mut answer = String::new();
    let _ = sock.read_to_string(&mut answer);
    assert!(answer.contains("blocked by policy"), "{answer}");
    // The event is written by the daemon's store writer; give it a moment.
    let mut events = Vec::new();
    for _ in 0..50 {
        events = daemon.json_lines(&["mcp", "events", "--json"]);
        if !events.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let event = events
        .iter()
        .find(|e| e["tool_name"] == "echo")
        .unwrap_or_else(|| panic!("the blocked call is recorded: {events:?}"));
    assert_eq!(event["action"], "block");
    assert_eq!(
        event["input"]["toolwall_truncated"], "nested deeper than 32 levels",
        "{event}"
    );
    let calls = daemon.json_lines(&["mcp", "calls", "--json"]);
    assert!(
        calls.iter().any(|c| c.to_string().contains("echo")),
        "{calls:?}"
    );
    // The database read directly, too.
    let out = Command::new(toolwall_bin())
        .args(["mcp", "calls", "--json", "--limit", "1000000", "--db"])
        .arg(&daemon.db)
        .output()
        .expect("run toolwall");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
