//! `toolwall run`, `toolwall exec` and the views, driven through the real binary.

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
fn exec_without_a_daemon_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        format!("api:\n  socket: {}/none.sock\n", dir.path().display()),
    )
    .unwrap();
    let out = Command::new(toolwall_bin())
        .args(["exec", "--as-root", "--config"])
        .arg(&config)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no toolwall daemon is listening") && err.contains("toolwall run"),
        "{err}"
    );
}

/// Writers that post batches of 50 events (of `pad` extra bytes each) as fast as they can
/// until one is refused; each returns how many the daemon acknowledged (202) and the first
/// refusal it got.
fn load(
    socket: &Path,
    writers: usize,
    pad: usize,
) -> Vec<std::thread::JoinHandle<(usize, String)>> {
    (0..writers)
        .map(|w| {
            let socket = socket.to_path_buf();
            std::thread::spawn(move || {
                let mut acknowledged = 0usize;
                for batch in 0.. {
                    let body: Vec<String> = (0..50)
                        .map(|i| {
                            let mut line: serde_json::Value =
                                serde_json::from_str(&event_line(w * 1_000_000 + batch * 50 + i))
                                    .expect("event");
                            line["reason"] = "x".repeat(pad).into();
                            line.to_string()
                        })
                        .collect();
                    match http_unix(&socket, "POST", "/api/events", &body.join("\n")) {
                        Ok((202, _)) => acknowledged += 50,
                        Ok((status, body)) => return (acknowledged, format!("{status} {body}")),
                        Err(error) => return (acknowledged, error.to_string()),
                    }
                }
                unreachable!("the loop returns")
            })
        })
        .collect()
}

