//! A real login user's own services run nothing for its session. The test makes a user with a
//! home, an ssh key it may log in with, its own tmux server, socat forwarders (a pathname and
//! an abstract Unix socket) and an HTTP proxy, all on this host and outside any session, in
//! front of a declared MCP server that sessions may reach only through the filter proxy. The
//! same agent, as that user, takes each route to the server first without toolwall (each one
//! reaches it), then under `toolwall exec --user`: each is refused and recorded, and the
//! server hears nothing.

use std::{
    io::{BufRead, BufReader},
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use toolwall_tests::{
    Daemon, free_port, is_root,
    session::{LoginUser, events, outcome, shared_dir, text, write_agent},
    toolwall_bin,
};

/// A process killed (with its children, where it leads a process group) on drop.
struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn service(mut cmd: Command) -> Service {
    Service(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a host service"),
    )
}

/// The declared server: remembers the first line of every connection (a route names itself
/// in it).
fn server() -> (u16, Arc<Mutex<Vec<String>>>) {
    let socket = TcpListener::bind("127.0.0.1:0").expect("bind the server");
    let port = socket.local_addr().expect("addr").port();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&heard);
    std::thread::spawn(move || {
        for stream in socket.incoming().flatten() {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut line = String::new();
            let _ = BufReader::new(stream).read_line(&mut line);
            log.lock().expect("log").push(line.trim().to_owned());
        }
    });
    (port, heard)
}

/// Connects to the server at `127.0.0.1:PORT` and names the route it came by.
const REACH: &str = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.sendall(sys.argv[2].encode() + b"\n")
s.close()
"#;

/// Takes every route to the server and prints `ROUTE RESULT`: `ok`, the errno's name, or for
/// a program (ssh, tmux) `exit N`. Also prints `env NAME` for each proxy variable it was given.
const AGENT: &str = r#"
import errno, os, socket, subprocess, sys
user, reach, server, sshd, tmux_socket, unix_fwd, abstract_fwd, proxy = sys.argv[1:9]
server, sshd, proxy = int(server), int(sshd), int(proxy)
def outcome(route, f):
    try:
        f()
        print(route, "ok", flush=True)
    except OSError as e:
        print(route, errno.errorcode.get(e.errno, str(e.errno)), flush=True)
def program(route, argv):
    done = subprocess.run(argv, capture_output=True, timeout=30)
    print(route, "exit", done.returncode, flush=True)
def unix(address, route):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(address)
    s.sendall(route.encode() + b"\n")
    s.recv(1)
    s.close()
def via_proxy(request):
    s = socket.create_connection(("127.0.0.1", proxy), timeout=5)
    s.sendall(request)
    s.recv(4096)
    s.close()
def connect_tunnel():
    s = socket.create_connection(("127.0.0.1", proxy), timeout=5)
    s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (server, server))
    reply = s.recv(4096)
    if not reply.startswith(b"HTTP/1.") or b" 200 " not in reply.split(b"\r\n")[0] + b" ":
        raise OSError(errno.EPROTO, reply[:40])
    s.sendall(b"proxy-connect\n")
    s.close()
