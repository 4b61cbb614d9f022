//! No way around the kernel layer from inside a session. Each test goes the user's way —
//! `toolwall run` and `toolwall exec`, with a Python agent inside the session — and tries one
//! way around: the host's own addresses, UDP without `connect()`, leaving the session,
//! detaching its programs, `kill -9` of the daemon, a name that stops resolving.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use toolwall_tests::{
    Daemon, is_root,
    session::{events, exec, session_cgroup_gone, shared_dir, text, wait_for_text, write_agent},
};

/// A listener on every address (`[::]`, dual-stack) that accepts and closes: what a server
/// declared at `127.0.0.1:P` but bound to all interfaces looks like from the session.
fn listen_everywhere() -> u16 {
    // std binds `[::]` dual-stack on Linux (net.ipv6.bindv6only = 0).
    let socket = TcpListener::bind("[::]:0").expect("bind [::]:0");
    let port = socket.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in socket.incoming() {
            drop(stream);
        }
    });
    port
}

/// Every address of every interface of this host, as `ip -j addr` lists them (link-local
/// IPv6 with its `%interface` scope, which a connect needs).
fn host_addresses() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-j", "addr"])
        .output()
        .expect("ip -j addr");
    let interfaces: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("ip json");
    let mut addrs = Vec::new();
    for interface in interfaces {
        let name = interface["ifname"].as_str().unwrap_or_default().to_owned();
        for info in interface["addr_info"].as_array().into_iter().flatten() {
            let Some(local) = info["local"].as_str() else {
                continue;
            };
            if info["scope"] == "link" && local.contains(':') {
                addrs.push(format!("{local}%{name}"));
            } else {
                addrs.push(local.to_owned());
            }
            if info["family"] == "inet" {
                addrs.push(format!("::ffff:{local}"));
            }
        }
    }
    addrs.extend(["0.0.0.0", "::", "127.9.9.9"].map(str::to_owned));
    addrs
}

/// A `Daemon::start_wrapped` wrapper that gives the daemon its own mount namespace with
/// `file` bind-mounted over `target` (say a private `/etc/hosts` the test edits).
fn with_private(file: &Path, target: &str) -> Vec<String> {
    [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        &format!("mount --bind \"$0\" {target} && exec \"$@\""),
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([file.display().to_string()])
    .collect()
}

fn denied_server_config(port: u16) -> String {
    format!(
        "sandbox:\n  mcp:\n    servers:\n      - id: forbidden\n        type: http\n        url: http://127.0.0.1:{port}/mcp\n    denied_servers:\n      - id: forbidden\n"
    )
}

const CONNECT_ALL: &str = r#"
import os, socket, sys
port = int(sys.argv[1])
for addr in sys.argv[2:]:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    for kind, name in [(socket.SOCK_STREAM, "tcp"), (socket.SOCK_DGRAM, "udp-sendto")]:
        s = socket.socket(family, kind)
        try:
            if kind == socket.SOCK_STREAM:
                s.connect((addr, port))
            else:
                s.sendto(b"x", (addr, port))
            print(name, addr, "THROUGH")
        except PermissionError:
            print(name, addr, "EPERM")
        except OSError as e:
            print(name, addr, "ERROR", e)
        s.close()
# A burst, read after the session closed: every event must keep its session.
for _ in range(1000):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
    except PermissionError:
        pass
    s.close()
print("burst done")
"#;

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_every_local_address_and_udp_sendto_of_a_denied_server_are_refused_and_recorded() {
    assert!(is_root());
    let port = listen_everywhere();
    let daemon = Daemon::start(&denied_server_config(port));
    let dir = shared_dir();
    let agent = write_agent(dir.path(), "connect_all.py", CONNECT_ALL);
    let addrs = host_addresses();
    let mut args = vec![port.to_string()];
    args.extend(addrs.iter().cloned());
    let out = exec(
        &daemon,
        &["--user", "nobody", "--session", "local"],
        &agent,
        &args,
    )
    .output()
    .expect("exec");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "exec failed: {stderr}\n{stdout}");
    println!("{stdout}");
    for addr in &addrs {
        for kind in ["tcp", "udp-sendto"] {
            assert!(
                stdout.contains(&format!("{kind} {addr} EPERM")),
                "{kind} to {addr}:{port} was not refused:\n{stdout}"
            );
        }
    }
    assert!(stdout.contains("burst done"), "{stdout}");

    // Past a burst per second the kernel summarises (one event counting many): the counts
    // add up to every connection.
    let expected = 2 * addrs.len() as u64 + 1000;
    let total = |events: &[serde_json::Value]| -> u64 {
        events
            .iter()
            .map(|e| e["count"].as_u64().unwrap_or(1))
            .sum()
    };
    let recorded = events(&daemon, "mcp_network_connection", |e| total(e) >= expected);
    let unattributed = recorded
        .iter()
        .filter(|e| e["session_id"] != "local")
        .count();
    assert_eq!(
        unattributed,
        0,
        "every kernel event keeps its session ({} of {} do not)",
        unattributed,
        recorded.len()
    );
    assert_eq!(
        total(&recorded),
        expected,
        "{} connections recorded ({} events), {expected} expected",
        total(&recorded),
        recorded.len()
    );
    assert!(
        recorded
            .iter()
            .any(|e| e["protocol"] == "udp-sendmsg" && e["action"] == "block"),
        "a refused sendto is recorded as such"
    );
}