/// Events in a database, read with `toolwall mcp events --db`.
fn stored_events(db: &Path) -> usize {
    let out = Command::new(toolwall_bin())
        .args(["mcp", "events", "--json", "--limit", "100000000", "--db"])
        .arg(db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// Joins [`load`]'s writers and checks the database holds at least what they were told was
/// stored.
fn every_acknowledged_event_is_stored(
    what: &str,
    writers: Vec<std::thread::JoinHandle<(usize, String)>>,
    db: &Path,
) {
    let acknowledged: usize = writers.into_iter().map(|w| w.join().unwrap().0).sum();
    let stored = stored_events(db);
    println!("{what}: {acknowledged} events acknowledged, {stored} stored");
    assert!(acknowledged > 0, "the load ran");
    assert!(
        stored >= acknowledged,
        "every acknowledged event is stored ({stored} < {acknowledged})"
    );
}

#[test]
fn shutdown_under_load_loses_no_acknowledged_event() {
    let mut daemon = Daemon::start("");
    // Four writers; SIGTERM lands in the middle.
    let writers = load(&daemon.socket, 4, 0);
    std::thread::sleep(std::time::Duration::from_millis(700));
    let status = daemon.stop();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        daemon.stderr()
    );
    every_acknowledged_event_is_stored("shutdown under load", writers, &daemon.db);
}

/// 202 means committed: `kill -9` under load loses no acknowledged event (answering before the
/// commit loses about 1 in 600 of them).
#[test]
fn kill_9_under_load_loses_no_acknowledged_event() {
    let mut daemon = Daemon::start("");
    let writers = load(&daemon.socket, 4, 0);
    std::thread::sleep(std::time::Duration::from_millis(700));
    daemon.kill9();
    every_acknowledged_event_is_stored("kill -9 under load", writers, &daemon.db);
}

/// On a full disk the API must not answer 202 and `/health` "ok" while nothing is stored, nor
/// SIGTERM hang: 503 with the reason, `/health` degraded, every 202 stored, and the stop is
/// prompt.
#[test]
#[ignore = "privileged: needs root to mount a small tmpfs; `cargo xtask test` runs it as root"]
fn privileged_a_full_disk_is_refused_loudly_and_loses_no_acknowledged_event() {
    assert!(is_root());
    let small = tempfile::tempdir().unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "toolwall-full"])
        .arg(small.path())
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a 2 MiB tmpfs");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(small.path().to_path_buf());
    let db = small.path().join("events.db");
    let mut daemon = Daemon::start_with_db("", db.clone());
    let writers = load(&daemon.socket, 2, 2000);
    let results: Vec<(usize, String)> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let acknowledged: usize = results.iter().map(|r| r.0).sum();
    println!("full disk: {results:?}");
    for (_, refusal) in &results {
        assert!(
            refusal.starts_with("503") && refusal.contains("cannot write"),
            "refused with the reason: {refusal}"
        );
    }
    let (status, health) = http_unix(&daemon.socket, "GET", "/health", "").unwrap();
    assert_eq!(status, 200);
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["status"], "degraded", "{health}");
    assert!(
        health["store"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("full")),
        "{health}"
    );
    // A call that could not be recorded does not run (store.on_failure: block, the default);
    // a native tool of the agent is not ours to record and still runs.
    let (status, decision) = http_unix(
        &daemon.socket,
        "POST",
        "/api/check",
        r#"{"server_id":"files","name":"read_file"}"#,
    )
    .unwrap();
    assert_eq!(status, 200, "{decision}");
    let decision: serde_json::Value = serde_json::from_str(&decision).unwrap();
    assert_eq!(decision["action"], "block", "{decision}");
    assert!(
        decision["reason"]
            .as_str()
            .is_some_and(|r| r.contains("event store cannot record")),
        "{decision}"
    );
    let (_, native) =
        http_unix(&daemon.socket, "POST", "/api/check", r#"{"name":"Bash"}"#).unwrap();
    assert!(native.contains(r#""action":"allow""#), "{native}");
    let stopping = std::time::Instant::now();
    let status = daemon.stop();
    let took = stopping.elapsed();
    assert!(
        took < std::time::Duration::from_secs(40),
        "stopped in {took:?}; stderr:\n{}",
        daemon.stderr()
    );
    println!("stop took {took:?}, exit {status}");
    let stored = stored_events(&db);
    println!("full disk: {acknowledged} acknowledged, {stored} stored");
    assert!(acknowledged > 0, "some events fit");
    assert!(
        stored >= acknowledged,
        "every acknowledged event is stored ({stored} < {acknowledged})"
    );
}

/// An agent the `--user` cannot reach (a build directory under root's home, say) fails with
/// the directory it cannot enter, its owner and mode and what to do, not a bare "Permission
/// denied".
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_exec_names_the_directory_the_agents_user_cannot_enter() {
    use std::os::unix::fs::PermissionsExt as _;
    assert!(is_root());
    let mut daemon = Daemon::start("");
    let top = tempfile::tempdir().unwrap();
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let closed = top.path().join("build");
    std::fs::create_dir(&closed).unwrap();
    let agent = closed.join("agent.sh");
    std::fs::write(&agent, "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = Command::new(toolwall_bin())
        .args(["exec", "--user", "nobody", "--config"])
        .arg(&daemon.config)
        .arg("--")
        .arg(&agent)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"));
    assert!(
        err.contains(&format!(
            "user nobody (uid 65534) cannot enter {} (mode 0700, owner root:root)",
            closed.display()
        )) && err.contains("chmod o+x"),
        "{err}"
    );
    assert!(daemon.stop().success());
}

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_exec_runs_the_agent_in_a_watched_session_and_the_views_show_it() {
    assert!(is_root());
    let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = allowed.local_addr().unwrap().port();
    let mut daemon = Daemon::start(&format!(
        "sandbox:\n  mcp:\n    servers:\n      - id: netsrv\n        type: http\n        url: http://127.0.0.1:{port}/mcp\n      - id: forbidden\n        type: http\n        url: http://localhost:9/mcp\n    denied_servers:\n      - id: forbidden\n"
    ));
    let client = format!(
        "import os, socket\nsocket.create_connection(('127.0.0.1', {port})).close()\ntry:\n    socket.create_connection(('::1', 9))\n    print('forbidden: connected')\nexcept PermissionError:\n    print('forbidden: EPERM')\nprint('session', os.environ['TOOLWALL_SESSION'])\nu = socket.socket(socket.AF_UNIX)\nu.connect(os.environ['TOOLWALL_API_SOCKET'])\nu.sendall(b'DELETE /api/sessions/e2e HTTP/1.1\\r\\nHost: t\\r\\nConnection: close\\r\\n\\r\\n')\nprint('self-detach', u.recv(100).split()[1].decode())\nraise SystemExit(7)\n"
    );
    let out = Command::new(toolwall_bin())
        .args(["exec", "--session", "e2e", "--user", "nobody", "--config"])
        .arg(&daemon.config)
        .args(["--", "/usr/bin/python3", "-c", &client])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(7),
        "exit code passed through; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("forbidden: EPERM"), "{stdout}");
    assert!(stdout.contains("session e2e"), "{stdout}");
    assert!(
        stdout.contains("self-detach 403"),
        "an agent cannot detach its own session: {stdout}"
    );
    let cgroup = toolwall::cgroup2_mount().unwrap().join("toolwall/e2e");
    assert!(
        !cgroup.exists(),
        "session cgroup {} removed",
        cgroup.display()
    );

    std::thread::sleep(std::time::Duration::from_millis(300));
    let calls = daemon.toolwall(&["mcp", "calls", "--json", "--session", "e2e"]);
    let calls = String::from_utf8_lossy(&calls.stdout).to_string();
    let records: Vec<serde_json::Value> = calls
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    println!("{records:#?}");
    assert_eq!(records.len(), 2, "{calls}");
    let by_server = |id: &str| {
        records
            .iter()
            .find(|r| r["server_id"] == id)
            .unwrap_or_else(|| panic!("no {id} record"))
    };
    assert_eq!(by_server("netsrv")["action"], "allow");
    assert_eq!(by_server("forbidden")["action"], "block");
    assert_eq!(by_server("forbidden")["connection"]["layer"], "kernel");
    let status = daemon.stop();
    assert!(status.success(), "{status:?}\n{}", daemon.stderr());
}

/// A process inside a session, even one running as the daemon's user, reads nothing through
/// the socket (other sessions' events are not its to read) and reports nothing (what it
/// reported, it could forge; its stdio servers are the daemon's to run and record:
/// tests/tests/daemon_stdio/).
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_session_reads_nothing_and_reports_nothing() {
    assert!(is_root());
    let mut daemon = Daemon::start("");
    let forged = event_line(7);
    let client = format!(
        r#"
import os, socket
def ask(method, path, body=b""):
    u = socket.socket(socket.AF_UNIX)
    u.connect(os.environ["TOOLWALL_API_SOCKET"])
    head = "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % (method, path, len(body))
    u.sendall(head.encode() + body)
    return u.recv(100).split()[1].decode()
print("read", ask("GET", "/api/events"), ask("GET", "/api/calls"), ask("GET", "/api/stream/events"), ask("GET", "/api/tools"))
print("post", ask("POST", "/api/events", {forged:?}.encode()))
"#
    );
    let out = Command::new(toolwall_bin())
        .args(["exec", "--session", "reader", "--as-root", "--config"])
        .arg(&daemon.config)
        .args(["--", "/usr/bin/python3", "-c", &client])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("read 403 403 403 403"), "{stdout}");
    assert!(stdout.contains("post 403"), "{stdout}");
    let stored = daemon.json_lines(&["mcp", "events", "--json"]);
    assert!(stored.is_empty(), "a forged event was stored: {stored:?}");
    assert!(daemon.stop().success());
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
