//! Through the real binary: nothing inside a session writes to the audit (what it wrote, it
//! could forge). An agent
//! (as `nobody`, under `toolwall exec`) cannot post events, ask for decisions or register
//! tools through the daemon's socket; its `toolwall shim` is a pipe to a stdio server the
//! daemon runs — the declared command, as the agent's user, in a cgroup outside the agent's
//! session — and the daemon judges and records the calls under the agent's session.

use std::path::Path;
use std::process::Command;

use toolwall_tests::{Daemon, http_unix, is_root, toolwall_bin};

/// A minimal stdio MCP server (plain Python, no SDK: `nobody` runs it). It writes who runs it
/// to the file named by its argument, and appends `<tool> ran` for each tool it runs.
const SERVER: &str = r#"
import json, os, sys
who = sys.argv[1]
def note(text):
    with open(who, "a") as f:
        f.write(text + "\n")
cgroup = open("/proc/self/cgroup").read().strip().splitlines()[-1]
note(f"uid={os.getuid()} cgroup={cgroup}")
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
note("CapBnd " + status["CapBnd"].strip() + " NoNewPrivs " + status["NoNewPrivs"].strip())
mounts = [l.split() for l in open("/proc/self/mounts")]
cg = next(m[1] for m in mounts if m[2] == "cgroup2")
try:
    open(os.path.join(cg, "cgroup.procs"), "w").write(str(os.getpid()))
    note("leave: moved to the root cgroup")
except OSError as e:
    note(f"leave: refused {e.errno}")
for tunable in ("/proc/sys/kernel/core_pattern", "/sys/kernel/uevent_helper"):
    try:
        open(tunable, "w").write("|/tmp/escape")
        note(f"tunable {tunable}: written")
    except OSError as e:
        note(f"tunable {tunable}: refused {e.errno}")
try:
    pins = os.listdir("/sys/fs/bpf")
    note(f"bpffs: {len(pins)} entries")
except OSError as e:
    note(f"bpffs: refused {e.errno}")
note("fds " + " ".join(sorted(os.listdir("/proc/self/fd"))))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
# setns on no descriptor: EBADF where the call is allowed, EPERM where the filter refuses it.
note("setns %d %d" % (libc.setns(-1, 0x10000000), ctypes.get_errno()))
tools = [{"name": n, "description": n, "inputSchema": {"type": "object"}} for n in ("whoami", "forbidden")]
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        result = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}}, "serverInfo": {"name": "who", "version": "1"}}
    elif m["method"] == "tools/list":
        result = {"tools": tools}
    elif m["method"] == "tools/call":
        note(m["params"]["name"] + " ran")
        result = {"content": [{"type": "text", "text": "ran " + m["params"]["name"]}]}
    else:
        result = {}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": result}), flush=True)
"#;

/// The agent: the socket's reporting routes, then two shims (a declared server asked for with
/// another command, an undeclared one).
const AGENT: &str = r#"
import json, os, socket, subprocess, sys
toolwall = sys.argv[1]
sock = os.environ["TOOLWALL_API_SOCKET"]
def post(path, body):
    u = socket.socket(socket.AF_UNIX)
    u.connect(sock)
    b = body.encode()
    u.sendall(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(b)}\r\nConnection: close\r\n\r\n".encode() + b)
    out = b""
    while True:
        c = u.recv(65536)
        if not c:
            break
        out += c
    return out.split()[1].decode()
forged = {"type": "mcp_tool_called", "timestamp": "2026-01-01T00:00:00Z", "session_id": "other", "server_id": "whoami", "server_type": "stdio", "tool_name": "whoami", "jsonrpc_id": 1, "input": None, "action": "allow", "reason": "", "layer": "shim"}
print("post events", post("/api/events", json.dumps(forged)))
print("post check", post("/api/check", '{"name": "whoami", "server_id": "whoami"}'))
print("post listed", post("/api/listed", '{"server_id": "whoami", "server_type": "stdio", "tools": [], "whole": true}'))

def shim(server_id, command):
    p = subprocess.Popen([toolwall, "shim", "--server-id", server_id, "--deny", "^forbidden$", "--"] + command,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    def ask(i, method, params):
        p.stdin.write((json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n").encode())
        p.stdin.flush()
        line = p.stdout.readline()
        return json.loads(line) if line else None
    init = ask(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "a", "version": "1"}})
    if init is None:
        p.stdin.close()
        p.wait()
        print(server_id, "refused", p.returncode, p.stderr.read().decode().strip().replace("\n", " "))
        return
    p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    listed = ask(2, "tools/list", {})
    print(server_id, "listed", sorted(t["name"] for t in listed["result"]["tools"]))
    ran = ask(3, "tools/call", {"name": "whoami", "arguments": {}})
    print(server_id, "whoami", ran["result"]["content"][0]["text"])
    refused = ask(4, "tools/call", {"name": "forbidden", "arguments": {}})
    print(server_id, "forbidden", json.dumps(refused.get("error", refused.get("result"))))
    p.stdin.close()
    p.wait(timeout=20)
    print(server_id, "exit", p.returncode)

shim("whoami", ["/bin/false"])
shim("stranger", ["/usr/bin/python3", "-c", "pass"])
"#;

fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

/// The most memory process `pid` has held (VmHWM), in kB.
fn peak_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("the process's status")
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .expect("VmHWM")
}