const STAY_INSIDE: &str = r#"
import ctypes, os, socket, struct, sys, time
port, root_procs, pin, marks = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
print("uid", os.getuid())
print("cgroup", open("/proc/self/cgroup").read().strip().splitlines()[-1])
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print("CapEff", status["CapEff"].strip(), "CapBnd", status["CapBnd"].strip(), "NoNewPrivs", status["NoNewPrivs"].strip())
try:
    open(root_procs, "w").write(str(os.getpid()))
    print("leave: moved to the root cgroup")
except OSError as e:
    print("leave: refused", e.errno)
try:
    os.mkdir(os.path.join(os.path.dirname(root_procs), "toolwall-escape"))
    print("mkdir cgroup: made")
except OSError as e:
    print("mkdir cgroup: refused", e.errno)
libc = ctypes.CDLL(None, use_errno=True)
SYS_bpf = 321
# BPF_LINK_GET_FD_BY_ID (30) for every link id: the first step of `bpftool link detach`.
got = []
for link_id in range(1, 4096):
    attr = ctypes.create_string_buffer(struct.pack("I", link_id), 128)
    fd = libc.syscall(SYS_bpf, 30, attr, 128)
    if fd >= 0:
        got.append(link_id)
        # BPF_LINK_DETACH (34)
        detach = ctypes.create_string_buffer(struct.pack("I", fd), 128)
        libc.syscall(SYS_bpf, 34, detach, 128)
print("links opened", got)
# BPF_OBJ_GET (7) on the session's pinned link.
path = ctypes.create_string_buffer(pin.encode())
attr = ctypes.create_string_buffer(struct.pack("Q", ctypes.addressof(path)), 128)
fd = libc.syscall(SYS_bpf, 7, attr, 128)
print("pin opened" if fd >= 0 else "pin refused %d" % ctypes.get_errno())
try:
    os.unlink(pin)
    print("unpin: removed")
except OSError as e:
    print("unpin: refused", e.errno)
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
import subprocess
# Left running on purpose (its own session, so no signal of ours reaches it): it must die
# with the agent.
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(86399)", marks], start_new_session=True)
print("pid", os.getpid(), flush=True)
while not os.path.exists(os.path.join(marks, "go")):
    time.sleep(0.05)
print("cgroup after", open("/proc/self/cgroup").read().strip().splitlines()[-1])
s = socket.socket()
try:
    s.connect(("127.0.0.1", port))
    print("connect THROUGH")
except PermissionError:
    print("connect EPERM")
"#;

fn cap_bit(line: &str, name: &str, bit: u32) -> bool {
    let hex = line
        .split_whitespace()
        .skip_while(|w| *w != name)
        .nth(1)
        .unwrap_or_else(|| panic!("no {name} in {line:?}"));
    u64::from_str_radix(hex, 16).expect("hex") & (1 << bit) != 0
}

