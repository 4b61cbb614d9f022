//! A session reaches no Unix socket it was not given: from inside `toolwall exec --user
//! nobody`, the user's tmux server, a forwarder's pathname and abstract sockets and a datagram
//! socket are refused and recorded, while toolwall's API socket and the names `exec.allow_unix`
//! lists are reached, and glibc's name service cache is not refused. Each route is first taken
//! without toolwall (the control), so a refusal is shown to be toolwall's.

use std::{
    process::{Child, Command},
    time::{Duration, Instant},
};

use toolwall_tests::{
    Daemon, is_root,
    session::{events, exec_nobody, shared_dir, text, without_toolwall, write_agent},
};

/// The host's services: stream listeners at a pathname and an abstract name each, and a
/// datagram socket, for every name on its command line (`@name` is abstract); killed on drop.
const SERVICES: &str = r#"
import os, socket, sys, time
held = []
for name in sys.argv[1:]:
    kind = socket.SOCK_DGRAM if name.endswith(".dgram") else socket.SOCK_STREAM
    s = socket.socket(socket.AF_UNIX, kind)
    address = "\0" + name[1:] if name.startswith("@") else name
    s.bind(address)
    if kind == socket.SOCK_STREAM:
        s.listen(16)
    if not name.startswith("@"):
        os.chmod(name, 0o777)
    held.append(s)
print("READY", flush=True)
time.sleep(600)
"#;

/// Connects (or sends, for `.dgram`) to every name on its command line; prints `NAME ok` or
/// `NAME errno`. Then asks the tmux server at `TMUX_SOCKET` for a window running `touch MARK`,
/// and makes a user namespace (in which it could mount another socket over a listed name).
const AGENT: &str = r#"
import ctypes, os, socket, subprocess, sys
tmux_socket, mark = sys.argv[1], sys.argv[2]
for name in sys.argv[3:]:
    address = "\0" + name[1:] if name.startswith("@") else name
    try:
        if name.endswith(".dgram"):
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"x", address)
        else:
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(address)
        print(name, "ok")
    except OSError as e:
        print(name, e.errno)
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect("/var/run/nscd/socket")
    print("nscd ok")
except OSError as e:
    print("nscd", e.errno)
done = subprocess.run(["tmux", "-S", tmux_socket, "new-window", "touch " + mark],
                      capture_output=True, text=True)
print("tmux", done.returncode, done.stderr.strip().replace("\n", " "))
libc = ctypes.CDLL(None, use_errno=True)
if os.fork() == 0:
    rc = libc.unshare(0x10000000)
    print("userns", rc, ctypes.get_errno(), flush=True)
    os._exit(0)
os.wait()
# The session's pid 1 (toolwall's init, outside the agent's seccomp filter) cannot be traced.
rc = libc.ptrace(0x4206, 1, None, None)  # PTRACE_SEIZE: no stop, gone when the agent exits
print("trace-init", rc, ctypes.get_errno(), flush=True)
"#;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn outcome<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or("missing")
}