/// `toolwall exec --user nobody --session SESSION` against `daemon`, the agent `python3
/// AGENT` (the system's Python: `nobody` cannot reach root's pyenv), run in `dir`.
fn exec_nobody(daemon: &Daemon, session: &str, agent: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(toolwall_bin());
    cmd.args(["exec", "--user", "nobody", "--session", session, "--config"])
        .arg(&daemon.config)
        .args(["--", "/usr/bin/python3"])
        .arg(agent)
        .current_dir(dir);
    cmd
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a script");
    path
}

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

/// A declared server that notes its pid, writes 64 MiB to stderr on one line, says so, and
/// waits on its stdin (which, below, never ends).
const NOISY_SERVER: &str = r#"
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
sys.stderr.write("x" * (64 << 20) + "\n")
sys.stderr.flush()
open(sys.argv[1] + ".flooded", "w").close()
for line in sys.stdin:
    pass
time.sleep(3600)
"#;

/// The agent speaks the socket's relay protocol itself, as a hostile one would: 65 `--deny`
/// patterns, then a message limit of 2^62 and both ends of one pipe as the server's stdin
/// and stdout (so it never ends), 256 MiB without a newline into it, and off it goes without
/// waiting for the exit status.
const GREEDY_AGENT: &str = r#"
import json, os, select, socket, sys, time
def ask(deny, limit):
    u = socket.socket(socket.AF_UNIX)
    u.connect(os.environ["TOOLWALL_API_SOCKET"])
    body = json.dumps({"server_id": "noisy", "command": ["x"], "env": [], "cwd": "/", "deny": deny, "max_message_bytes": limit}).encode()
    u.sendall(b"POST /api/stdio HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: toolwall-stdio\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    head = b""
    while b"\r\n\r\n" not in head:
        c = u.recv(65536)
        if not c:
            break
        head += c
    return u, head
u, head = ask(["^t%d$" % i for i in range(65)], 1 << 20)
print("many patterns", head.split(b"\r\n")[0].decode(), b"at most 64" in head, flush=True)
u.close()
u, head = ask([], 1 << 62)
print("greedy", head.split(b"\r\n")[0].decode(), flush=True)
r, w = os.pipe()
socket.send_fds(u, [b"x"], [r, w])
os.close(r)
flooded = time.time() + 20
while not os.path.exists(sys.argv[1] + ".flooded") and time.time() < flooded:
    time.sleep(0.05)
os.set_blocking(w, False)
chunk, sent, deadline = b"y" * (1 << 20), 0, time.time() + 15
while sent < (256 << 20) and time.time() < deadline:
    if select.select([], [w], [], 0.5)[1]:
        try:
            sent += os.write(w, chunk)
        except BlockingIOError:
            pass
        except BrokenPipeError:
            break
print("sent MiB", sent >> 20, flush=True)
"#;

/// What an agent asks of the daemon is bounded by the daemon — its `--deny` patterns in
/// number, its message limit by the daemon's own, a server's stderr in memory and in the log
/// — and a server ends when the shim that asked for it goes away (otherwise it outlives its
/// session, holding the pipes it was handed, and then holds the daemon's SIGTERM up).
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_what_an_agent_asks_of_the_daemon_is_bounded_and_ends_with_it() {
    assert!(is_root());
    let dir = shared_dir();
    let server = write(dir.path(), "noisy.py", NOISY_SERVER);
    let agent = write(dir.path(), "greedy.py", GREEDY_AGENT);
    let pid_file = dir.path().join("server.pid");
    let mut daemon = Daemon::start(&format!(
        "sandbox:\n  mcp:\n    servers:\n      - id: noisy\n        type: stdio\n        command: /usr/bin/python3\n        args: [{}, {}]\n        user: nobody\n",
        server.display(),
        pid_file.display()
    ));
    let out = exec_nobody(&daemon, "greedy", &agent, dir.path())
        .arg(&pid_file)
        .current_dir(dir.path())
        .output()
        .expect("toolwall exec");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
    assert!(
        stdout.contains("many patterns HTTP/1.1 4") && stdout.contains(" True"),
        "65 --deny patterns are refused, with the limit: {stdout}"
    );
    assert!(stdout.contains("greedy HTTP/1.1 101"), "{stdout}");
    // The daemon read 16 MiB (its own limit), not the 256 the agent's limit would allow.
    let sent: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("sent MiB ")?.parse().ok())
        .expect("how much was sent");
    assert!((16..=20).contains(&sent), "{sent} MiB went in: {stdout}");
    // The server started; once its shim is gone, it is ended (within the reaper's second).
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    wait_for("the server started", &|| pid_file.exists());
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .expect("pid")
        .trim()
        .parse()
        .expect("a pid");
    // Its pid is the namespace's (1): find it by its arguments instead.
    assert_eq!(pid, 1, "the server is pid 1 of its namespace");
    let running = || {
        std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .any(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("noisy.py"))
            })
    };
    wait_for("the server outlived the shim that asked for it", &|| {
        !running()
    });
    // The daemon held neither the 256 MiB line nor the 64 MiB stderr line, and logged a cut.
    let peak_kb = peak_kb(daemon.child.id());
    assert!(peak_kb < 160 << 10, "the daemon peaked at {peak_kb} kB");
    let log = daemon.stderr();
    assert!(log.len() < 4 << 20, "the log holds {} bytes", log.len());
    assert!(log.contains("more bytes left out"), "the cut is said");
    // And it stops at once.
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}