/// The pinned `connect4` link of `session` under the daemon's pin directory.
fn session_pin(daemon: &Daemon, session: &str) -> PathBuf {
    std::fs::read_dir(&daemon.pin_dir)
        .expect("pin dir")
        .next()
        .expect("a build directory")
        .expect("entry")
        .path()
        .join("sessions")
        .join(session)
        .join("connect4")
}

/// The host's pids of the processes whose command line starts with `needle` (the agents' pids
/// inside their PID namespaces mean nothing out here).
fn host_pids_of(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .starts_with(needle)
            })
        })
        .collect()
}

/// Runs [`STAY_INSIDE`] in session `session` with `exec_args`, the denied server on `port`;
/// once the agent printed its pid, `between(pid)` runs with its host pid, then the agent
/// finishes. Returns the agent's stdout, exec's stderr and whether exec succeeded; the process
/// the agent left running is gone by then (its PID namespace died with it).
fn stay_inside(
    daemon: &Daemon,
    port: u16,
    session: &str,
    exec_args: &[&str],
    between: impl FnOnce(u32),
) -> (String, String, bool) {
    let dir = shared_dir();
    let agent = write_agent(dir.path(), "stay.py", STAY_INSIDE);
    let root_procs = toolwall::cgroup2_mount()
        .expect("cgroup2")
        .join("cgroup.procs");
    let args = [
        port.to_string(),
        root_procs.display().to_string(),
        session_pin(daemon, session).display().to_string(),
        dir.path().display().to_string(),
    ];
    let out_file = dir.path().join("agent.out");
    let err_file = dir.path().join("exec.err");
    let mut all_args = exec_args.to_vec();
    all_args.extend(["--session", session]);
    let child = exec(daemon, &all_args, &agent, &args)
        .stdout(std::fs::File::create(&out_file).expect("out"))
        .stderr(std::fs::File::create(&err_file).expect("err"))
        .spawn()
        .expect("exec");
    // A failed assertion must not leave the agent waiting for its mark for ever: exec hands
    // a SIGTERM on to it (a SIGKILL would leave it running).
    struct Exec(std::process::Child);
    impl Drop for Exec {
        fn drop(&mut self) {
            if let Ok(None) = self.0.try_wait() {
                // SAFETY: kill(2) on our own child, not yet reaped.
                unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
                let _ = self.0.wait();
            }
        }
    }
    let mut guard = Exec(child);
    let child = &mut guard.0;
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid = loop {
        let seen = std::fs::read_to_string(&out_file).unwrap_or_default();
        if seen.lines().any(|l| l.starts_with("pid ")) {
            // The agent itself: python3 running the script (exec and its init, toolwall's fork,
            // name the script too, further on).
            let agent = format!("/usr/bin/python3 {}", agent.display());
            let pids = host_pids_of(&agent);
            assert_eq!(pids.len(), 1, "one agent {agent:?}: {pids:?}");
            break pids[0];
        }
        if Instant::now() > deadline || child.try_wait().expect("wait").is_some() {
            let err = std::fs::read_to_string(&err_file).unwrap_or_default();
            panic!("the agent did not get going: {seen}\n{err}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    between(pid);
    std::fs::write(dir.path().join("go"), "").expect("mark");
    let ok = child.wait().expect("exec").success();
    let left = host_pids_of(&format!(
        "/usr/bin/python3 -c import time; time.sleep(86399) {}",
        dir.path().display()
    ));
    assert!(
        left.is_empty(),
        "the agent's leftover process outlived it: {left:?}"
    );
    let stdout = std::fs::read_to_string(&out_file).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_file).unwrap_or_default();
    println!("{stdout}\n{stderr}");
    (stdout, stderr, ok)
}

fn assert_confined(stdout: &str, caps_field: &str) {
    let caps = stdout
        .lines()
        .find(|l| l.starts_with("CapEff"))
        .expect("caps");
    for bit in [21, 39, 12, 38, 19, 2] {
        assert!(
            !cap_bit(caps, caps_field, bit),
            "capability {bit} in {caps_field}: {caps}"
        );
    }
    for line in [
        "cgroup 0::/",
        "links opened []",
        "cgroup after 0::/",
        "connect EPERM",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "{line:?} missing: {stdout}"
        );
    }
    assert!(stdout.contains("NoNewPrivs 1"), "{stdout}");
    // Its own PID namespace under toolwall's init: nothing of the host to trace or write.
    assert!(stdout.lines().any(|l| l == "pids [1, 2]"), "{stdout}");
    assert!(stdout.contains("leave: refused"), "{stdout}");
    assert!(stdout.contains("mkdir cgroup: refused"), "{stdout}");
    assert!(stdout.contains("pin refused"), "{stdout}");
    assert!(stdout.contains("unpin: refused"), "{stdout}");
}

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_root_started_agent_cannot_leave_its_session_or_detach_its_programs() {
    assert!(is_root());
    let port = listen_everywhere();
    // Started by root with no --user and no SUDO_USER: the configured exec.user applies.
    let daemon = Daemon::start(&format!(
        "{}exec:\n  user: nobody\n",
        denied_server_config(port)
    ));
    let (stdout, stderr, ok) = stay_inside(&daemon, port, "inside", &[], |_| {});
    assert!(ok, "{stderr}");
    assert!(stdout.contains("uid 65534"), "runs as exec.user: {stdout}");
    assert_confined(&stdout, "CapBnd");
}

/// The agent is pid 2 of its namespace, under toolwall's init: a `SIGTERM` to `toolwall exec`
/// reaches it (pid 1 would drop a signal it has no handler for, as Python and Node have none
/// for `SIGTERM`), and exec exits as the agent did.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_sigterm_to_exec_reaches_the_agent_in_its_pid_namespace() {
    assert!(is_root());
    let daemon = Daemon::start("exec:\n  user: nobody\n");
    let dir = shared_dir();
    let agent = write_agent(
        dir.path(),
        "wait.py",
        "import os, sys, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(60)\n",
    );
    let out_file = dir.path().join("agent.out");
    let mut child = exec(&daemon, &["--session", "term"], &agent, &[])
        .stdout(std::fs::File::create(&out_file).expect("out"))
        .spawn()
        .expect("exec");
    assert!(wait_for_text(&out_file, "pid ").contains("pid 2"));
    // SAFETY: kill(2) on our own child.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not get the SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
}

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_root_agent_cannot_leave_or_detach_and_is_moved_back_when_moved_out() {
    assert!(is_root());
    let port = listen_everywhere();
    let daemon = Daemon::start(&format!(
        "{}netmon:\n  watch_interval_ms: 200\n",
        denied_server_config(port)
    ));
    let root_procs = toolwall::cgroup2_mount()
        .expect("cgroup2")
        .join("cgroup.procs");
    let (stdout, stderr, ok) = stay_inside(&daemon, port, "rootagent", &["--as-root"], |pid| {
        // Someone outside (root, with every capability) moves the agent out once the watch has
        // seen it in its session; the watch must notice and move it back before it connects.
        std::thread::sleep(Duration::from_millis(600));
        std::fs::write(&root_procs, pid.to_string()).expect("move the agent out");
        std::thread::sleep(Duration::from_millis(1500));
    });
    assert!(ok, "{stderr}");
    assert!(stdout.contains("uid 0"), "{stdout}");
    assert!(
        stderr.contains("WARNING") && stderr.contains("as root"),
        "{stderr}"
    );
    // Read-only cgroup filesystems in its mount namespace (EROFS).
    assert!(stdout.contains("leave: refused 30"), "{stdout}");
    assert_confined(&stdout, "CapEff");
    assert_confined(&stdout, "CapBnd");
    let alerts = events(&daemon, "kernel_alert", |e| !e.is_empty());
    assert!(
        alerts.iter().any(|a| a["alert"] == "process_left"
            && a["action"] == "block"
            && a["session_id"] == "rootagent"),
        "{alerts:?}"
    );
}

