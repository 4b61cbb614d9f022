//! Who a session's stdio servers run as and where: outside the agent's session, as the agent's
//! user or as declared, never root; and that the agent cannot write the audit or reach into them.

use super::*;

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_an_agent_cannot_write_the_audit_and_its_stdio_servers_run_outside_its_session() {
    assert!(is_root());
    let dir = shared_dir();
    let server = write(dir.path(), "server.py", SERVER);
    let agent = write(dir.path(), "agent.py", AGENT);
    let who = dir.path().join("who");
    // `nobody` runs the shim: a copy it can reach (the checkout may be in a 0700 directory).
    let shim = dir.path().join("toolwall");
    std::fs::copy(toolwall_bin(), &shim).expect("copy the toolwall binary");
    let mut daemon = Daemon::start(&format!(
        "sandbox:\n  mcp:\n    fail_closed: true\n    servers:\n      - id: whoami\n        type: stdio\n        command: /usr/bin/python3\n        args: [{}, {}]\n",
        server.display(),
        who.display()
    ));
    let out = exec_nobody(&daemon, "audited", &agent, dir.path())
        .arg(&shim)
        .current_dir(dir.path())
        .output()
        .expect("toolwall exec");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}\n{}", daemon.stderr());
    assert!(out.status.success(), "{stderr}");
    let line = |l: &str| stdout.lines().any(|s| s == l);
    // Nothing of the audit is written from inside the session.
    for route in ["events", "check", "listed"] {
        assert!(line(&format!("post {route} 403")), "{route}: {stdout}");
    }
    // The declared server ran (not the shim's /bin/false), filtered by the daemon.
    assert!(line("whoami listed ['whoami']"), "{stdout}");
    assert!(line("whoami whoami ran whoami"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("whoami forbidden") && l.contains("Unknown tool")),
        "{stdout}"
    );
    // An undeclared server under fail_closed is refused, with the reason.
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("stranger refused 1") && l.contains("not declared")),
        "{stdout}"
    );
    // The server ran as the agent's user, outside the agent's session cgroup.
    let who = std::fs::read_to_string(&who).expect("the server said who ran it");
    let started = who
        .lines()
        .find(|l| l.starts_with("uid="))
        .expect("a start line");
    assert!(started.starts_with("uid=65534 "), "{who}");
    assert!(
        started.contains("cgroup=0::/"),
        "the server sees only its own cgroup (a namespace of its own): {who}"
    );
    let log = daemon.stderr();
    assert!(
        log.lines().any(|l| l.contains("started stdio MCP server")
            && l.contains("audited-mcp-whoami-")
            && l.contains("65534")),
        "the server runs in a cgroup of its own, outside the session: {log}"
    );
    assert!(who.contains("leave: refused"), "{who}");
    assert!(!who.contains("forbidden ran"), "a denied tool ran: {who}");
    // Nothing of the daemon's descriptors (3: the listing's own), and no namespace to join.
    assert!(who.lines().any(|l| l == "fds 0 1 2 3"), "{who}");
    assert!(who.lines().any(|l| l == "setns -1 1"), "{who}");
    // The daemon recorded the calls, under the agent's session.
    let events = daemon.json_lines(&["mcp", "events", "--json", "--type", "mcp_tool_called"]);
    let called: Vec<(String, String, String)> = events
        .iter()
        .map(|e| {
            (
                e["session_id"].as_str().unwrap_or_default().to_owned(),
                e["tool_name"].as_str().unwrap_or_default().to_owned(),
                e["action"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert!(
        called.contains(&("audited".into(), "whoami".into(), "allow".into())),
        "{called:?}"
    );
    assert!(
        called.contains(&("audited".into(), "forbidden".into(), "block".into())),
        "{called:?}"
    );
    assert!(
        !called.iter().any(|(s, _, _)| s == "other"),
        "a forged event was stored: {called:?}"
    );
    // Stopped, the daemon closes the servers' cgroups with the sessions.
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}

/// A root agent (`--as-root`) gets its servers run as root: confined as `toolwall exec`
/// confines the agent itself (else asking for a server would be a way out of the session).
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_root_agents_server_is_as_confined_as_the_agent() {
    assert!(is_root());
    let dir = shared_dir();
    let server = write(dir.path(), "server.py", SERVER);
    let who = dir.path().join("who");
    let agent = write(
        dir.path(),
        "agent.py",
        &format!(
            "import json, subprocess, sys\np = subprocess.Popen([sys.argv[1], 'shim', '--server-id', 'loose', '--', '/usr/bin/python3', {server:?}, {who:?}], stdin=subprocess.PIPE, stdout=subprocess.PIPE)\np.stdin.write(b'{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{{}},\"clientInfo\":{{\"name\":\"a\",\"version\":\"1\"}}}}}}\\n')\np.stdin.flush()\nprint('init', 'serverInfo' in p.stdout.readline().decode())\np.stdin.close()\nprint('exit', p.wait(timeout=20))\n",
            server = server.display().to_string(),
            who = who.display().to_string()
        ),
    );
    let mut daemon = Daemon::start("");
    let out = Command::new(toolwall_bin())
        .args(["exec", "--as-root", "--session", "rooted", "--config"])
        .arg(&daemon.config)
        .arg("--")
        .arg("/usr/bin/python3")
        .arg(&agent)
        .arg(toolwall_bin())
        .output()
        .expect("toolwall exec");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("init True"), "{stdout}");
    let who = std::fs::read_to_string(&who).expect("the server said who ran it");
    println!("{who}");
    assert!(who.contains("uid=0 "), "{who}");
    assert!(
        who.contains("cgroup=0::/\n"),
        "its own cgroup namespace: {who}"
    );
    assert!(who.contains("NoNewPrivs 1"), "{who}");
    let bounding = who
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd "))
        .and_then(|l| l.split(' ').next())
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .expect("CapBnd");
    for (name, bit) in [
        ("SYS_ADMIN", 21),
        ("NET_ADMIN", 12),
        ("BPF", 39),
        ("SYS_PTRACE", 19),
        ("NET_RAW", 13),
        ("SETUID", 7),
        ("SYS_MODULE", 16),
        ("MKNOD", 27),
        ("SYS_RAWIO", 17),
    ] {
        assert_eq!(
            bounding & (1 << bit),
            0,
            "{name} is in the bounding set: {who}"
        );
    }
    assert!(
        who.contains("leave: refused 30"),
        "cgroupfs is read-only: {who}"
    );
    assert!(
        who.contains("bpffs: 0 entries"),
        "the pins are hidden: {who}"
    );
    // The kernel's tunables are read-only (root set core_pattern to a program of its own).
    for tunable in ["/proc/sys/kernel/core_pattern", "/sys/kernel/uevent_helper"] {
        assert!(
            who.contains(&format!("tunable {tunable}: refused 30")),
            "{tunable}: {who}"
        );
    }
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}

/// A declared server that reports what it was given and what it may do: its environment and
/// directory, whether the agent's `PYTHONPATH` ran code in it, the socket routes open to it, its
/// egress, and a process it leaves behind.
const PROBE: &str = r#"
import json, os, socket, subprocess, sys
out, ok_port, no_port = sys.argv[1], int(sys.argv[3]), int(sys.argv[4])
sock = open(sys.argv[2]).read()
def note(text):
    with open(out, "a") as f:
        f.write(text + "\n")
note("uid " + str(os.getuid()))
note("pid " + str(os.getpid()) + " sees " + ",".join(sorted(d for d in os.listdir("/proc") if d.isdigit())))
note("cwd " + os.getcwd())
note("env " + " ".join(sorted(os.environ)))
note("PATH " + os.environ.get("PATH", ""))
note("DECLARED " + os.environ.get("DECLARED", ""))
def http(raw):
    u = socket.socket(socket.AF_UNIX)
    u.connect(sock)
    u.sendall(raw)
    data = b""
    while True:
        c = u.recv(65536)
        if not c:
            break
        data += c
    return data.decode(errors="replace")
def status(text):
    return text.split()[1] if text else "closed"
body = json.dumps({"server_id": "nested", "command": ["/bin/true"], "env": [], "cwd": "/", "deny": [], "max_message_bytes": 65536}).encode()
note("stdio " + status(http(b"POST /api/stdio HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: toolwall-stdio\r\nContent-Length: %d\r\n\r\n" % len(body) + body)))
note("events " + status(http(b"POST /api/events HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")))
health = http(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
health = json.loads(health.split("\r\n\r\n", 1)[1]) if health else {}
note("health " + str(bool(health)) + " " + str(health.get("peer_session")) + " " + ",".join(k for k in ("database", "sessions", "kernel_counters") if k in health))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
note(f"ptrace {libc.ptrace(0, 0, 0, 0)} {ctypes.get_errno()}")
for port in (ok_port, no_port):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        note(f"connect {port} ok")
    except OSError as e:
        note(f"connect {port} errno {e.errno}")
    s.close()
icmp = None
try:
    icmp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    icmp.settimeout(1)
    icmp.sendto(b"\x08\x00\x00\x00\x00\x01\x00\x01leak", ("127.0.0.2", 0))
    icmp.recv(64)
    note("icmp reply")
except socket.timeout:
    note("icmp no reply")
except OSError as e:
    note(f"icmp errno {e.errno}")
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
note(f"listening {listener.getsockname()[1]}")
left = subprocess.Popen(["/bin/sleep", "1000.4242"], start_new_session=True)
note(f"left {left.pid}")
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        result = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}}, "serverInfo": {"name": "probe", "version": "1"}}
    elif m["method"] == "tools/list":
        result = {"tools": []}
    else:
        result = {}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": result}), flush=True)