for name in ("http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
    if name in os.environ:
        print("env", name, flush=True)
remote = "python3 %s %d ssh" % (reach, server)
program("ssh", ["ssh", "-p", str(sshd), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5",
                "%s@127.0.0.1" % user, remote])
program("tmux", ["tmux", "-S", tmux_socket, "new-window", "python3 %s %d tmux" % (reach, server)])
outcome("unix-forwarder", lambda: unix(unix_fwd, "unix-forwarder"))
outcome("abstract-forwarder", lambda: unix("\0" + abstract_fwd, "abstract-forwarder"))
outcome("proxy-absolute", lambda: via_proxy(
    b"GET http://127.0.0.1:%d/proxy-absolute HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (server, server)))
outcome("proxy-connect", connect_tunnel)
"#;

const ROUTES: [&str; 6] = [
    "ssh",
    "tmux",
    "unix-forwarder",
    "abstract-forwarder",
    "proxy-absolute",
    "proxy-connect",
];

/// Waits up to 10 s for `heard` to name every route in `routes`; what it heard.
fn heard_all(heard: &Mutex<Vec<String>>, routes: &[&str]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = heard.lock().expect("log").clone();
        if routes.iter().all(|r| now.iter().any(|l| l.contains(r))) || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run");
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

#[test]
#[ignore = "privileged: needs root (a login user, sshd, BPF); `cargo xtask test` runs it as root"]
fn privileged_a_login_users_services_run_nothing_for_its_session() {
    assert!(is_root());
    let user = LoginUser::create();
    let home = user.home.clone();
    let dir = shared_dir();
    let reach = write_agent(dir.path(), "reach.py", REACH);
    let agent = write_agent(dir.path(), "agent.py", AGENT);
    let (port, heard) = server();

    // The user may log in with its own key, as after an agent added it to authorized_keys.
    run(user.command("/bin/sh").args([
        "-c",
        "mkdir -p ~/.ssh && ssh-keygen -q -t ed25519 -N '' -f ~/.ssh/id_ed25519 \
         && cp ~/.ssh/id_ed25519.pub ~/.ssh/authorized_keys",
    ]));
    let host_key = dir.path().join("host_key");
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&host_key));
    std::fs::create_dir_all("/run/sshd").expect("sshd's privilege separation directory");
    let sshd_port = free_port();
    let _sshd = service({
        let mut cmd = Command::new("/usr/sbin/sshd");
        cmd.args(["-D", "-e", "-f", "/dev/null", "-o"])
            .arg(format!("ListenAddress=127.0.0.1:{sshd_port}"))
            .arg("-o")
            .arg(format!("HostKey={}", host_key.display()))
            .args(["-o", "PidFile=none", "-o", "UsePAM=no"]);
        cmd
    });
    let tmux_socket = home.join("tmux.sock");
    run(user
        .command("tmux")
        .args(["-f", "/dev/null", "-S"])
        .arg(&tmux_socket)
        .args(["new-session", "-d"]));
    let _tmux = TmuxServer({
        let mut cmd = user.command("tmux");
        cmd.arg("-S").arg(&tmux_socket).arg("kill-server");
        cmd
    });
    let unix_fwd = home.join("forward.sock");
    let abstract_fwd = format!("toolwall-forward-{}", std::process::id());
    let _unix_fwd = service({
        let mut cmd = user.command("socat");
        cmd.arg(format!("UNIX-LISTEN:{},fork", unix_fwd.display()))
            .arg(format!("TCP:127.0.0.1:{port}"));
        cmd
    });
    let _abstract_fwd = service({
        let mut cmd = user.command("socat");
        cmd.arg(format!("ABSTRACT-LISTEN:{abstract_fwd},fork"))
            .arg(format!("TCP:127.0.0.1:{port}"));
        cmd
    });
    let proxy_port = free_port();
    let proxy_conf = dir.path().join("tinyproxy.conf");
    std::fs::write(
        &proxy_conf,
        format!(
            "Port {proxy_port}\nListen 127.0.0.1\nTimeout 30\nAllow 127.0.0.1\nMaxClients 20\n"
        ),
    )
    .expect("tinyproxy.conf");
    let _proxy = service({
        let mut cmd = user.command("tinyproxy");
        cmd.arg("-d").arg("-c").arg(&proxy_conf);
        cmd
    });
    wait_for(&unix_fwd);
    wait_for_port(sshd_port);
    wait_for_port(proxy_port);

    let args: Vec<String> = [
        user.name.clone(),
        reach.display().to_string(),
        port.to_string(),
        sshd_port.to_string(),
        tmux_socket.display().to_string(),
        unix_fwd.display().to_string(),
        abstract_fwd.clone(),
        proxy_port.to_string(),
    ]
    .into();

    let control = user
        .command("/usr/bin/python3")
        .arg(&agent)
        .args(&args)
        .current_dir(dir.path())
        .env("http_proxy", format!("http://127.0.0.1:{proxy_port}"))
        .output()
        .expect("control");
    let (plain, plain_err) = text(&control);
    let control_heard = heard_all(&heard, &ROUTES);
    for route in ROUTES {
        assert!(
            control_heard.iter().any(|l| l.contains(route)),
            "control: {route} reaches the server without toolwall; it heard {control_heard:?}\n{plain}{plain_err}"
        );
    }
    assert!(plain.contains("env http_proxy"), "{plain}");
    heard.lock().expect("log").clear();

    let server_url = format!("http://127.0.0.1:{port}/mcp");
    let daemon = Daemon::start(&format!(
        "sandbox:\n  mcp:\n    servers:\n      - id: tickets\n        type: http\n        url: {server_url}\n        via_proxy: true\n"
    ));
    let out = Command::new(toolwall_bin())
        .args(["exec", "--config"])
        .arg(&daemon.config)
        .args(["--user", &user.name, "--session", "login", "--"])
        .arg("/usr/bin/python3")
        .arg(&agent)
        .args(&args)
        .current_dir(dir.path())
        .env_remove("SUDO_USER")
        .env("http_proxy", format!("http://127.0.0.1:{proxy_port}"))
        .output()
        .expect("exec");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "exec failed: {stderr}\n{stdout}");
    assert!(
        stderr.contains(&user.name) && stderr.contains("tmux"),
        "exec warns that the agent's user runs services outside the session: {stderr}"
    );
    assert!(
        !stdout.contains("env "),
        "proxy variables are dropped: {stdout}"
    );
    // ssh's exit status for a connection it could not make; tmux's for a server it could not
    // reach.
    assert_eq!(outcome(&stdout, "ssh"), "exit 255", "{stdout}");
    assert_eq!(outcome(&stdout, "tmux"), "exit 1", "{stdout}");
    for route in [
        "unix-forwarder",
        "abstract-forwarder",
        "proxy-absolute",
        "proxy-connect",
    ] {
        assert_eq!(outcome(&stdout, route), "EPERM", "{route}: {stdout}");
    }
    std::thread::sleep(Duration::from_secs(1));
    // The daemon itself asks the declared server for its tools; no line of the session's.
    let heard_routes: Vec<String> = heard
        .lock()
        .expect("log")
        .iter()
        .filter(|l| ROUTES.iter().any(|r| l.contains(r)))
        .cloned()
        .collect();
    assert!(
        heard_routes.is_empty(),
        "the server heard the session: {heard_routes:?}\n{stdout}"
    );

    let host_ports = [sshd_port, proxy_port].map(|p| format!("127.0.0.1:{p}"));
    let unix_names = [
        tmux_socket.display().to_string(),
        unix_fwd.display().to_string(),
        format!("@{abstract_fwd}"),
    ];
    let recorded = events(&daemon, "mcp_network_connection", |e| {
        host_ports
            .iter()
            .chain(&unix_names)
            .all(|a| e.iter().any(|e| e["remote_addr"] == a.as_str()))
    });
    for addr in host_ports.iter().chain(&unix_names) {
        let event = recorded
            .iter()
            .find(|e| e["remote_addr"] == addr.as_str())
            .unwrap_or_else(|| panic!("no record of {addr}: {recorded:#?}"));
        assert_eq!(event["action"], "block", "{event}");
        assert_eq!(event["session_id"], "login", "{event}");
        let server = if addr.starts_with("127.") {
            "toolwall:host"
        } else {
            "toolwall:unix"
        };
        assert_eq!(event["server_id"], server, "{event}");
    }
}

/// Stops the user's tmux server on drop.
struct TmuxServer(Command);

impl Drop for TmuxServer {
    fn drop(&mut self) {
        let _ = self.0.output();
    }
}