const THROUGH_A_CRASH: &str = r#"
import os, socket, sys, time
port, marks = int(sys.argv[1]), sys.argv[2]
def attempt(n):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        print(n, "THROUGH", flush=True)
    except PermissionError:
        print(n, "EPERM", flush=True)
attempt(1)
for n in (2, 3):
    while not os.path.exists(os.path.join(marks, "go%d" % n)):
        time.sleep(0.05)
    attempt(n)
"#;

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_killed_daemon_leaves_the_session_denied_and_the_next_one_adopts_it() {
    assert!(is_root());
    let port = listen_everywhere();
    let mut daemon = Daemon::start(&denied_server_config(port));
    let dir = shared_dir();
    let agent = write_agent(dir.path(), "crash.py", THROUGH_A_CRASH);
    let marks = dir.path().to_path_buf();
    let out_file = dir.path().join("agent.out");
    let mut child = exec(
        &daemon,
        &["--user", "nobody", "--session", "crash"],
        &agent,
        &[port.to_string(), marks.display().to_string()],
    )
    .stdout(std::fs::File::create(&out_file).expect("out"))
    .stderr(std::fs::File::create(dir.path().join("exec.err")).expect("err"))
    .spawn()
    .expect("exec");
    let wait_for = |what: &str| wait_for_text(&out_file, what);
    wait_for("1 EPERM");
    daemon.kill9();
    std::fs::write(marks.join("go2"), "").expect("mark");
    wait_for("2 ");
    daemon.relaunch("stderr2");
    std::fs::write(marks.join("go3"), "").expect("mark");
    let status = child.wait().expect("exec exit");
    let seen = wait_for("3 ");
    let exec_err = std::fs::read_to_string(dir.path().join("exec.err")).unwrap_or_default();
    println!("{seen}\n{exec_err}");
    assert!(
        seen.contains("2 EPERM") && seen.contains("3 EPERM"),
        "the session stays denied with no daemon and after: {seen}"
    );
    assert_eq!(
        status.code(),
        Some(1),
        "exec says the daemon went away: {exec_err}"
    );
    assert!(exec_err.contains("the daemon went away"), "{exec_err}");
    let restarted = std::fs::read_to_string(daemon.dir.path().join("stderr2")).unwrap_or_default();
    assert!(
        restarted.contains("re-adopted session \"crash\""),
        "{restarted}"
    );

    let connections = events(&daemon, "mcp_network_connection", |e| e.len() >= 3);
    let crash: Vec<_> = connections
        .iter()
        .filter(|e| e["session_id"] == "crash" && e["action"] == "block")
        .collect();
    assert_eq!(
        crash.len(),
        3,
        "the attempt made while no daemon ran is read from the pinned ring by the next: {connections:?}"
    );
    let alerts = events(&daemon, "kernel_alert", |e| !e.is_empty());
    assert!(
        alerts
            .iter()
            .any(|a| a["alert"] == "session_adopted" && a["session_id"] == "crash"),
        "{alerts:?}"
    );
    // exec closed the session through the new daemon: nothing of it is left.
    assert!(session_cgroup_gone("crash"), "session cgroup removed");
}