"#;

/// A root agent in a session: holds more connections than it may, sends a body too slowly,
/// hands its connection to a child and exits, then runs the probe with a hostile environment.
const ROOT_AGENT: &str = r#"
import json, os, socket, subprocess, sys, time
toolwall, inject, socket_file, report = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
sock = os.environ["TOOLWALL_API_SOCKET"]
open(socket_file, "w").write(sock)
def connect():
    u = socket.socket(socket.AF_UNIX)
    u.connect(sock)
    return u
def answer(u):
    data = b""
    while True:
        c = u.recv(65536)
        if not c:
            break
        data += c
    return data.split()[1].decode() if data else "closed"
held = [connect() for _ in range(70)]
time.sleep(1)
closed = 0
for u in held:
    u.setblocking(False)
    try:
        if u.recv(1) == b"":
            closed += 1
    except BlockingIOError:
        pass
print("connections refused", closed)
for u in held:
    u.close()
time.sleep(1)
slow = connect()
started = time.monotonic()
slow.sendall(b"POST /api/stdio HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: toolwall-stdio\r\nContent-Length: 100\r\n\r\n{")
print("slow body", answer(slow), "after", int(time.monotonic() - started), "s")
import urllib.request, urllib.error
base = os.environ["ANTHROPIC_BASE_URL"]
assert "/s/probing" not in base, base
try:
    urllib.request.urlopen(urllib.request.Request(base.split("/s/")[0] + "/s/probing/v1/messages", data=b"{}", method="POST"), timeout=10)
    print("llm by name accepted")
