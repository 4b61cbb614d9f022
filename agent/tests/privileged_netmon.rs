//! The kernel monitor on a real kernel: real cgroups, real connects, real verdicts.
//!
//! Each test makes its own cgroup, loads its own copy of the programs, runs a small Python
//! client inside the cgroup, and checks what the client saw (connected, EPERM, ...) against the
//! events and counters the kernel reported. `cargo xtask test` runs them as root.

use std::{
    collections::HashMap,
    net::{IpAddr, TcpListener},
    process::Command,
};

use aya::maps::{MapData, RingBuf};
use toolwall::{Connect, KernelMonitor, Rule, RuleAction, SessionCgroup};

/// Connects to each `host port` target; prints `pid tid target result` per line, where result
/// is `ok` or the errno name. `thread:` runs the connect in a new thread, `fork:` in a child.
const CLIENT: &str = r#"
import errno, os, socket, sys, threading
def attempt(target):
    host, port = target.rsplit(" ", 1)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect((host, int(port)))
        result = "ok"
    except socket.timeout:
        result = "timeout"
    except OSError as e:
        result = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
    print(os.getpid(), threading.get_native_id(), target, result, flush=True)
for arg in sys.argv[1:]:
    mode, _, target = arg.partition(":")
    if mode == "thread":
        t = threading.Thread(target=attempt, args=(target,)); t.start(); t.join()
    elif mode == "fork":
        pid = os.fork()
        if pid == 0:
            attempt(target); os._exit(0)
        os.waitpid(pid, 0)
    else:
        attempt(target)
"#;

/// One line of the client's report.
#[derive(Debug)]
struct Attempt {
    pid: u32,
    tid: u32,
    result: String,
}

struct Harness {
    name: String,
    cgroup: SessionCgroup,
    monitor: KernelMonitor,
    ring: RingBuf<MapData>,
}

impl Harness {
    fn new(name: &str) -> Self {
        // Load first: a failure then leaves no cgroup behind.
        // Pins of its own (maps included), so that neither a daemon on this host nor another
        // test shares its rules.
        let pin_root = std::path::PathBuf::from(format!(
            "/sys/fs/bpf/toolwall-netmon-{name}-{}",
            std::process::id()
        ));
        let mut monitor = KernelMonitor::load(false, &pin_root).expect("load eBPF programs");
        let cgroup = SessionCgroup::create(&format!("{name}-{}", std::process::id()))
            .expect("create cgroup");
        monitor.attach(name, cgroup.path()).expect("attach");
        let ring = monitor.take_event_ring().expect("event ring");
        Harness {
            name: name.to_owned(),
            cgroup,
            monitor,
            ring,
        }
    }

    /// Runs the client inside the cgroup; returns target → attempt.
    fn client(&self, targets: &[String]) -> HashMap<String, Attempt> {
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(CLIENT).args(targets);
        let _procs = self.cgroup.enter_on_spawn(&mut cmd).unwrap();
        let out = cmd.output().expect("run python3");
        assert!(
            out.status.success(),
            "client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                let target = format!("{} {}", f[2], f[3]);
                (
                    target,
                    Attempt {
                        pid: f[0].parse().unwrap(),
                        tid: f[1].parse().unwrap(),
                        result: f[4].to_string(),
                    },
                )
            })
            .collect()
    }

    fn events(&mut self) -> Vec<Connect> {
        let mut out = Vec::new();
        toolwall::drain_connects(&mut self.ring, &mut |c| out.push(c));
        out
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Leave nothing behind: the pinned links and maps, then the (empty) cgroup.
        let _ = self.monitor.detach(&self.name);
        let _ = self.monitor.pins().remove_if_unused();
        let _ = self.cgroup.remove_if_empty();
    }
}