const DNS_AGENT: &str = r#"
import os, socket, sys, time
gone, never, marks = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def attempt(label, port):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        print(label, "THROUGH", flush=True)
    except PermissionError:
        print(label, "EPERM", flush=True)
attempt("resolving", gone)
attempt("never-resolved", never)
while not os.path.exists(os.path.join(marks, "go")):
    time.sleep(0.05)
attempt("stopped-resolving", gone)
"#;

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_name_that_stops_resolving_keeps_its_deny() {
    assert!(is_root());
    let (gone, never) = (listen_everywhere(), listen_everywhere());
    let dir = shared_dir();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 toolwall-dns-test.internal\n").expect("hosts");
    // The daemon gets a private /etc/hosts (its own mount namespace), which the test edits.
    let wrapper = with_private(&hosts, "/etc/hosts");
    let daemon = Daemon::start_wrapped(
        &format!(
            "sandbox:\n  mcp:\n    servers:\n      - id: gone\n        type: http\n        url: http://toolwall-dns-test.internal:{gone}/mcp\n      - id: never\n        type: http\n        url: http://toolwall-never-resolves.internal:{never}/mcp\n    denied_servers:\n      - id: gone\n      - id: never\nnetmon:\n  resolve_interval_secs: 1\n"
        ),
        &wrapper,
    );
    let agent = write_agent(dir.path(), "dns.py", DNS_AGENT);
    let out_file = dir.path().join("agent.out");
    let mut child = exec(
        &daemon,
        &["--user", "nobody", "--session", "dns"],
        &agent,
        &[
            gone.to_string(),
            never.to_string(),
            dir.path().display().to_string(),
        ],
    )
    .stdout(std::fs::File::create(&out_file).expect("out"))
    .spawn()
    .expect("exec");
    wait_for_text(&out_file, "never-resolved");
    // In place (the bind mount holds the inode): the name stops resolving.
    std::fs::write(&hosts, "").expect("empty hosts");
    std::thread::sleep(Duration::from_millis(2500));
    std::fs::write(dir.path().join("go"), "").expect("mark");
    assert!(child.wait().expect("exec").success());
    let seen = std::fs::read_to_string(&out_file).unwrap_or_default();
    println!("{seen}\n{}", daemon.stderr());
    let line = |l: &str| seen.lines().any(|seen| seen == l);
    assert!(line("resolving EPERM"), "{seen}");
    assert!(
        line("never-resolved EPERM"),
        "a DENY name that never resolved is denied on its port everywhere: {seen}"
    );
    assert!(
        line("stopped-resolving EPERM"),
        "the name keeps its last addresses: {seen}"
    );
    assert!(
        daemon
            .stderr()
            .contains("cannot resolve; its rule stays on the addresses it last resolved to"),
        "the lost name is reported"
    );
}

