//! A session is a boundary: from inside `toolwall exec --user nobody`, the host itself and the
//! networks around it are out of reach except what toolwall lets through (the LLM proxy,
//! declared servers the policy allows, ports the session bound itself, `netmon.egress.allow`),
//! and no session can take a port toolwall or a declared server listens on, even while the
//! daemon is down. Each route is first taken without toolwall (the control), so a refusal is
//! shown to be toolwall's, and every refusal is in the record.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::Command,
    time::Duration,
};

use toolwall_tests::{
    Daemon, free_port, is_root,
    session::{events, exec, exec_nobody, shared_dir, text, without_toolwall, write_agent},
};

/// A veth pair with a private address of this host on one end: the backend a published port
/// forwards to (the docker-proxy model), and a subnet with a broadcast address. Removed on drop.
struct Lan {
    name: &'static str,
}

impl Lan {
    fn new(name: &'static str, cidr: &str) -> Lan {
        let _ = Command::new("ip").args(["link", "del", name]).output();
        let peer = format!("{name}-p");
        for args in [
            vec!["link", "add", name, "type", "veth", "peer", "name", &peer],
            vec!["addr", "add", cidr, "dev", name],
            vec!["link", "set", &peer, "up"],
        ] {
            let out = Command::new("ip").args(&args).output().expect("ip");
            assert!(out.status.success(), "ip {args:?}: {out:?}");
        }
        // Its link-local address usable at once (for multicast to `ff02::1%NAME`), not after
        // duplicate address detection.
        std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/accept_dad"), "0")
            .expect("accept_dad");
        let out = Command::new("ip")
            .args(["link", "set", name, "up"])
            .output()
            .expect("ip");
        assert!(out.status.success(), "ip link set {name} up: {out:?}");
        Lan { name }
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", self.name]).output();
    }
}

/// A prefix routed to this host (`ip route add local NET dev lo`): every address in it reaches
/// the host's listeners. Removed on drop.
struct LocalRoute {
    net: &'static str,
}

impl LocalRoute {
    fn new(net: &'static str) -> LocalRoute {
        let out = Command::new("ip")
            .args(["route", "add", "local", net, "dev", "lo"])
            .output()
            .expect("ip route");
        assert!(out.status.success(), "ip route add local {net}: {out:?}");
        LocalRoute { net }
    }
}

impl Drop for LocalRoute {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args([
                "route", "del", "local", self.net, "dev", "lo", "table", "local",
            ])
            .output();
    }
}

/// A server that accepts and closes, on `addr` (port 0: any); returns its port.
fn listener(addr: &str) -> u16 {
    let socket = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    let port = socket.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in socket.incoming() {
            drop(stream);
        }
    });
    port
}

/// A published port: a listener on `127.0.0.1` that copies each connection to `backend`.
fn forwarder(backend: String) -> u16 {
    let socket = TcpListener::bind("127.0.0.1:0").expect("bind forwarder");
    let port = socket.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for client in socket.incoming().flatten() {
            if let Ok(mut upstream) = TcpStream::connect(&backend) {
                let mut client = client;
                let mut buf = [0u8; 1024];
                if let Ok(n) = client.read(&mut buf) {
                    let _ = upstream.write_all(&buf[..n]);
                }
            }
        }
    });
    port
}