fn listen(addr: &str) -> (TcpListener, u16) {
    let l = TcpListener::bind(addr).unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_deny_refuses_every_address_form_and_reports_the_right_pid_and_tid() {
    let mut h = Harness::new("deny");
    // A refused connect never reaches a socket, so only the allowed port needs a listener.
    let (_v4, port) = listen("127.0.0.1:0");
    let (_other, other) = listen("127.0.0.1:0");
    h.monitor
        .sync_rules(
            &[Rule::exact(ip("127.0.0.1"), port, 7, RuleAction::Deny)],
            &[],
        )
        .unwrap();

    let targets = [
        format!("127.0.0.1 {port}"),
        format!("::1 {port}"),
        format!("::ffff:127.0.0.1 {port}"),
        format!("127.0.0.2 {port}"),
        format!("0.0.0.0 {port}"),
        format!("127.0.0.1 {other}"),
    ];
    let mut args: Vec<String> = targets.iter().map(|t| format!("main:{t}")).collect();
    args.push(format!("thread:127.0.0.1 {port}"));
    let seen = h.client(&args);
    for t in &targets[..5] {
        assert_eq!(seen[t].result, "EPERM", "{t} must be refused");
    }
    assert_eq!(
        seen[&targets[5]].result, "ok",
        "another port is not covered"
    );

    let events = h.events();
    println!(
        "deny events: {:#?}",
        events
            .iter()
            .map(|e| (e.dest.clone(), e.raw.pid, e.raw.tid, e.denied))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        events.len(),
        6,
        "one event per refused connect (5 + the thread's)"
    );
    let pid = seen[&targets[0]].pid;
    for e in &events {
        assert!(e.denied);
        assert_eq!(e.raw.port, port);
        assert_eq!(e.raw.server_index, 7);
        assert_eq!(e.raw.pid, pid, "pid is the process id (tgid)");
        assert_eq!(e.comm, "python3");
        assert_eq!(e.raw.protocol, 6, "TCP");
        assert_eq!(e.raw.cgroup_id, h.cgroup.id().unwrap());
    }
    // The connect from the second thread: same pid, its own tid.
    let threaded = events.last().unwrap();
    assert_ne!(
        threaded.raw.tid, threaded.raw.pid,
        "tid is the thread id, not the pid"
    );
    let thread_attempt = seen
        .values()
        .map(|a| a.tid)
        .find(|&tid| tid != pid)
        .expect("the thread reported");
    assert_eq!(
        threaded.raw.tid, thread_attempt,
        "the tid the thread itself reported"
    );
    let main_thread = &events[0];
    assert_eq!(main_thread.raw.tid, main_thread.raw.pid);
    assert_eq!(h.monitor.counters().unwrap().denied, 6);

    // A process outside the cgroup is unaffected by the same rule.
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("outside the cgroup: allowed");
    assert!(h.events().is_empty(), "and not reported");
}

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_flag_lets_the_connect_through_and_records_it_also_from_forked_children() {
    let mut h = Harness::new("flag");
    let (_l, port) = listen("127.0.0.1:0");
    h.monitor
        .sync_rules(
            &[Rule::exact(ip("127.0.0.1"), port, 2, RuleAction::Flag)],
            &[],
        )
        .unwrap();
    let target = format!("127.0.0.1 {port}");
    let seen = h.client(&[format!("main:{target}"), format!("fork:{target}")]);
    assert_eq!(seen[&target].result, "ok");
    let events = h.events();
    assert_eq!(
        events.len(),
        2,
        "the parent's and the forked child's connect"
    );
    assert!(
        events
            .iter()
            .all(|e| !e.denied && e.raw.server_index == 2 && e.raw.port == port)
    );
    assert_ne!(
        events[0].raw.pid, events[1].raw.pid,
        "the fork is another process, still covered"
    );
    assert_eq!(h.monitor.counters().unwrap().flagged, 2);
}

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_rules_changed_at_run_time_take_effect_on_the_next_connect() {
    let mut h = Harness::new("update");
    let (_l, port) = listen("127.0.0.1:0");
    let target = format!("127.0.0.1 {port}");
    let arg = [format!("main:{target}")];

    h.monitor
        .sync_rules(
            &[Rule::exact(ip("127.0.0.1"), port, 1, RuleAction::Deny)],
            &[],
        )
        .unwrap();
    assert_eq!(h.client(&arg)[&target].result, "EPERM", "added");
    h.monitor
        .sync_rules(
            &[Rule::exact(ip("127.0.0.1"), port, 1, RuleAction::Flag)],
            &[],
        )
        .unwrap();
    assert_eq!(h.client(&arg)[&target].result, "ok", "changed to flag");
    h.monitor.sync_rules(&[], &[]).unwrap();
    assert_eq!(h.client(&arg)[&target].result, "ok", "removed");
    let events = h.events();
    assert_eq!(
        events.iter().map(|e| e.denied).collect::<Vec<_>>(),
        [true, false],
        "no event once removed"
    );
    assert_eq!(h.monitor.counters().unwrap().unmatched, 1);
}

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_cidr_rule_catches_its_range_only() {
    let mut h = Harness::new("cidr");
    // TEST-NET-2: never routed here; a refused connect is EPERM, an unrefused one fails otherwise.
    let rule = Rule {
        addr: ip("198.51.100.0"),
        prefix: 24,
        port: 0,
        server_index: 4,
        action: RuleAction::Deny,
    };
    h.monitor.sync_rules(&[rule], &[]).unwrap();
    let inside = "198.51.100.77 443".to_string();
    let outside = "198.51.101.77 443".to_string();
    let seen = h.client(&[format!("main:{inside}"), format!("main:{outside}")]);
    assert_eq!(seen[&inside].result, "EPERM");
    assert_ne!(
        seen[&outside].result, "EPERM",
        "outside the range: not refused by us ({})",
        seen[&outside].result
    );
    let events = h.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].dest.to_string(), "198.51.100.77:443");
}

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_a_flood_is_summarised_in_the_kernel_and_loses_nothing_silently() {
    let mut h = Harness::new("flood");
    let port = 9;
    h.monitor
        .sync_rules(
            &[Rule::exact(ip("127.0.0.1"), port, 0, RuleAction::Flag)],
            &[],
        )
        .unwrap();
    // More connects than one key's burst (64 per CPU per second) and than the 256 KiB ring
    // holds, with nobody reading until the end. UDP connect() runs the same hook and needs no
    // peer.
    let n = 4000;
    let script = format!(
        "import socket\nfor _ in range({n}):\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('127.0.0.1', {port})); s.close()\n"
    );
    let mut cmd = Command::new("python3");
    cmd.args(["-c", &script]);
    let _procs = h.cgroup.enter_on_spawn(&mut cmd).unwrap();
    assert!(cmd.status().unwrap().success());
    let events = h.events();
    assert!(
        events.iter().all(|e| e.raw.protocol == 17),
        "UDP connects are reported as UDP"
    );
    let read = events.len() as u64;
    let counters = h.monitor.counters().unwrap();
    let summaries = h.monitor.summaries().unwrap();
    let summarised: u64 = summaries.iter().map(|(_, s)| s.summarised).sum();
    println!(
        "flood: {n} flagged connects, {read} events read, {summarised} summarised, {} dropped",
        counters.ring_drops
    );
    assert_eq!(counters.flagged, n);
    assert!(summarised > 0, "the flood was summarised");
    assert_eq!(summarised, counters.summarised);
    assert_eq!(counters.ring_drops, 0, "nothing lost");
    assert_eq!(
        read + summarised,
        n,
        "every connect delivered as an event or counted in a summary"
    );
    assert_eq!(summaries.len(), 1, "one key: one session, server, verdict");
    assert!(h.events().is_empty());
}