/// Session S's agent sends the head of a `POST /api/stdio`, hands the connection to session
/// T's agent (over an abstract socket) and leaves; S is closed; T finishes the request.
const HAND_OFF: &str = r#"
import os, socket, sys, time
role, name = sys.argv[1], sys.argv[2]
body = b'{"server_id":"late","command":["/bin/sleep","600"],"env":[],"cwd":"/","deny":[],"max_message_bytes":1048576}'
if role == "s":
    u = socket.socket(socket.AF_UNIX)
    u.connect(os.environ["TOOLWALL_API_SOCKET"])
    u.sendall(b"POST /api/stdio HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: toolwall-stdio\r\nContent-Length: %d\r\n\r\n" % len(body))
    c = socket.socket(socket.AF_UNIX)
    for _ in range(100):
        try:
            c.connect("\0" + name)
            break
        except OSError:
            time.sleep(0.1)
    socket.send_fds(c, [b"x"], [u.fileno()])
    print("handed over", flush=True)
else:
    l = socket.socket(socket.AF_UNIX)
    l.bind("\0" + name)
    l.listen(1)
    c, _ = l.accept()
    _, fds, _, _ = socket.recv_fds(c, 10, 4)
    u = socket.socket(fileno=fds[0])
    time.sleep(3)  # S's exec has closed S by now
    try:
        u.sendall(body)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the daemon may refuse (and close) before the body: its answer is still there
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = u.recv(65536)
        if not chunk:
            break
        head += chunk
    print("answer", head.split(b"\r\n")[0].decode(), head.split(b"\r\n\r\n", 1)[-1].decode(), flush=True)
"#;

/// A server starts only for the process that asked, in a session that is still open —
/// otherwise a request begun in one session and finished by another after the first closed
/// starts a server that outlives both, recording under the closed one.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_request_handed_to_another_session_starts_nothing() {
    assert!(is_root());
    let dir = shared_dir();
    let agent = write(dir.path(), "handoff.py", HAND_OFF);
    let name = format!("toolwall-handoff-{}", std::process::id());
    // Sessions reach no Unix socket of another unless it is listed: listed here, so the
    // hand-off happens and the daemon's own check is what is tested.
    let daemon = Daemon::start(&format!(
        "sandbox:\n  mcp:\n    fail_closed: false\nexec:\n  allow_unix: [\"@{name}\"]\n"
    ));
    let exec = |session: &str, role: &str| {
        exec_nobody(&daemon, session, &agent, dir.path())
            .args([role, &name])
            .current_dir(dir.path())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("toolwall exec")
    };
    let taker = exec("taker", "t");
    let giver = exec("giver", "s").wait_with_output().expect("giver");
    assert!(String::from_utf8_lossy(&giver.stdout).contains("handed over"));
    let taker = taker.wait_with_output().expect("taker");
    let said = String::from_utf8_lossy(&taker.stdout);
    println!("{said}\n{}", daemon.stderr());
    assert!(said.contains("answer HTTP/1.1 4"), "refused: {said}");
    // Which refusal depends on when the daemon looks: the giver gone already (its place cannot
    // be told) or the request moved (CI saw both).
    assert!(
        said.contains("gone or has moved") || said.contains("cannot tell where the process"),
        "{said}"
    );
    let log = daemon.stderr();
    assert!(!log.contains("started stdio MCP server"), "{log}");
}

/// A declared server that reads its stdin and answers nothing.
const QUIET_SERVER: &str = "import sys\nfor line in sys.stdin:\n    pass\n";