#[test]
#[ignore = "privileged: needs root and BPF (Linux 6.7); `cargo xtask test` runs it as root"]
fn privileged_a_session_reaches_no_unix_socket_it_was_not_given() {
    assert!(is_root());
    let dir = shared_dir();
    let at = |name: &str| dir.path().join(name).display().to_string();
    let tag = std::process::id();
    let refused = [
        at("forwarder.sock"),
        format!("@toolwall-test-forwarder-{tag}"),
        at("log.dgram"),
    ];
    let listed = [at("allowed.sock"), format!("@toolwall-test-allowed-{tag}")];
    let services = write_agent(dir.path(), "services.py", SERVICES);
    let mut host = Command::new("python3");
    host.arg(&services)
        .args(refused.iter().chain(&listed))
        .stdout(std::process::Stdio::piped());
    let mut host = Killed(host.spawn().expect("python3 services"));
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(host.0.stdout.as_mut().expect("stdout")),
        &mut ready,
    )
    .expect("services ready");
    assert_eq!(ready.trim(), "READY");

    // The user's tmux server, as the agent's user, outside any session.
    let tmux_socket = at("tmux.sock");
    let tmux = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .args(["tmux", "-f", "/dev/null", "-S", &tmux_socket])
        .args(["new-session", "-d", "-s", "host", "sleep 600"])
        .env("HOME", dir.path())
        // Its windows run in this shell (nobody's login shell runs nothing).
        .env("SHELL", "/bin/sh")
        .output()
        .expect("tmux");
    assert!(tmux.status.success(), "tmux server: {tmux:?}");
    let _tmux = scopeguard(&tmux_socket);

    let agent = write_agent(dir.path(), "agent.py", AGENT);
    let mark = at("ran-outside");
    let names: Vec<String> = refused.iter().chain(&listed).cloned().collect();
    let args: Vec<String> = [tmux_socket.clone(), mark.clone()]
        .into_iter()
        .chain(names.iter().cloned())
        .collect();

    let control = without_toolwall(&agent, &args);
    let (stdout, stderr) = text(&control);
    for name in &names {
        assert_eq!(
            outcome(&stdout, name),
            "ok",
            "control: {name}\n{stdout}{stderr}"
        );
    }
    assert!(
        wait_for(&mark),
        "control: tmux ran the window outside:\n{stdout}"
    );
    assert_eq!(
        outcome(&stdout, "userns"),
        "0 0",
        "control: {stdout}{stderr}"
    );
    std::fs::remove_file(&mark).expect("remove the control's mark");

    // Even where the host lets a process trace others of its user that changed ids.
    let _dumpable = Sysctl::set("/proc/sys/fs/suid_dumpable", "1");
    let daemon = Daemon::start(&format!(
        "exec:\n  allow_unix: [{:?}, {:?}]\n",
        listed[0], listed[1]
    ));
    let stdout = exec_nobody(&daemon, "unix", &agent, &args);
    for name in &refused {
        assert_eq!(outcome(&stdout, name), "1", "EPERM for {name}:\n{stdout}");
    }
    for name in &listed {
        assert_eq!(outcome(&stdout, name), "ok", "{name} is listed:\n{stdout}");
    }
    // glibc's name service cache is always listed: reached where it runs, ENOENT where not.
    assert!(
        ["ok", "2"].contains(&outcome(&stdout, "nscd")),
        "nscd is not refused: {stdout}"
    );
    assert!(
        !outcome(&stdout, "tmux").starts_with("0 "),
        "tmux refused: {stdout}"
    );
    assert_eq!(
        outcome(&stdout, "userns"),
        "-1 1",
        "no user namespace, so no mount over a listed name: {stdout}"
    );
    assert_eq!(
        outcome(&stdout, "trace-init"),
        "-1 1",
        "the session's init cannot be traced: {stdout}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !std::path::Path::new(&mark).exists(),
        "the user's tmux server ran a window for the session:\n{stdout}"
    );

    let recorded = events(&daemon, "mcp_network_connection", |e| {
        refused
            .iter()
            .chain([&tmux_socket])
            .all(|name| e.iter().any(|e| e["remote_addr"] == name.as_str()))
    });
    for name in refused.iter().chain([&tmux_socket]) {
        let event = recorded
            .iter()
            .find(|e| e["remote_addr"] == name.as_str())
            .unwrap_or_else(|| panic!("no record of {name}: {recorded:#?}"));
        assert_eq!(event["server_id"], "toolwall:unix");
        assert_eq!(event["action"], "block");
        assert_eq!(event["session_id"], "unix");
        assert_eq!(event["family"], "unix");
        let protocol = if name.ends_with(".dgram") {
            "unix-sendmsg"
        } else {
            "unix-connect"
        };
        assert_eq!(event["protocol"], protocol, "{event}");
    }
    assert!(
        recorded
            .iter()
            .all(|e| !listed.iter().any(|l| e["remote_addr"] == l.as_str())),
        "listed names pass unrecorded: {recorded:#?}"
    );
    assert!(
        recorded
            .iter()
            .all(|e| !e["remote_addr"].as_str().unwrap_or("").contains("nscd")),
        "nscd passes unrecorded: {recorded:#?}"
    );
}

/// Stops the tmux server at `socket` when dropped.
fn scopeguard(socket: &str) -> impl Drop + '_ {
    struct Stop<'a>(&'a str);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = Command::new("tmux")
                .args(["-S", self.0, "kill-server"])
                .output();
        }
    }
    Stop(socket)
}

/// A sysctl set for the test's length, put back when dropped.
struct Sysctl {
    path: &'static str,
    was: String,
}

impl Sysctl {
    fn set(path: &'static str, value: &str) -> Sysctl {
        let was = std::fs::read_to_string(path).expect("read sysctl");
        std::fs::write(path, value).expect("write sysctl");
        Sysctl { path, was }
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, self.was.trim());
    }
}

/// Whether `path` appears within 5 s.
fn wait_for(path: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if std::path::Path::new(path).exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}