/// Connects (stream) or sends (dgram) to each `KIND:HEX` address, with exactly the bytes of
/// `sun_path` given and an address length that counts them (through libc: Python's own socket
/// calls add a NUL and refuse 108-byte pathnames); prints `INDEX RESULT`.
const UNIX_CLIENT: &str = r#"
import ctypes, errno, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
for i, arg in enumerate(sys.argv[1:]):
    kind, _, hexed = arg.partition(":")
    path = bytes.fromhex(hexed)
    address = ctypes.create_string_buffer(2 + 108)
    address[0:2] = socket.AF_UNIX.to_bytes(2, sys.byteorder)
    address[2:2 + len(path)] = path
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM if kind == "dgram" else socket.SOCK_STREAM)
    if kind == "dgram":
        rc = libc.sendto(s.fileno(), b"x", 1, 0, address, 2 + len(path))
    else:
        rc = libc.connect(s.fileno(), address, 2 + len(path))
    s.close()
    code = ctypes.get_errno()
    print(i, "ok" if rc >= 0 else errno.errorcode.get(code, str(code)), flush=True)
"#;

/// Which socket each spelling reaches is the kernel's to say: every spelling of a listed name
/// (with or without its NUL, zero-padded to the whole `sun_path`, bytes after the NUL) is let
/// through, every spelling of another name is refused and recorded under that name, and names
/// that differ only in their last byte of 108, in a NUL at the end of an abstract name, or in
/// a NUL inside one, are told apart. The control connects every spelling from outside the
/// session, to show each reaches a live socket.
#[test]
#[ignore = "privileged: needs root and BPF (Linux 6.7); `cargo xtask test` runs it as root"]
fn privileged_unix_names_are_read_as_the_kernel_resolves_them() {
    let mut h = Harness::new("unixnames");
    if h.monitor.unix_missing().is_some() {
        panic!(
            "this kernel has no Unix socket hooks: {:?}",
            h.monitor.unix_missing()
        );
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name).into_os_string().into_encoded_bytes();
    let listed = path("listed.sock");
    let other = path("other.sock");
    let dgram = path("listed.dgram");
    let other_dgram = path("other.dgram");
    // Two 108-byte pathnames (no room for a NUL) that differ in their last byte only.
    let long = |last: u8| {
        let mut p = path("");
        p.resize(107, b'l');
        p.push(last);
        p
    };
    let (long_listed, long_other) = (long(b'a'), long(b'b'));
    let tag = std::process::id().to_string().into_bytes();
    let abstract_name = |parts: &[&[u8]]| {
        let mut name = vec![0u8];
        name.extend_from_slice(b"toolwall-");
        name.extend_from_slice(&tag);
        for part in parts {
            name.extend_from_slice(part);
        }
        name
    };
    let abstract_listed = abstract_name(&[]);
    let abstract_trailing_nul = abstract_name(&[b"\0"]);
    let abstract_inner_nul = abstract_name(&[b"\0x"]);

    let mut held = Vec::new();
    for name in [
        &listed,
        &other,
        &long_listed,
        &long_other,
        &abstract_listed,
        &abstract_trailing_nul,
        &abstract_inner_nul,
    ] {
        held.push(unix_socket(libc::SOCK_STREAM, name));
    }
    for name in [&dgram, &other_dgram] {
        held.push(unix_socket(libc::SOCK_DGRAM, name));
    }

    let spellings = |name: &Vec<u8>| {
        let mut with_nul = name.clone();
        with_nul.push(0);
        let mut padded = name.clone();
        padded.resize(108, 0);
        let mut trailing = with_nul.clone();
        trailing.extend_from_slice(b"junk");
        [name.clone(), with_nul, padded, trailing]
    };
    let of = |bytes: &[u8]| agent_common::unix::UnixName::of(bytes).expect("fits");
    h.monitor
        .sync_unix_listed(&[
            of(&listed),
            of(&long_listed),
            of(&abstract_listed),
            of(&dgram),
        ])
        .unwrap();

    // (kind, address bytes, reached, the name a refusal is recorded under)
    let mut cases: Vec<(&str, Vec<u8>, bool, Vec<u8>)> = Vec::new();
    for spelling in spellings(&listed) {
        cases.push(("stream", spelling, true, listed.clone()));
    }
    for spelling in spellings(&other) {
        cases.push(("stream", spelling, false, other.clone()));
    }
    for spelling in spellings(&dgram) {
        cases.push(("dgram", spelling, true, dgram.clone()));
    }
    for spelling in spellings(&other_dgram) {
        cases.push(("dgram", spelling, false, other_dgram.clone()));
    }
    cases.push(("stream", long_listed.clone(), true, long_listed.clone()));
    cases.push(("stream", long_other.clone(), false, long_other.clone()));
    cases.push((
        "stream",
        abstract_listed.clone(),
        true,
        abstract_listed.clone(),
    ));
    for name in [&abstract_trailing_nul, &abstract_inner_nul] {
        cases.push(("stream", name.clone(), false, name.clone()));
    }
    let args: Vec<String> = cases
        .iter()
        .map(|(kind, bytes, _, _)| {
            let hexed: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            format!("{kind}:{hexed}")
        })
        .collect();
    let run = |inside: bool| -> Vec<String> {
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(UNIX_CLIENT).args(&args);
        let _procs = inside.then(|| h.cgroup.enter_on_spawn(&mut cmd).unwrap());
        let out = cmd.output().expect("run python3");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.split_once(' ').expect("INDEX RESULT").1.to_owned())
            .collect()
    };
    let control = run(false);
    assert!(
        control.iter().all(|r| r == "ok"),
        "control: every spelling reaches a socket outside the session: {control:?}"
    );
    let seen = run(true);
    assert_eq!(seen.len(), cases.len());
    for ((kind, bytes, reached, _), result) in cases.iter().zip(&seen) {
        let expected = if *reached { "ok" } else { "EPERM" };
        assert_eq!(
            result,
            expected,
            "{kind} {:?}",
            bytes.escape_ascii().to_string()
        );
    }
    let mut refused: Vec<String> = cases
        .iter()
        .filter(|c| !c.2)
        .map(|(_, _, _, name)| {
            let name = agent_common::unix::UnixName::of(name).unwrap();
            display(name.bytes())
        })
        .collect();
    let mut recorded: Vec<String> = h.events().iter().map(|e| e.dest.to_string()).collect();
    refused.sort();
    recorded.sort();
    assert_eq!(
        recorded, refused,
        "one event per refusal, under the name the kernel resolved"
    );
    drop(held);
}