/// What a hostile agent runs first: it asks the daemon to start the declared server `quiet`
/// (`POST /api/stdio`, as `toolwall shim` does) and hands over the pipes it then writes
/// (`w_in`) and reads (`r_out`).
const RELAY_OPEN: &str = r#"
import json, os, socket, time
u = socket.socket(socket.AF_UNIX)
u.connect(os.environ["TOOLWALL_API_SOCKET"])
body = json.dumps({"server_id": "quiet", "command": ["x"], "env": [], "cwd": "/", "deny": [], "max_message_bytes": 1 << 24}).encode()
u.sendall(b"POST /api/stdio HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: toolwall-stdio\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
head = b""
while b"\r\n\r\n" not in head:
    head += u.recv(4096)
r_in, w_in = os.pipe()
r_out, w_out = os.pipe()
socket.send_fds(u, [b"x"], [r_in, w_out])
os.close(r_in)
os.close(w_out)
"#;

/// `RELAY_OPEN` followed by `rest`.
fn relay_agent(rest: &str) -> String {
    format!("{RELAY_OPEN}{rest}")
}

/// After `RELAY_OPEN`, the agent sends four `tools/call`s whose `arguments` are 12 MiB of `[0,0,…]` each.
const BIG_CALLS: &str = r#"
blob = b"[" + b"0," * (6 << 20) + b"0]"
for i in range(4):
    os.write(w_in, b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"t","arguments":{"a":' % (i + 1) + blob + b'}}}\n')
print("sent", flush=True)
time.sleep(float(os.environ.get("HOLD", "0")))
"#;

/// The record of a call whose arguments are over the record's bound is made without parsing
/// them — parsed, 690 MB of calls take the daemon to 9.4 GB (each parsed to 16 times its size,
/// queued for the writer) and delay their records by minutes.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_calls_with_huge_arguments_are_recorded_without_parsing_them() {
    assert!(is_root());
    let dir = shared_dir();
    let server = write(dir.path(), "quiet.py", QUIET_SERVER);
    let agent = write(dir.path(), "big.py", &relay_agent(BIG_CALLS));
    let daemon = Daemon::start(&format!(
        "sandbox:\n  mcp:\n    servers:\n      - id: quiet\n        type: stdio\n        command: /usr/bin/python3\n        args: [{}]\n        user: nobody\n",
        server.display()
    ));
    let out = exec_nobody(&daemon, "big", &agent, dir.path())
        .env("HOLD", "10")
        .current_dir(dir.path())
        .output()
        .expect("toolwall exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let calls = daemon.json_lines(&["mcp", "events", "--json", "--type", "mcp_tool_called"]);
    println!("{calls:?}");
    assert_eq!(calls.len(), 4, "every call is recorded");
    for call in &calls {
        assert_eq!(call["input"]["bytes"], 12_582_921, "{call}");
        assert!(call["input"]["toolwall_truncated"].is_string(), "{call}");
    }
    let peak_kb = peak_kb(daemon.child.id());
    println!("daemon peak {peak_kb} kB");
    assert!(peak_kb < 250 << 10, "the daemon peaked at {peak_kb} kB");
}

