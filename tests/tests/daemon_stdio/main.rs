//! Through the real binary: nothing inside a session writes to the audit (what it wrote, it
//! could forge). An agent
//! (as `nobody`, under `toolwall exec`) cannot post events, ask for decisions or register
//! tools through the daemon's socket; its `toolwall shim` is a pipe to a stdio server the
//! daemon runs — the declared command, as the agent's user, in a cgroup outside the agent's
//! session — and the daemon judges and records the calls under the agent's session.

use std::path::Path;
use std::process::Command;

use toolwall_tests::{Daemon, http_unix, is_root, toolwall_bin};

mod confinement;
mod keys;
mod requests;
mod store;

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
