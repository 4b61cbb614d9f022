//! Leaving the session or detaching its programs, as `nobody` and as root, by the cgroup files
//! and through a `kill -9` of the daemon; and a signal to `toolwall exec` reaches the agent in its
//! PID namespace.

use super::*;

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