/// Takes each `KIND ADDR PORT` of its arguments and prints `KIND ADDR PORT RESULT`: `tcp` is a
/// connect, `udp` a datagram sent with `sendto` (broadcast allowed on the socket), `own` binds
/// `127.0.0.1:0`, connects to what it bound, then connects again after closing it. `viaudp` and
/// `via2` first hold the port themselves another way (a UDP socket on it; a TCP socket bound to
/// `127.0.0.2`), then connect over TCP to `ADDR:PORT`, a host service's. `ownudp` connects a
/// UDP socket to a UDP socket of its own (an own UDP service is not let through: a connected
/// UDP socket is checked only at its connect).
const PROBE: &str = r#"
import errno, socket, sys
def outcome(f):
    try:
        f()
        return "THROUGH"
    except PermissionError:
        return "EPERM"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def family(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET
def target(addr, port):
    if "%" in addr:
        return socket.getaddrinfo(addr, port, family(addr), socket.SOCK_DGRAM)[0][4]
    return (addr, port)
def tcp(addr, port):
    s = socket.socket(family(addr))
    s.settimeout(1)
    try:
        s.connect(target(addr, port))
    finally:
        s.close()
def udp(addr, port):
    s = socket.socket(family(addr), socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    try:
        s.sendto(b"x", target(addr, port))
    finally:
        s.close()
args = sys.argv[1:]
for i in range(0, len(args), 3):
    kind, addr, port = args[i], args[i + 1], int(args[i + 2])
    if kind == "own":
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        bound = server.getsockname()[1]
        print("own", addr, "bound", outcome(lambda: tcp("127.0.0.1", bound)), flush=True)
        server.close()
        print("own", addr, "closed", outcome(lambda: tcp("127.0.0.1", bound)), flush=True)
        continue
    if kind == "ownudp":
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        server.bind(("127.0.0.1", 0))
        bound = server.getsockname()[1]
        def connected():
            client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                client.connect(("127.0.0.1", bound))
                client.send(b"x")
            finally:
                client.close()
        print(kind, addr, port, outcome(connected), flush=True)
        server.close()
        continue
    if kind in ("viaudp", "via2"):
        held = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if kind == "viaudp" else socket.SOCK_STREAM)
        held.bind(("0.0.0.0" if kind == "viaudp" else "127.0.0.2", port))
        print(kind, addr, port, outcome(lambda: tcp(addr, port)), flush=True)
        held.close()
        continue
    print(kind, addr, port, outcome(lambda: (tcp if kind == "tcp" else udp)(addr, port)), flush=True)
"#;

fn probe_args(cases: &[(&str, String, u16)]) -> Vec<String> {
    cases
        .iter()
        .flat_map(|(kind, addr, port)| [kind.to_string(), addr.clone(), port.to_string()])
        .collect()
}

fn outcome_of(stdout: &str, kind: &str, addr: &str, port: u16) -> String {
    let head = format!("{kind} {addr} {port} ");
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&head))
        .unwrap_or_else(|| panic!("no {head:?} in:\n{stdout}"))
        .to_owned()
}