except urllib.error.HTTPError as e:
    print("llm by name", e.code)
r, w = os.pipe()
a = os.fork()
if a == 0:
    u = connect()
    b = os.fork()
    if b == 0:
        os.read(r, 1)
        u.sendall(b"POST /api/events HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        print("orphaned connection", answer(u), flush=True)
        os._exit(0)
    os._exit(0)
os.waitpid(a, 0)
os.write(w, b"x")
time.sleep(2)
env = dict(os.environ, PYTHONPATH=inject, NODE_OPTIONS="--require /nonexistent.js", LD_PRELOAD="/nonexistent.so")
p = subprocess.Popen([toolwall, "shim", "--server-id", "probe", "--", "/bin/false"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
p.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"a","version":"1"}}}\n')
p.stdin.flush()
print("probe init", "serverInfo" in p.stdout.readline().decode())
port = next(int(l.split()[1]) for l in open(report) if l.startswith("listening "))
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    print("ingress connected")
except OSError as e:
    print("ingress refused", type(e).__name__)
p.stdin.close()
print("probe exit", p.wait(timeout=30))
"#;

/// A `nobody` agent forging a shim's request for a directory it cannot enter.
const NOBODY_AGENT: &str = r#"
import json, os, socket, sys
private = sys.argv[1]
u = socket.socket(socket.AF_UNIX)
u.connect(os.environ["TOOLWALL_API_SOCKET"])
body = json.dumps({"server_id": "loose", "command": ["/bin/true"], "env": [], "cwd": private, "deny": [], "max_message_bytes": 65536}).encode()
u.sendall(b"POST /api/stdio HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: toolwall-stdio\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
data = u.recv(65536).decode(errors="replace")
print("forged cwd", data.split()[1], data.split("\r\n\r\n", 1)[-1])
"#;

/// A declared server runs with its declaration's
/// environment, directory, user and egress (not the agent's); what it leaves running dies with
/// it; it cannot start servers or report; an agent cannot hold the daemon's descriptors, pass
/// its connection to a child to look like the host, or have a directory entered as root.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_declared_server_runs_as_declared_and_the_agent_cannot_reach_into_it() {
    assert!(is_root());
    let dir = shared_dir();
    let probe = write(dir.path(), "probe.py", PROBE);
    let root_agent = write(dir.path(), "root_agent.py", ROOT_AGENT);
    let nobody_agent = write(dir.path(), "nobody_agent.py", NOBODY_AGENT);
    let inject = dir.path().join("inject");
    std::fs::create_dir(&inject).expect("mkdir");
    let injected = dir.path().join("injected");
    write(
        &inject,
        "sitecustomize.py",
        &format!(
            "open({:?}, 'a').write('agent code ran\\n')\n",
            injected.display()
        ),
    );
    let out = dir.path().join("probe.out");
    let private = tempfile::tempdir().expect("a private directory");
    let shim = dir.path().join("toolwall");
    std::fs::copy(toolwall_bin(), &shim).expect("copy the toolwall binary");
    let ok = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let no = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let (ok_port, no_port) = (
        ok.local_addr().unwrap().port(),
        no.local_addr().unwrap().port(),
    );
    // The probe learns the socket from the agent: only the daemon knows it before it starts.
    let socket_file = dir.path().join("socket-path");
    let config = format!(
        "sandbox:\n  mcp:\n    servers:\n      - id: probe\n        type: stdio\n        command: /usr/bin/python3\n        args: [{probe}, {out}, {socket}, '{ok_port}', '{no_port}']\n        env: {{DECLARED: 'yes'}}\n        cwd: {cwd}\n        user: nobody\n        egress: ['127.0.0.1:{ok_port}']\n",
        probe = probe.display(),
        out = out.display(),
        socket = socket_file.display(),
        cwd = dir.path().display(),
    );
    // The session boundary off: the agent's connection in to the server's socket must be
    // stopped by the server's own ingress guard, which the boundary would otherwise pre-empt
    // (its refusals are `session_boundary.rs`'s).
    let config = format!("{config}netmon:\n  egress:\n    mode: open\n");
    let mut daemon = Daemon::start(&config);
    let ping_range = PingGroups::open_to_all();
    let run = Command::new(toolwall_bin())
        .args(["exec", "--as-root", "--session", "probing", "--config"])
        .arg(&daemon.config)
        .arg("--")
        .arg("/usr/bin/python3")
        .arg(&root_agent)
        .arg(&shim)
        .arg(&inject)
        .arg(&socket_file)
        .arg(&out)
        .current_dir(private.path())
        .output()
        .expect("toolwall exec");
    drop(ping_range);
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    let report = std::fs::read_to_string(&out).unwrap_or_default();
    println!("{report}");
    let line = |l: &str| stdout.lines().any(|s| s == l);
    // Descriptors: past 64 connections, a session's user is refused at once; a body that does
    // not arrive is answered within the read time-out.
    assert!(line("connections refused 6"), "{stdout}");
    let slow = stdout
        .lines()
        .find_map(|l| l.strip_prefix("slow body 400 after "))
        .and_then(|l| l.split(' ').next())
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("the slow body was not answered 400: {stdout}"));
    assert!((5..40).contains(&slow), "{stdout}");
    // The LLM layer knows a session by the secret in its base URL, never by its name.
    assert!(line("llm by name 403"), "{stdout}");
    // A connection whose process exited is not the host's.
    assert!(line("orphaned connection 403"), "{stdout}");
    assert!(line("probe init True"), "{stdout}");
    // The declaration's user, directory and environment; none of the agent's.
    assert!(report.contains("uid 65534\n"), "{report}");
    // A PID namespace of its own: no other process to trace, signal or write the memory of.
    assert!(report.contains("pid 1 sees 1\n"), "{report}");
    assert!(
        report.contains(&format!("cwd {}\n", dir.path().display())),
        "{report}"
    );
    // (Python itself adds LC_CTYPE when the locale is C: PEP 538.)
    let env: Vec<&str> = report
        .lines()
        .find_map(|l| l.strip_prefix("env "))
        .map(|l| l.split(' ').filter(|k| *k != "LC_CTYPE").collect())
        .unwrap_or_default();
    assert_eq!(env, ["DECLARED", "HOME", "PATH"], "{report}");
    assert!(report.contains("DECLARED yes\n"), "{report}");
    assert!(
        !injected.exists(),
        "the agent's PYTHONPATH ran code in the server"
    );
    // The server of a session may read /health (as of that session) and nothing else.
    assert!(report.contains("stdio 403\n"), "{report}");
    assert!(report.contains("events 403\n"), "{report}");
    assert!(report.contains("health True probing \n"), "{report}");
    // It cannot reach into other processes (seccomp).
    assert!(report.contains("ptrace -1 1\n"), "{report}");
    // Its egress is its declaration's.
    assert!(
        report.contains(&format!("connect {ok_port} ok\n")),
        "{report}"
    );
    assert!(
        report.contains(&format!("connect {no_port} errno 1\n")),
        "{report}"
    );
    // Packets no connect() sees: ICMP out (ping sockets opened to every group for the test),
    // a connection in to a socket it listens on.
    assert!(
        report.contains("icmp errno 1\n") || report.contains("icmp no reply\n"),
        "{report}"
    );
    assert!(line("ingress refused TimeoutError"), "{stdout}");
    // What it left running died with it (found by its arguments: the pid it saw is its own
    // namespace's).
    assert!(report.contains("left "), "{report}");
    let alive = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                std::fs::read(e.path().join("cmdline"))
                    .is_ok_and(|c| c.windows(9).any(|w| w == b"1000.4242"))
            })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while alive() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(!alive(), "a process the server started outlived it");
    // The record is its owner's alone.
    use std::os::unix::fs::MetadataExt as _;
    let mode = std::fs::metadata(&daemon.db).expect("the database").mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // The dropped packets are an alert; the refused connection is recorded as the server's.
    let alerts = daemon.json_lines(&["mcp", "events", "--json", "--type", "kernel_alert"]);
    assert!(
        alerts.iter().any(|e| e["alert"] == "egress_dropped"),
        "{alerts:?}"
    );
    let connections = daemon.json_lines(&[
        "mcp",
        "events",
        "--json",
        "--type",
        "mcp_network_connection",
    ]);
    assert!(
        connections.iter().any(|e| e["server_id"] == "probe"
            && e["action"] == "block"
            && e["remote_addr"] == format!("127.0.0.1:{no_port}")),
        "{connections:?}"
    );

    // A `nobody` agent's forged request: the directory is entered as nobody, so refused.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    let run = Command::new(toolwall_bin())
        .args([
            "exec",
            "--user",
            "nobody",
            "--session",
            "forging",
            "--config",
        ])
        .arg(&daemon.config)
        .arg("--")
        .arg("/usr/bin/python3")
        .arg(&nobody_agent)
        .arg(private.path())
        .current_dir(dir.path())
        .output()
        .expect("toolwall exec");
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("forged cwd 400") && l.contains("Permission denied")),
        "{stdout}"
    );
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}

