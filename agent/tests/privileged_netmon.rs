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