/// The agent hands over a regular file as the server's stdin.
const FILE_STDIN: &str = r#"
import json, os, socket
u = socket.socket(socket.AF_UNIX)
u.connect(os.environ["TOOLWALL_API_SOCKET"])
body = json.dumps({"server_id": "quiet", "command": ["x"], "env": [], "cwd": "/", "deny": [], "max_message_bytes": 65536}).encode()
u.sendall(b"POST /api/stdio HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: toolwall-stdio\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
head = b""
while b"\r\n\r\n" not in head:
    head += u.recv(4096)
print("asked", head.split(b"\r\n")[0].decode(), flush=True)
r, w = os.pipe()
socket.send_fds(u, [b"x"], [os.open("/etc/hostname", os.O_RDONLY), w])
print("status", repr(u.recv(16)), flush=True)
"#;

/// A shim's stdin must be a pipe or a socket — a regular file handed over would make the
/// server thread panic (a thread that made a PID namespace cannot start the blocking thread a
/// file needs); it is refused, with the reason, and nothing panics.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_file_handed_over_as_stdin_is_refused() {
    assert!(is_root());
    let dir = shared_dir();
    let server = write(dir.path(), "quiet.py", QUIET_SERVER);
    let agent = write(dir.path(), "file.py", FILE_STDIN);
    let daemon = Daemon::start(&format!(
        "sandbox:\n  mcp:\n    servers:\n      - id: quiet\n        type: stdio\n        command: /usr/bin/python3\n        args: [{}]\n        user: nobody\n",
        server.display()
    ));
    let out = exec_nobody(&daemon, "filein", &agent, dir.path())
        .output()
        .expect("toolwall exec");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = daemon.stderr();
    println!("{stdout}\n{log}");
    assert!(stdout.contains("asked HTTP/1.1 101"), "{stdout}");
    // No exit status: the relay ended before the server was fed.
    assert!(stdout.contains("status b''"), "{stdout}");
    assert!(log.contains("must be pipes or sockets"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// Races a server's start against its session's close, `attempts` times: the host opens a
/// session, a child moved into it asks for a server (`/bin/cat`) and exits, the host closes
/// the session at once and then feeds the server a line through the connection it kept.
const RACE: &str = r#"
import json, os, select, socket, sys, time
sock, attempts, cgroups = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def api(method, path, body=b""):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    s.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (method, path, len(body)) + body)
    out = b""
    while True:
        c = s.recv(65536)
        if not c:
            return out
        out += c
body = b'{"server_id":"race","command":["/bin/cat"],"env":[],"cwd":"/","deny":[],"max_message_bytes":1048576}'
request = b"POST /api/stdio HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: toolwall-stdio\r\nContent-Length: %d\r\n\r\n" % len(body) + body
answered = 0
for i in range(attempts):
    name = b"race%d" % i
    api(b"POST", b"/api/sessions", b'{"name":"%s"}' % name)
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        open("%s/%s/cgroup.procs" % (cgroups, name.decode()), "w").write(str(os.getpid()))
        u = socket.socket(socket.AF_UNIX)
        u.connect(sock)
        socket.send_fds(b, [b"x"], [u.fileno()])
        b.recv(1)
        u.sendall(request)
        spin = time.perf_counter()
        while time.perf_counter() - spin < 0.001 * (1 + i % 3):
            pass
        os._exit(0)
    _, fds, _, _ = socket.recv_fds(a, 10, 1)
    u = socket.socket(fileno=fds[0])
    a.send(b"g")
    os.waitpid(pid, 0)
    api(b"DELETE", b"/api/sessions/" + name)
    head = b""
    while b"\r\n\r\n" not in head:
        c = u.recv(4096)
        if not c:
            break
        head += c
    if b" 101 " not in head.split(b"\r\n")[0]:
        continue
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    socket.send_fds(u, [b"x"], [r1, w2])
    os.close(r1)
    os.close(w2)
    time.sleep(0.5)
    try:
        os.write(w1, b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
    except BrokenPipeError:
        continue
    if select.select([r2], [], [], 2)[0] and os.read(r2, 4096):
        answered += 1
        print("answered after its session closed:", name.decode(), flush=True)
print("answered", answered, "of", attempts, flush=True)
"#;

/// A server whose start races its session's close (the close finding no server yet, the
/// server then starting) must not run on after the session and record under it. Once running,
/// a server asks whether its session's opening is still open and ends if not; a close that
/// comes later finds it.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_server_whose_start_races_its_sessions_close_does_not_outlive_it() {
    assert!(is_root());
    let dir = shared_dir();
    let race = write(dir.path(), "race.py", RACE);
    let daemon = Daemon::start("sandbox:\n  mcp:\n    fail_closed: false\n");
    let cgroups = toolwall::cgroup2_mount().expect("cgroup2").join("toolwall");
    let out = Command::new("/usr/bin/python3")
        .arg(&race)
        .arg(&daemon.socket)
        .arg("12")
        .arg(&cgroups)
        .output()
        .expect("race");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("answered 0 of 12"),
        "{stdout}\n{}",
        daemon.stderr()
    );
}

/// After `RELAY_OPEN`, the agent sends `tools/call`s of ~200 KiB of arguments for `SECONDS`, draining its replies
/// in a thread, and prints how many it wrote.
const FLOOD_CALLS: &str = r#"
import threading
def drain():
    while os.read(r_out, 1 << 16):
        pass
threading.Thread(target=drain, daemon=True).start()
if os.environ.get("SHAPE") == "deep":
    # Parsed, many times its text; a deep branch last, which a size walk meets first.
    deep = "[" * 40 + "0" + "]" * 40
    args = '{"a":[[' + ",".join(["0"] * 65537) + '],[' + ",".join(["0"] * 32769) + '],' + deep + ']}'
else:
    args = '{"a":"' + "x" * (200 << 10) + '"}'
args = args.encode()
sent = 0
def flood():
    global sent
    while True:
        os.write(w_in, b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"t","arguments":%s}}\n' % (sent + 1, args))
        sent += 1
threading.Thread(target=flood, daemon=True).start()
time.sleep(float(os.environ["SECONDS"]))
print("sent", sent, flush=True)
os._exit(0)
"#;

/// What waits for the store is bounded in bytes. The store cannot write (a full disk), so
/// every call's record waits in the queue: the relay stops reading the agent once 32 MiB of
/// records wait, instead of queueing all it sends (unbounded, the daemon's memory grows with
/// every call, ~200 KiB each, for as long as the agent sends: 2,424 calls, 528 MB in 12 s).
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_flood_of_calls_waits_for_the_store_instead_of_filling_the_daemon() {
    let (_, most_queued, peak_kb) = flood_calls("text");
    assert!(
        most_queued > 16 << 20,
        "the store could not write, so the queue filled up ({most_queued} bytes)"
    );
    assert!(
        most_queued < (32 << 20) + (2 << 20),
        "the queue stays within its bound plus one read's calls ({most_queued} bytes)"
    );
    assert!(peak_kb < 200 << 10, "the daemon peaked at {peak_kb} kB");
}

