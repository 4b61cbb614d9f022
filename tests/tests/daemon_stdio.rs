//! Issue 15.7, through the real binary: nothing inside a session writes to the audit. An agent
//! (as `nobody`, under `toolwall exec`) cannot post events, ask for decisions or register
//! tools through the daemon's socket; its `toolwall shim` is a pipe to a stdio server the
//! daemon runs — the declared command, as the agent's user, in a cgroup outside the agent's
//! session — and the daemon judges and records the calls under the agent's session.

use std::path::Path;
use std::process::Command;

use toolwall_tests::{Daemon, is_root, toolwall_bin};

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
try:
    pins = os.listdir("/sys/fs/bpf")
    note(f"bpffs: {len(pins)} entries")
except OSError as e:
    note(f"bpffs: refused {e.errno}")
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
    let out = Command::new(toolwall_bin())
        .args([
            "exec",
            "--user",
            "nobody",
            "--session",
            "audited",
            "--config",
        ])
        .arg(&daemon.config)
        .arg("--")
        .arg("/usr/bin/python3")
        .arg(&agent)
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
    assert!(daemon.stop().success(), "{}", daemon.stderr());
}
