//! `cargo xtask bench`: every number is printed next to a baseline measured in the same run, and
//! as a ratio, because absolute times on a shared 2-core machine say little.
//!
//! Run one group with `cargo bench -p agent --bench toolwall -- GROUP` (connect, store).

use std::{
    net::{TcpListener, TcpStream},
    time::{Duration, Instant},
};

use toolwall::{
    cgroup::{SessionCgroup, cgroup2_mount},
    decision::Action,
    events::{Event, Store, ToolCalled},
    netmon::{KernelMonitor, Rule, RuleAction},
};

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    if wanted("connect") {
        bench_connect();
    }
    if wanted("store") {
        bench_store();
    }
    if wanted("policy") {
        bench_policy();
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn percentile(mut samples: Vec<Duration>, p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p) as usize]
}

/// ns per loopback TCP connect: no program, program attached with no match, FLAG match.
/// Goal (issue 3): under 1 µs added per connect.
fn bench_connect() {
    println!(
        "== connect(): cost of the kernel layer per connect (loopback TCP, median of each connect)"
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("   SKIPPED: needs root (loads eBPF programs and moves itself into a cgroup)");
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    // The three cases take turns, round after round, so the noise of a shared machine falls on
    // all of them alike; the ring is drained every round so FLAG never measures a full ring.
    const ROUNDS: usize = 20;
    const PER_ROUND: usize = 200;
    const N: usize = ROUNDS * PER_ROUND;
    let connect_times = |out: &mut Vec<Duration>| {
        for _ in 0..PER_ROUND {
            let start = Instant::now();
            let s = TcpStream::connect(addr).unwrap();
            out.push(start.elapsed());
            drop(s);
        }
    };
    let root_procs = cgroup2_mount().unwrap().join("cgroup.procs");
    let cgroup = SessionCgroup::create(&format!("bench-{}", std::process::id())).unwrap();
    let mut monitor = KernelMonitor::load(false).unwrap();
    monitor.attach(cgroup.path()).unwrap();
    let mut ring = monitor.take_event_ring().unwrap();
    let flag = [Rule::exact(addr.ip(), addr.port(), 0, RuleAction::Flag)];
    let (mut none, mut nomatch, mut flagged) = (Vec::new(), Vec::new(), Vec::new());
    let mut events = 0;
    let me = std::process::id().to_string();
    connect_times(&mut Vec::new()); // warm-up
    for _ in 0..ROUNDS {
        std::fs::write(&root_procs, &me).unwrap();
        connect_times(&mut none);
        cgroup.add_process(std::process::id()).unwrap();
        monitor.sync_rules(&[]).unwrap();
        connect_times(&mut nomatch);
        monitor.sync_rules(&flag).unwrap();
        connect_times(&mut flagged);
        toolwall::netmon::events::drain(&mut ring, &mut |_| events += 1);
    }
    // Back to the root cgroup, so the session cgroup can go.
    std::fs::write(&root_procs, &me).unwrap();
    let counters = monitor.counters().unwrap();
    drop(monitor);
    cgroup.remove_if_empty().unwrap();
    let (none, none99) = (median(none.clone()), percentile(none, 0.99));
    let (nomatch, nomatch99) = (median(nomatch.clone()), percentile(nomatch, 0.99));
    let (flag, flag99) = (median(flagged.clone()), percentile(flagged, 0.99));

    let ns = |d: Duration| d.as_nanos() as f64;
    println!(
        "   no program          {:>8.0} ns  (p99 {:>8.0} ns)  1.00x",
        ns(none),
        ns(none99)
    );
    println!(
        "   attached, no match  {:>8.0} ns  (p99 {:>8.0} ns)  {:.2}x  added {:+.0} ns",
        ns(nomatch),
        ns(nomatch99),
        ns(nomatch) / ns(none),
        ns(nomatch) - ns(none)
    );
    println!(
        "   FLAG match + event  {:>8.0} ns  (p99 {:>8.0} ns)  {:.2}x  added {:+.0} ns",
        ns(flag),
        ns(flag99),
        ns(flag) / ns(none),
        ns(flag) - ns(none)
    );
    println!(
        "   ({N} connects each; {} flagged, {events} events read, {} dropped; goal: < 1000 ns added)",
        counters.flagged, counters.ring_drops
    );
}

fn event(i: usize) -> Event {
    Event::McpToolCalled(ToolCalled {
        timestamp: chrono::Utc::now(),
        session_id: "bench".into(),
        server_id: "everything".into(),
        server_type: "stdio".into(),
        tool_name: format!("tool{}", i % 50),
        jsonrpc_id: serde_json::json!(i),
        input: Some(serde_json::json!({"message": "hello", "n": i})),
        action: Action::Allow,
        reason: String::new(),
        layer: "shim".into(),
    })
}

/// Events per second into SQLite: batched (the writer's way) vs one transaction per event.
/// Goal (issue 4): over 50,000 events/s batched.
fn bench_store() {
    println!("== event store: events per second into SQLite (WAL)");
    let dir = tempfile::tempdir().unwrap();
    let per_event_n = 2_000;
    let mut store = Store::open(&dir.path().join("single.db")).unwrap();
    let events: Vec<Event> = (0..per_event_n).map(event).collect();
    let start = Instant::now();
    for e in &events {
        store.insert(std::slice::from_ref(e)).unwrap();
    }
    let single = per_event_n as f64 / start.elapsed().as_secs_f64();

    let batched_n = 100_000;
    let (sink, rx) = toolwall::events::EventSink::channel();
    let (live, _) = tokio::sync::broadcast::channel(1);
    let writer = toolwall::events::spawn_writer(
        Store::open(&dir.path().join("batched.db")).unwrap(),
        rx,
        live,
    );
    let events: Vec<Event> = (0..batched_n).map(event).collect();
    let start = Instant::now();
    for e in events {
        sink.emit(e);
    }
    drop(sink);
    assert_eq!(writer.join().unwrap(), batched_n as u64);
    let batched = batched_n as f64 / start.elapsed().as_secs_f64();
    println!("   one transaction per event  {single:>10.0} events/s  1.00x");
    println!(
        "   batched writer             {batched:>10.0} events/s  {:.1}x  (goal: > 50,000)",
        batched / single
    );
}

/// ns per policy decision with 1,000 rules, against the same decision with no rules.
/// Goal (issue 4): under 1 µs per decision.
fn bench_policy() {
    println!("== policy: ns per check_call (name forms mixed: bare, by server, mcp__server__tool)");
    let iterations = 200_000;
    let _warm = toolwall::policy::bench_decisions(0, iterations / 10);
    let empty = toolwall::policy::bench_decisions(0, iterations).as_nanos() as f64;
    let full = toolwall::policy::bench_decisions(1000, iterations).as_nanos() as f64;
    let cold = toolwall::policy::bench_rule_evaluation(1000, 2_000).as_nanos() as f64;
    println!("   no rules                   {empty:>8.0} ns  1.00x");
    println!(
        "   1,000 rules                {full:>8.0} ns  {:.2}x  (goal: < 1000 ns)",
        full / empty
    );
    println!(
        "   1,000 rules, uncached      {cold:>8.0} ns  {:.2}x  (first call after a definition changes)",
        cold / empty
    );
}