/// `net.ipv4.ping_group_range` opened to every group (as on Ubuntu and Fedora) until dropped.
struct PingGroups(String);

impl PingGroups {
    const PATH: &str = "/proc/sys/net/ipv4/ping_group_range";

    fn open_to_all() -> Self {
        let old = std::fs::read_to_string(Self::PATH).expect("read ping_group_range");
        std::fs::write(Self::PATH, "0 2147483647").expect("open ping sockets to all groups");
        PingGroups(old.split_whitespace().collect::<Vec<_>>().join(" "))
    }
}

impl Drop for PingGroups {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}

/// `toolwall run`'s stderr for a configuration declaring one stdio server with `user:`; it
/// must not start.
fn refused_at_start(id: &str, user: &str) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(
        dir.path(),
        "toolwall.yaml",
        &format!(
            "api:\n  listen: 127.0.0.1:0\n  socket: {}\nstore:\n  path: {}\nproxy:\n  listen: 127.0.0.1:0\nnetmon:\n  enabled: false\nsandbox:\n  mcp:\n    servers:\n      - id: {id}\n        type: stdio\n        command: /bin/true\n        user: {user}\n",
            dir.path().join("api.sock").display(),
            dir.path().join("events.db").display()
        ),
    );
    let out = Command::new(toolwall_bin())
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .expect("toolwall run");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    stderr
}

/// A declared server's `user:` that does not exist stops the daemon at start, named; so does
/// root, which leaves any confinement (a root server can set `kernel.core_pattern` and run
/// code as root in the root cgroup).
#[test]
fn a_missing_or_root_server_user_stops_the_daemon_at_start() {
    let missing = refused_at_start("lonely", "no_such_user_tw");
    assert!(
        missing.contains("\"lonely\"") && missing.contains("no user \"no_such_user_tw\""),
        "{missing}"
    );
    let root = refused_at_start("mighty", "root");
    assert!(
        root.contains("\"mighty\"") && root.contains("is root"),
        "{root}"
    );
}
