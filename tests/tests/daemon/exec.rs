//! `toolwall exec`: without a daemon it says what is missing; with one, the agent runs in a
//! watched session the views show, a session reads and reports nothing, and a directory the
//! agent's user cannot enter is named.

use super::*;
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
