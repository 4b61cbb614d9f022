//! No way around the kernel layer from inside a session. Each test goes the user's way —
//! `toolwall run` and `toolwall exec`, with a Python agent inside the session — and tries one
//! way around: the host's own addresses, UDP without `connect()`, leaving the session,
//! detaching its programs, `kill -9` of the daemon, a name that stops resolving.

mod dns;
mod leaving;

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