const DNS_SENDER: &str = r#"
import socket, sys
for addr, port in [("198.51.100.53", 53), ("2001:db8::53", 53), ("198.51.100.1", 53), ("198.51.100.53", 5353)]:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01", (addr, port))
        print(addr, port, "SENT")
    except PermissionError:
        print(addr, port, "EPERM")
    except OSError as e:
        print(addr, port, "ERROR", e.errno)
    s.close()
"#;

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_dns_to_a_resolver_not_allowed_is_flagged_or_denied() {
    assert!(is_root());
    let dir = shared_dir();
    let agent = write_agent(dir.path(), "dns_sender.py", DNS_SENDER);
    for (mode, session) in [("flag", "dnsflag"), ("deny", "dnsdeny")] {
        let daemon = Daemon::start(&format!(
            "netmon:\n  dns:\n    other_resolvers: {mode}\n    resolvers: [198.51.100.1]\n"
        ));
        let out = exec(
            &daemon,
            &["--user", "nobody", "--session", session],
            &agent,
            &[],
        )
        .output()
        .expect("exec");
        let (stdout, stderr) = text(&out);
        println!("{mode}:\n{stdout}\n{stderr}");
        assert!(out.status.success(), "{stderr}");
        let line = |l: &str| stdout.lines().any(|seen| seen.starts_with(l));
        // The allowed resolver and other ports are not the kernel's business.
        assert!(!line("198.51.100.1 53 EPERM"), "{stdout}");
        assert!(!line("198.51.100.53 5353 EPERM"), "{stdout}");
        let refused = mode == "deny";
        for other in ["198.51.100.53 53", "2001:db8::53 53"] {
            assert_eq!(
                line(&format!("{other} EPERM")),
                refused,
                "{mode}: {other}: {stdout}"
            );
        }
        let recorded = events(&daemon, "mcp_network_connection", |e| e.len() >= 2);
        let mut seen: Vec<(String, String, String)> = recorded
            .iter()
            .map(|e| {
                assert_eq!(e["session_id"], session, "{e}");
                (
                    e["server_id"].as_str().unwrap_or_default().to_owned(),
                    e["remote_addr"].as_str().unwrap_or_default().to_owned(),
                    e["action"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        seen.sort();
        let action = if refused { "block" } else { "allow" };
        assert_eq!(
            seen,
            vec![
                (
                    "dns:other-resolver".to_owned(),
                    "198.51.100.53:53".to_owned(),
                    action.to_owned()
                ),
                (
                    "dns:other-resolver".to_owned(),
                    "[2001:db8::53]:53".to_owned(),
                    action.to_owned()
                ),
            ],
            "{mode}: exactly the two queries to another resolver are recorded"
        );
    }
}

/// A DNS server on 127.0.0.1:53 that answers every A query with the address in `answer`,
/// TTL 1 s, and every other query with no data.
fn fake_dns(answer: std::sync::Arc<std::sync::Mutex<std::net::Ipv4Addr>>) {
    let socket = std::net::UdpSocket::bind("127.0.0.1:53").expect("bind 127.0.0.1:53");
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                return;
            };
            let query = &buf[..n];
            // The question: labels from byte 12 to a zero, then type and class.
            let mut end = 12;
            while end < n && query[end] != 0 {
                end += 1 + query[end] as usize;
            }
            let end = end + 5;
            if n < 12 || end > n {
                continue;
            }
            let is_a = query[end - 4..end - 2] == [0, 1];
            let mut reply = Vec::with_capacity(end + 16);
            reply.extend_from_slice(&query[..2]);
            reply.extend_from_slice(&[0x81, 0x80, 0, 1, 0, u8::from(is_a), 0, 0, 0, 0]);
            reply.extend_from_slice(&query[12..end]);
            if is_a {
                let ip = *answer.lock().expect("answer");
                reply.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4]);
                reply.extend_from_slice(&ip.octets());
            }
            let _ = socket.send_to(&reply, from);
        }
    });
}

