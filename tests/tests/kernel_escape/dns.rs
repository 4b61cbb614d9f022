//! Names: a name that stops resolving keeps its deny, DNS to a resolver not allowed is flagged
//! or denied, and a changed address is denied once its TTL ran out.

use super::*;

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