/// A record weighs what it holds in memory: weighed by a walk that stops at the first deep
/// branch (a deep branch last in an array is walked first), or by their text where parsed
/// values hold many times it, 262 calls weigh 204 KB and hold 877 MB.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_arguments_that_are_heavy_once_parsed_weigh_what_they_hold() {
    let (sent, most_queued, peak_kb) = flood_calls("deep");
    assert!(sent > 0);
    assert!(
        most_queued < (32 << 20) + (16 << 20),
        "the queue stays within its bound plus one read's calls ({most_queued} bytes)"
    );
    assert!(peak_kb < 250 << 10, "the daemon peaked at {peak_kb} kB");
}

/// Runs [`FLOOD_CALLS`] with arguments of `shape` for 12 s against a daemon whose store
/// cannot write; (calls sent, most bytes queued, the daemon's peak kB).
fn flood_calls(shape: &str) -> (u64, u64, u64) {
    assert!(is_root());
    let small = SmallDisk::mount();
    let dir = shared_dir();
    let server = write(dir.path(), "quiet.py", QUIET_SERVER);
    let agent = write(dir.path(), "flood.py", &relay_agent(FLOOD_CALLS));
    let mut daemon = Daemon::start_with_db(
        &format!(
            "sandbox:\n  mcp:\n    servers:\n      - id: quiet\n        type: stdio\n        command: /usr/bin/python3\n        args: [{}]\n        user: nobody\n",
            server.display()
        ),
        small.db(),
    );
    small.fill();
    let run = exec_nobody(&daemon, "flood", &agent, dir.path())
        .env("SECONDS", "12")
        .env("SHAPE", shape)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("toolwall exec");
    let mut most_queued = 0u64;
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(11) {
        std::thread::sleep(std::time::Duration::from_millis(250));
        let (_, health) = http_unix(&daemon.socket, "GET", "/health", "").expect("/health");
        let health: serde_json::Value = serde_json::from_str(&health).expect("json");
        most_queued = most_queued.max(health["queued_event_bytes"].as_u64().unwrap_or(0));
        assert_eq!(
            health["queued_event_bytes_max"].as_u64(),
            Some(32 << 20),
            "{health}"
        );
    }
    let out = run.wait_with_output().expect("the agent");
    let said = String::from_utf8_lossy(&out.stdout);
    let sent: u64 = said
        .trim()
        .strip_prefix("sent ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the agent said {said:?}"));
    let peak_kb = peak_kb(daemon.child.id());
    println!(
        "{shape}: sent {sent} calls; at most {most_queued} bytes queued; daemon peak {peak_kb} kB"
    );
    let stopping = std::time::Instant::now();
    daemon.stop();
    assert!(
        stopping.elapsed() < std::time::Duration::from_secs(20),
        "stopped in {:?}",
        stopping.elapsed()
    );
    (sent, most_queued, peak_kb)
}