const TTL_AGENT: &str = r#"
import os, socket, sys, time
port, marks = int(sys.argv[1]), sys.argv[2]
def attempt(label):
    for addr in ("203.0.113.7", "203.0.113.8"):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.sendto(b"x", (addr, port))
            print(label, addr, "SENT", flush=True)
        except PermissionError:
            print(label, addr, "EPERM", flush=True)
        except OSError as e:
            print(label, addr, "ERROR", e.errno, flush=True)
attempt("before")
while not os.path.exists(os.path.join(marks, "go")):
    time.sleep(0.05)
attempt("after")
"#;

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_changed_address_is_denied_once_its_ttl_expires() {
    assert!(is_root());
    let answer = std::sync::Arc::new(std::sync::Mutex::new(std::net::Ipv4Addr::new(
        203, 0, 113, 7,
    )));
    fake_dns(answer.clone());
    // No route to the test range: discovery of the denied server fails at once instead of
    // waiting out its time-out.
    struct Route;
    impl Drop for Route {
        fn drop(&mut self) {
            let _ = Command::new("ip")
                .args(["route", "del", "unreachable", "203.0.113.0/24"])
                .status();
        }
    }
    let _ = Command::new("ip")
        .args(["route", "add", "unreachable", "203.0.113.0/24"])
        .status();
    let _route = Route;
    let dir = shared_dir();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
    )
    .expect("resolv.conf");
    let wrapper = with_private(&resolv, "/etc/resolv.conf");
    let port = 9999;
    // A re-resolve interval far longer than the test: only the TTL can bring the new address.
    let daemon = Daemon::start_wrapped(
        &format!(
            "sandbox:\n  mcp:\n    servers:\n      - id: moving\n        type: http\n        url: http://moving.toolwall-test.example:{port}/mcp\n    denied_servers:\n      - id: moving\nnetmon:\n  resolve_interval_secs: 3600\n"
        ),
        &wrapper,
    );
    let agent = write_agent(dir.path(), "ttl.py", TTL_AGENT);
    let out_file = dir.path().join("agent.out");
    let mut child = exec(
        &daemon,
        &["--user", "nobody", "--session", "ttl"],
        &agent,
        &[port.to_string(), dir.path().display().to_string()],
    )
    .stdout(std::fs::File::create(&out_file).expect("out"))
    .spawn()
    .expect("exec");
    wait_for_text(&out_file, "before 203.0.113.8");
    *answer.lock().expect("answer") = std::net::Ipv4Addr::new(203, 0, 113, 8);
    std::thread::sleep(Duration::from_millis(3500));
    std::fs::write(dir.path().join("go"), "").expect("mark");
    assert!(child.wait().expect("exec").success());
    let seen = std::fs::read_to_string(&out_file).unwrap_or_default();
    println!("{seen}\n{}", daemon.stderr());
    let line = |l: &str| seen.lines().any(|seen| seen == l);
    assert!(line("before 203.0.113.7 EPERM"), "{seen}");
    assert!(
        !line("before 203.0.113.8 EPERM"),
        "not yet the name's address: {seen}"
    );
    assert!(
        line("after 203.0.113.8 EPERM"),
        "the new address is denied once the old answer's TTL ran out: {seen}"
    );
}