/// A Unix socket bound to exactly `name` (its length is the address's), listening if a stream
/// socket. Built by hand: the standard library refuses a 108-byte pathname, which the kernel
/// takes.
fn unix_socket(kind: i32, name: &[u8]) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: plain system calls on a socket this function owns; the address is a zeroed
    // sockaddr_un with at most its sun_path's length written.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, kind, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let socket = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut address: libc::sockaddr_un = std::mem::zeroed();
        address.sun_family = libc::AF_UNIX as libc::sa_family_t;
        assert!(name.len() <= address.sun_path.len());
        for (slot, &b) in address.sun_path.iter_mut().zip(name) {
            *slot = b as libc::c_char;
        }
        let len = (2 + name.len()) as libc::socklen_t;
        let rc = libc::bind(fd, (&raw const address).cast(), len);
        assert_eq!(
            rc,
            0,
            "bind {:?}: {}",
            name.escape_ascii().to_string(),
            std::io::Error::last_os_error()
        );
        if kind == libc::SOCK_STREAM {
            assert_eq!(libc::listen(fd, 64), 0);
        }
        socket
    }
}

/// The record's form of a Unix name (`@` for an abstract one, `\0`-escaped bytes).
fn display(bytes: &[u8]) -> String {
    match bytes.split_first() {
        Some((0, rest)) => format!("@{}", rest.escape_ascii()),
        _ => bytes.escape_ascii().to_string(),
    }
}