#[test]
#[ignore = "privileged: needs root, BPF and a veth pair; `cargo xtask test` runs it as root"]
fn privileged_a_session_reaches_neither_the_host_nor_the_networks_around_it() {
    assert!(is_root());
    let _lan = Lan::new("twb-host", "10.213.1.1/24");
    // An address given a broadcast address of its own, and a prefix routed to the host.
    let out = Command::new("ip")
        .args([
            "addr",
            "add",
            "203.0.113.1/24",
            "broadcast",
            "203.0.113.77",
            "dev",
            "twb-host",
        ])
        .output()
        .expect("ip addr");
    assert!(out.status.success(), "{out:?}");
    let _routed = LocalRoute::new("198.18.77.0/24");
    let service = listener("[::]:0");
    let backend = listener("10.213.1.1:0");
    let published = forwarder(format!("10.213.1.1:{backend}"));
    // Dual-stack: without toolwall it answers on every local address.
    let allowed = listener("[::]:0");
    let daemon = Daemon::start(&format!(
        "sandbox:\n  mcp:\n    servers:\n      - id: published\n        type: http\n        url: http://127.0.0.1:{published}/mcp\n      - id: allowed\n        type: http\n        url: http://127.0.0.1:{allowed}/mcp\n"
    ));
    let proxy = daemon.proxy.clone().expect("the LLM proxy's address");
    let proxy_port: u16 = proxy
        .rsplit(':')
        .next()
        .expect("port")
        .parse()
        .expect("port");
    // Another service on the proxy's port, at another address of the host.
    listener(&format!("10.213.1.1:{proxy_port}"));

    // What a host service looks like from a session, in every form of the host's address.
    let only_loopback = listener("127.0.0.1:0");
    let refused_tcp: Vec<(&str, String, u16)> = [
        "127.0.0.1",
        "127.9.9.9",
        "::1",
        "::ffff:127.0.0.1",
        "0.0.0.0",
        "::",
        "10.213.1.1",
        "198.18.77.5",
    ]
    .into_iter()
    .map(|a| ("tcp", a.to_owned(), service))
    .chain([("tcp", "10.213.1.1".to_owned(), backend)])
    // Holding the port number another way opens nothing of the host.
    .chain([("viaudp", "127.0.0.1".to_owned(), service)])
    .chain([("via2", "127.0.0.1".to_owned(), only_loopback)])
    .chain([("ownudp", "-".to_owned(), 0)])
    .collect();
    let refused_udp: Vec<(&str, String, u16)> = [
        "255.255.255.255",
        "10.213.1.255",
        "224.0.0.1",
        "127.0.0.1",
        "ff02::1%twb-host",
        "203.0.113.77",
    ]
    .into_iter()
    .map(|a| ("udp", a.to_owned(), service))
    .collect();
    let through: Vec<(&str, String, u16)> = vec![
        ("tcp", "127.0.0.1".to_owned(), published),
        ("tcp", "127.0.0.1".to_owned(), allowed),
        ("tcp", "127.0.0.1".to_owned(), proxy_port),
    ];
    // Let through at the address they were declared at, not at the host's others.
    let refused_tcp: Vec<(&str, String, u16)> = refused_tcp
        .into_iter()
        .chain([
            ("tcp", "::1".to_owned(), allowed),
            ("tcp", "10.213.1.1".to_owned(), proxy_port),
        ])
        .collect();
    let mut cases = refused_tcp.clone();
    cases.extend(refused_udp.clone());
    cases.extend(through.clone());
    let dir = shared_dir();
    let agent = write_agent(dir.path(), "probe.py", PROBE);
    let mut args = probe_args(&cases);
    args.extend(["own", "-", "0"].map(str::to_owned));

    let control = without_toolwall(&agent, &args);
    let (plain, _) = text(&control);
    for (kind, addr, port) in &cases {
        assert_eq!(
            outcome_of(&plain, kind, addr, *port),
            "THROUGH",
            "control: {kind} {addr}:{port} works without toolwall\n{plain}"
        );
    }

    let stdout = exec_nobody(&daemon, "boundary", &agent, &args);
    for (kind, addr, port) in refused_tcp.iter().chain(&refused_udp) {
        assert_eq!(
            outcome_of(&stdout, kind, addr, *port),
            "EPERM",
            "{kind} {addr}:{port} from the session\n{stdout}"
        );
    }
    for (kind, addr, port) in &through {
        assert_eq!(
            outcome_of(&stdout, kind, addr, *port),
            "THROUGH",
            "{kind} {addr}:{port} from the session\n{stdout}"
        );
    }
    assert!(
        stdout.contains("own - bound THROUGH") && stdout.contains("own - closed EPERM"),
        "the session reaches the port it holds, and only while it holds it:\n{stdout}"
    );

    let refused = refused_tcp.len() + refused_udp.len() + 1;
    let recorded = events(&daemon, "mcp_network_connection", |e| {
        e.iter().filter(|e| e["action"] == "block").count() >= refused
    });
    let blocked: Vec<&serde_json::Value> = recorded
        .iter()
        .filter(|e| e["action"] == "block" && e["session_id"] == "boundary")
        .collect();
    assert_eq!(blocked.len(), refused, "{recorded:#?}");
    for event in &blocked {
        let server = event["server_id"].as_str().unwrap_or_default();
        assert!(
            server == "toolwall:host" || server == "toolwall:local-network",
            "{event}"
        );
    }
    assert!(
        blocked
            .iter()
            .any(|e| e["server_id"] == "toolwall:local-network"
                && e["remote_addr"] == "255.255.255.255:".to_owned() + &service.to_string()),
        "{blocked:#?}"
    );
    assert!(
        recorded
            .iter()
            .any(|e| e["server_id"] == "allowed" && e["action"] == "allow"),
        "an allowed declared server is reached and recorded as such: {recorded:#?}"
    );
}

