//! What an agent asks of the daemon through its shim is bounded and ends with the agent: its
//! servers' output, requests handed to another session, huge arguments, a file as stdin, a
//! server whose start races the session's close.

use super::*;

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