const FLOOD: &str = r#"
import os, socket, sys, time
port, per, flagged = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        refused = 0
        for _ in range(per):
            try:
                s.sendto(b"x", ("127.0.0.1", port))
            except PermissionError:
                refused += 1
        os._exit(0 if refused == per else 1)
    kids.append(pid)
# Ten flagged connections to another server while the flood runs.
through = 0
for _ in range(10):
    c = socket.create_connection(("127.0.0.1", flagged))
    c.close()
    through += 1
    time.sleep(0.02)
print("flagged through", through)
print("all refused", all(os.waitpid(k, 0)[1] == 0 for k in kids))
"#;

/// A flood of 800k denied datagrams must not push flagged connections out of the ring, nor its
/// drops show only in `/health`: each (session, server, verdict) sends a burst of events and
/// the rest is summarised in the kernel, so the flagged connections are all stored one by one,
/// and the flood's datagrams are all accounted for by its events' counts — none lost.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_flood_is_summarised_and_hides_no_flagged_connection() {
    assert!(is_root());
    let port = listen_everywhere();
    let flagged = listen_everywhere();
    let config = format!(
        "{}      - id: watched\n        type: http\n        url: http://127.0.0.1:{flagged}/mcp\n",
        denied_server_config(port).replace("    denied_servers:\n      - id: forbidden\n", "")
    ) + "    denied_servers:\n      - id: forbidden\n";
    let daemon = Daemon::start(&config);
    let dir = shared_dir();
    let agent = write_agent(dir.path(), "flood.py", FLOOD);
    const PER: usize = 25_000;
    let out = exec(
        &daemon,
        &["--user", "nobody", "--session", "flood"],
        &agent,
        &[port.to_string(), PER.to_string(), flagged.to_string()],
    )
    .output()
    .expect("exec");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("all refused True"), "{stdout}");
    assert!(stdout.contains("flagged through 10"), "{stdout}");
    let sent = 4 * PER as u64;
    let lost_in = |alerts: &[serde_json::Value]| -> u64 {
        alerts
            .iter()
            .filter(|a| a["alert"] == "events_lost")
            .filter_map(|a| a["detail"].as_str()?.split(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    // Summaries are reported every watch interval: wait until the books balance.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (denied, watched, summaries, lost) = loop {
        let connections = daemon.json_lines(&[
            "mcp",
            "events",
            "--json",
            "--type",
            "mcp_network_connection",
        ]);
        let of = |server: &str| -> Vec<&serde_json::Value> {
            connections
                .iter()
                .filter(|c| c["event"]["server_id"] == server || c["server_id"] == server)
                .collect()
        };
        let count = |c: &&serde_json::Value| {
            let e = if c["event"].is_object() {
                &c["event"]
            } else {
                c
            };
            e["count"].as_u64().unwrap_or(1)
        };
        let denied: u64 = of("forbidden").iter().map(count).sum();
        let watched = of("watched").len();
        let summaries = of("forbidden").iter().filter(|c| count(c) > 1).count();
        let lost =
            lost_in(&daemon.json_lines(&["mcp", "events", "--json", "--type", "kernel_alert"]));
        if (denied + lost >= sent && watched >= 10) || Instant::now() > deadline {
            break (denied, watched, summaries, lost);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    println!(
        "flood: {sent} refused = {denied} in events ({summaries} summaries) + {lost} lost; {watched} flagged stored"
    );
    assert_eq!(watched, 10, "every flagged connection is stored");
    assert_eq!(lost, 0, "nothing lost");
    assert_eq!(
        denied, sent,
        "every refused datagram is in an event's count"
    );
    assert!(summaries >= 1, "the flood was summarised");
    // The calls view shows the summary as its own record, saying what it stands for.
    let calls = daemon.json_lines(&["mcp", "calls", "--json"]);
    assert!(
        calls.iter().any(|c| c["server_id"] == "forbidden"
            && c["reason"]
                .as_str()
                .is_some_and(|r| r.contains("connections summarised by the kernel"))),
        "{calls:?}"
    );
}