/// Binds `127.0.0.1:PORT` and `0.0.0.0:PORT` (with `SO_REUSEADDR`) for each of the
/// comma-separated ports, every 20 ms for the given seconds; prints `BOUND ADDR PORT` if it
/// ever holds one, then the errors it got, by name.
const SQUAT: &str = r#"
import errno, socket, sys, time
ports, seconds = [int(p) for p in sys.argv[1].split(",")], float(sys.argv[2])
seen = {}
end = time.time() + seconds
while time.time() < end:
    for port in ports:
        for addr in ("127.0.0.1", "0.0.0.0"):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((addr, port))
                s.listen()
                print("BOUND", addr, port, flush=True)
                s.close()
                sys.exit(0)
            except OSError as e:
                name = errno.errorcode.get(e.errno, str(e.errno))
                seen[name] = seen.get(name, 0) + 1
            s.close()
    time.sleep(0.02)
print("errors", " ".join("%s=%d" % kv for kv in sorted(seen.items())), flush=True)
"#;

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_session_cannot_take_the_proxy_port_while_the_daemon_restarts() {
    assert!(is_root());
    let port = free_port();
    // A filter proxy the configuration lets sessions reach, down (restarting) meanwhile.
    let filter = free_port();
    let dir = shared_dir();
    let agent = write_agent(dir.path(), "squat.py", SQUAT);
    for free in [port, filter] {
        let control = without_toolwall(&agent, &[free.to_string(), "1".into()]);
        assert!(
            text(&control).0.contains("BOUND"),
            "control: the free port {free} is taken without toolwall: {control:?}"
        );
    }

    let mut daemon = Daemon::start(&format!(
        "proxy:\n  listen: 127.0.0.1:{port}\nnetmon:\n  egress:\n    allow: [\"127.0.0.1:{filter}\"]\n"
    ));
    // Kept from every port the kernel picks itself (a listen() without bind() never gets it).
    // In one read: the kernel's handler does not continue a read where an earlier one stopped.
    let mut buf = vec![0u8; 1 << 20];
    let got = std::io::Read::read(
        &mut std::fs::File::open("/proc/sys/net/ipv4/ip_local_reserved_ports").expect("sysctl"),
        &mut buf,
    )
    .expect("read sysctl");
    let reserved = String::from_utf8_lossy(&buf[..got]).into_owned();
    let listed = |p: u16| {
        reserved.trim().split(',').any(|part| {
            let (low, high) = part.split_once('-').unwrap_or((part, part));
            (low.parse().unwrap_or(u16::MAX)..=high.parse().unwrap_or(0)).contains(&p)
        })
    };
    for reserved_port in [port, filter] {
        assert!(
            listed(reserved_port),
            "{reserved_port} not in ip_local_reserved_ports {reserved:?}"
        );
    }
    let squatter = exec(
        &daemon,
        &["--user", "nobody", "--session", "squatter"],
        &agent,
        &[format!("{port},{filter}"), "8".into()],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("exec");
    std::thread::sleep(Duration::from_secs(1));
    // Killed: the port is free for as long as no daemon holds it; the session's programs stay.
    daemon.kill9();
    std::thread::sleep(Duration::from_secs(2));
    daemon.relaunch("stderr-after");
    assert_eq!(
        daemon.proxy.as_deref(),
        Some(format!("http://127.0.0.1:{port}").as_str()),
        "the restarted daemon holds its port: {}",
        std::fs::read_to_string(daemon.dir.path().join("stderr-after")).unwrap_or_default()
    );
    let out = squatter.wait_with_output().expect("wait");
    let (stdout, stderr) = text(&out);
    assert!(
        !stdout.contains("BOUND"),
        "the session took the port:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("EPERM="),
        "binds refused by toolwall while the daemon was down:\n{stdout}"
    );
    let bind_refused = |e: &serde_json::Value, owner: &str| {
        e["protocol"] == "tcp-bind"
            && e["action"] == "block"
            && e["server_id"] == owner
            && e["session_id"] == "squatter"
    };
    let owners = ["toolwall:llm-proxy", "netmon.egress.allow"];
    let recorded = events(&daemon, "mcp_network_connection", |e| {
        owners
            .iter()
            .all(|owner| e.iter().any(|e| bind_refused(e, owner)))
    });
    for owner in owners {
        assert!(
            recorded.iter().any(|e| bind_refused(e, owner)),
            "the refused binds on {owner}'s port are in the record, adopted from the ring: {recorded:#?}"
        );
    }
}

#[test]
#[ignore = "privileged: needs root, BPF and a veth pair; `cargo xtask test` runs it as root"]
fn privileged_allowlist_mode_refuses_every_destination_not_listed() {
    assert!(is_root());
    let _lan = Lan::new("twb-allow", "10.213.3.1/24");
    let listed = listener("10.213.3.1:0");
    let other = listener("10.213.3.1:0");
    let daemon = Daemon::start(&format!(
        "netmon:\n  egress:\n    mode: allowlist\n    allow:\n      - 10.213.3.1:{listed}\n"
    ));
    // A destination off this host: unroutable here, so without toolwall the connect fails
    // otherwise (no route, or a time-out), never with EPERM.
    let away = ("tcp", "198.18.0.1".to_owned(), 443);
    let cases = vec![
        ("tcp", "10.213.3.1".to_owned(), listed),
        ("tcp", "10.213.3.1".to_owned(), other),
        away.clone(),
    ];
    let dir = shared_dir();
    let agent = write_agent(dir.path(), "probe.py", PROBE);
    let args = probe_args(&cases);
    let (plain, _) = text(&without_toolwall(&agent, &args));
    assert_eq!(outcome_of(&plain, "tcp", "10.213.3.1", other), "THROUGH");
    assert_ne!(outcome_of(&plain, away.0, &away.1, away.2), "EPERM");

    let stdout = exec_nobody(&daemon, "listed", &agent, &args);
    assert_eq!(outcome_of(&stdout, "tcp", "10.213.3.1", listed), "THROUGH");
    assert_eq!(outcome_of(&stdout, "tcp", "10.213.3.1", other), "EPERM");
    assert_eq!(outcome_of(&stdout, away.0, &away.1, away.2), "EPERM");
    let recorded = events(&daemon, "mcp_network_connection", |e| {
        e.iter().any(|e| e["server_id"] == "toolwall:unlisted")
    });
    assert!(
        recorded
            .iter()
            .any(|e| e["server_id"] == "toolwall:unlisted"
                && e["remote_addr"] == "198.18.0.1:443"
                && e["action"] == "block"),
        "{recorded:#?}"
    );
}

#[test]
fn a_daemon_that_cannot_bind_its_port_names_who_holds_it() {
    let held = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = held.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("toolwall.yaml");
    std::fs::write(
        &config,
        format!(
            "api:\n  listen: 127.0.0.1:0\n  socket: {}\nstore:\n  path: {}\nproxy:\n  listen: 127.0.0.1:{port}\nnetmon:\n  enabled: false\n",
            dir.path().join("api.sock").display(),
            dir.path().join("events.db").display()
        ),
    )
    .expect("write config");
    let out = Command::new(toolwall_tests::toolwall_bin())
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .expect("toolwall run");
    let (_, stderr) = text(&out);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{port}"))
            && stderr.contains(&format!("held by pid {}", std::process::id())),
        "the error names the process that holds the port: {stderr}"
    );
}