/// A 4 MiB tmpfs for a daemon's store, unmounted when dropped.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount() -> SmallDisk {
        let dir = tempfile::tempdir().expect("temp dir");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m", "toolwall-small"])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(mounted.success(), "mount a 4 MiB tmpfs");
        SmallDisk(dir)
    }

    fn db(&self) -> std::path::PathBuf {
        self.0.path().join("events.db")
    }

    /// From now on every write of the store fails.
    fn fill(&self) {
        let mut filler = std::fs::File::create(self.0.path().join("filler")).expect("filler");
        let chunk = vec![0u8; 64 << 10];
        while std::io::Write::write_all(&mut filler, &chunk).is_ok() {}
    }

    fn free(&self) {
        std::fs::remove_file(self.0.path().join("filler")).expect("free the disk");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// The agent re-runs itself with a 1.9 MB command line, then connects to the declared
/// server's address (nothing listens) as fast as it can for `SECONDS`.
const CONNECT_FLOOD: &str = r#"
import os, sys, socket, time
if len(sys.argv) < 3:
    os.execv(sys.executable, [sys.executable, sys.argv[0], "go"] + ["y" * 120000] * 16)
port = int(os.environ["PORT"])
t0 = time.time()
n = 0
while time.time() - t0 < float(os.environ["SECONDS"]):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except OSError:
        pass
    s.close()
    n += 1
print("connects", n, flush=True)
"#;

/// The kernel layer's records ask for room in the queue too, and carry at most 4 KiB of the
/// process's command line (a connect flood of records that did not ask, each with the whole
/// command line, takes the queue to 3.2 GB; reading the command line whole per connection
/// alone takes the daemon to 873 MB). While the queue is full the kernel's records are counted
/// per (session, server, destination, verdict) and stored as counts once the store writes
/// again (`netmon/service/backlog.rs`) — nothing waits past the bound, nothing goes unsaid.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_connect_flood_while_the_store_is_behind_is_counted_not_queued() {
    assert!(is_root());
    let small = SmallDisk::mount();
    let dir = shared_dir();
    let agent = write(dir.path(), "connects.py", CONNECT_FLOOD);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("addr").port()
    };
    let mut daemon = Daemon::start_with_db(
        &format!(
            "sandbox:\n  mcp:\n    servers:\n      - id: net\n        type: http\n        url: http://127.0.0.1:{port}/mcp\n"
        ),
        small.db(),
    );
    small.fill();
    let run = exec_nobody(&daemon, "connects", &agent, dir.path())
        .env("SECONDS", "8")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("toolwall exec");
    let mut most_queued = 0u64;
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(8) {
        std::thread::sleep(std::time::Duration::from_millis(250));
        let (_, health) = http_unix(&daemon.socket, "GET", "/health", "").expect("/health");
        let health: serde_json::Value = serde_json::from_str(&health).expect("json");
        most_queued = most_queued.max(health["queued_event_bytes"].as_u64().unwrap_or(0));
    }
    let out = run.wait_with_output().expect("the agent");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let peak_kb = peak_kb(daemon.child.id());
    println!("{said}; at most {most_queued} bytes queued; daemon peak {peak_kb} kB");
    assert!(said.starts_with("connects "), "{said}");
    assert!(
        most_queued < (32 << 20) + (4 << 20),
        "the queue stays near its bound ({most_queued} bytes)"
    );
    assert!(peak_kb < 300 << 10, "the daemon peaked at {peak_kb} kB");
    // The disk frees: what was counted is stored, as counts.
    small.free();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let counted = loop {
        let rows = daemon.json_lines(&[
            "mcp",
            "events",
            "--json",
            "--type",
            "mcp_network_connection",
            "--session",
            "connects",
        ]);
        let counted: u64 = rows
            .iter()
            .filter(|r| r["count"].as_u64().unwrap_or(1) > 1)
            .map(|r| r["count"].as_u64().unwrap_or(0))
            .sum();
        if counted > 0 || std::time::Instant::now() > deadline {
            for row in &rows {
                let cmdline = row["cmdline"].as_str().unwrap_or_default();
                assert!(
                    cmdline.len() < 5000,
                    "a cut command line: {} bytes",
                    cmdline.len()
                );
            }
            break counted;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert!(
        counted > 0,
        "the connections made while the store was behind are stored as counts"
    );
    daemon.stop();
}

/// The session's agent: its base URL for the others, then a request to the LLM proxy without
/// the `/s/<key>` prefix (which must not be recorded as the host's), then it waits to be ended.
const KEYLESS_AGENT: &str = r#"
import json, os, sys, time, urllib.request, urllib.error
out, done = sys.argv[1], sys.argv[2]
base = os.environ["ANTHROPIC_BASE_URL"]
body = json.dumps({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
    "tools": [{"name": "mcp__everything__echo", "input_schema": {"type": "object"}}]}).encode()
def post(url):
    req = urllib.request.Request(url + "/v1/messages", data=body, method="POST", headers={"content-type": "application/json"})
    try:
        return urllib.request.urlopen(req, timeout=20).status
    except urllib.error.HTTPError as e:
        return e.code
status = post(base.split("/s/")[0])
# A connection the session made, used once, handed to a process outside (the holder).
import socket
host, port = base.split("/")[2].rsplit(":", 1)
conn = socket.create_connection((host, int(port)))
conn.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
head = b""
while b"\r\n\r\n" not in head:
    head += conn.recv(1)
length = int(next(l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")))
while length > 0:
    length -= len(conn.recv(length))
hand = socket.socket(socket.AF_UNIX)
hand.connect(sys.argv[3])
socket.send_fds(hand, [b"x"], [conn.fileno()])
with open(out + ".tmp", "w") as f:
    f.write(json.dumps({"base": base, "keyless": status}))
os.rename(out + ".tmp", out)
deadline = time.time() + 60
while not os.path.exists(done) and time.time() < deadline:
    time.sleep(0.1)
"#;

/// Outside every session: takes a connection the session's agent made and, once the session
/// has closed, posts on it.
const HOLDER: &str = r#"
import os, socket, sys, time
path, closed, out = sys.argv[1], sys.argv[2], sys.argv[3]
listener = socket.socket(socket.AF_UNIX)
listener.bind(path)
os.chmod(path, 0o777)
listener.listen(1)
handed, _ = listener.accept()
_, fds, _, _ = socket.recv_fds(handed, 16, 1)
conn = socket.socket(fileno=fds[0])
deadline = time.time() + 60
while not os.path.exists(closed) and time.time() < deadline:
    time.sleep(0.1)
body = b'{"model":"m","max_tokens":9,"messages":[]}'
conn.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
conn.settimeout(20)
answer = conn.recv(65536).decode(errors="replace")
with open(out, "w") as f:
    f.write(answer)
"#;

/// Another session's agent posting with the first one's key.
const KEY_THIEF: &str = r#"
import json, sys, urllib.request, urllib.error
base = json.load(open(sys.argv[1]))["base"]
req = urllib.request.Request(base + "/v1/messages", data=b'{"model":"m","max_tokens":9,"messages":[]}', method="POST", headers={"content-type": "application/json"})
try:
    print("stolen key", urllib.request.urlopen(req, timeout=20).status)
except urllib.error.HTTPError as e:
    print("stolen key", e.code, e.read().decode())
"#;

/// A session's LLM key sits in its agent's environment, readable by
/// every process of the agent's user. The key is honoured only from the session's own
/// processes (the kernel says which cgroup made the connection): a process outside every
/// session and one of another session are refused; a session's process that leaves the key
/// out is still recorded under its session, not the host's.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_sessions_llm_key_works_only_from_its_own_processes() {
    assert!(is_root());
    let dir = shared_dir();
    // A model that asks for `echo` of server `everything`.
    let port_file = dir.path().join("llm-port");
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _llm = Killed(
        Command::new("/usr/bin/python3")
            .arg(toolwall_tests::workspace_root().join("tests/peers/fake_llm.py"))
            .arg("--log")
            .arg(dir.path().join("llm.jsonl"))
            .arg("--port-file")
            .arg(&port_file)
            .spawn()
            .expect("start fake_llm.py"),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let llm_port = loop {
        if let Ok(port) = std::fs::read_to_string(&port_file) {
            break port.trim().to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fake_llm.py did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let (hand, closed, held) = (
        dir.path().join("hand.sock"),
        dir.path().join("closed"),
        dir.path().join("held"),
    );
    // The hand-off socket is listed (sessions reach no other Unix socket), so the connection
    // does leave the session and the proxy's own check is what is tested.
    let mut daemon = Daemon::start(&format!(
        "proxy:\n  listen: 127.0.0.1:0\n  providers:\n    anthropic: http://127.0.0.1:{llm_port}\n\
         sandbox:\n  mcp:\n    servers:\n      - id: everything\n        type: stdio\n        command: /bin/true\n\
         exec:\n  allow_unix: [{:?}]\n",
        hand.display().to_string()
    ));
    let agent = write(dir.path(), "agent.py", KEYLESS_AGENT);
    let thief = write(dir.path(), "thief.py", KEY_THIEF);
    let (said, done) = (dir.path().join("said"), dir.path().join("done"));
    let mut holder = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(HOLDER)
        .args([&hand, &closed, &held])
        .spawn()
        .expect("the holder");
    while !hand.exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut victim = exec_nobody(&daemon, "victim", &agent, dir.path())
        .arg(&said)
        .arg(&done)
        .arg(&hand)
        .spawn()
        .expect("toolwall exec");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let said: serde_json::Value = loop {
        if let Ok(text) = std::fs::read_to_string(&said) {
            break serde_json::from_str(&text).expect("the agent's JSON");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent said nothing"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let base = said["base"].as_str().expect("its base URL").to_owned();
    assert!(base.contains("/s/"), "{base}");
    assert_eq!(said["keyless"], 200, "{said}");
    // From outside every session (this test, as root), with the session's key.
    let post = |url: &str| {
        use std::io::{Read as _, Write as _};
        let rest = url.strip_prefix("http://").expect("an http URL");
        let (host, path) = rest.split_once('/').expect("a path");
        let body = r#"{"model":"m","max_tokens":9,"messages":[]}"#;
        let mut stream = std::net::TcpStream::connect(host).expect("connect to the LLM proxy");
        write!(
            stream,
            "POST /{path}/v1/messages HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        let code = answer
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        (code, answer)
    };
    let (code, body) = post(&base);
    assert_eq!(code, "403", "{body}");
    assert!(body.contains("only from its own session"), "{body}");
    // From another session, with the victim's key.
    let stolen = exec_nobody(&daemon, "thief", &thief, dir.path())
        .arg(dir.path().join("said"))
        .output()
        .expect("toolwall exec");
    let stdout = String::from_utf8_lossy(&stolen.stdout);
    assert!(stdout.contains("stolen key 403"), "{stdout}");
    std::fs::write(&done, "").expect("end the agent");
    assert!(victim.wait().expect("the agent").success());
    // The session is closed: the connection it handed out speaks for no one.
    std::fs::write(&closed, "").expect("tell the holder");
    assert!(holder.wait().expect("the holder").success());
    let held = std::fs::read_to_string(&held).expect("the holder's answer");
    assert!(
        held.starts_with("HTTP/1.1 403") && held.contains("a session that has closed"),
        "{held}"
    );
    // The session's key-less call is the session's; nothing was recorded for the others.
    let events = daemon.json_lines(&[
        "mcp",
        "events",
        "--json",
        "--type",
        "mcp_tool_call_intercepted",
    ]);
    let sessions: Vec<&str> = events
        .iter()
        .map(|e| e["session_id"].as_str().unwrap_or_default())
        .collect();
    assert!(sessions.contains(&"victim"), "{events:?}");
    assert!(sessions.iter().all(|s| *s == "victim"), "{sessions:?}");
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}
