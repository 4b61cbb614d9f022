//! `connect`: what the kernel layer's programs add to a connect, a send and a bind from a
//! session cgroup, against the same calls with no programs attached.

use super::*;

/// ns per loopback connect from the session cgroup: no program, program attached with no
/// match, FLAG match (and, for reference, from the root cgroup); for TCP
/// (a full handshake, what a real client pays) and UDP (no handshake, so the program's share is not
/// drowned in the handshake's noise), and the kernel's own count of the time spent in the
/// program. Goal: under 1 µs added per connect.
pub(super) fn bench_connect() {
    println!(
        "== connect(), bind(): cost of the kernel layer per call (loopback, median of each call; the sockets' release included)"
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("   SKIPPED: needs root (loads eBPF programs and moves itself into a cgroup)");
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    let udp_peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_addr = udp_peer.local_addr().unwrap();
    let tcp = move || drop(TcpStream::connect(tcp_addr).unwrap());
    let udp = move || {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.connect(udp_addr).unwrap();
    };
    // A datagram on an unconnected socket: only `cgroup/sendmsg4` sees it. The socket is made
    // per call, like the others: the kernel runs a socket's programs by the cgroup it was
    // created in, not by its process's cgroup of the moment.
    let sendto = move || {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(b"x", udp_addr).unwrap();
    };
    // A listener made (`sock_create` marks it the session's), bound (`post_bind4` checks its
    // port) and closed.
    let bind = move || drop(TcpListener::bind("127.0.0.1:0").unwrap());
    // A Unix connect to a listed name (`connect_unix` reads and looks the name up, then lets
    // it through).
    let unix_dir = tempfile::tempdir().unwrap();
    let unix_path = unix_dir.path().join("bench.sock");
    let unix_listener = std::os::unix::net::UnixListener::bind(&unix_path).unwrap();
    std::thread::spawn(move || {
        for stream in unix_listener.incoming() {
            drop(stream);
        }
    });
    let unix_target = unix_path.clone();
    let unix = move || drop(std::os::unix::net::UnixStream::connect(&unix_target).unwrap());
    // The kernel counts each program's runs and run time while this fd is open.
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime);
    if let Err(error) = &stats {
        println!("   (kernel run-time statistics unavailable: {error})");
    }
    let root_procs = cgroup2_mount().unwrap().join("cgroup.procs");
    let session = format!("bench-{}", std::process::id());
    let cgroup = SessionCgroup::create(&session).unwrap();
    let pins = std::path::PathBuf::from(format!("/sys/fs/bpf/toolwall-{session}"));
    let mut monitor = KernelMonitor::load(false, &pins).unwrap();
    monitor.attach(&session, cgroup.path()).unwrap();
    let listed =
        agent_common::unix::UnixName::of(unix_path.as_os_str().as_encoded_bytes()).unwrap();
    monitor.sync_unix_listed(&[listed]).unwrap();
    let mut ring = monitor.take_event_ring().unwrap();
    let me = std::process::id().to_string();
    for (proto, addr, connect) in [
        ("TCP", tcp_addr, &tcp as &dyn Fn()),
        ("UDP", udp_addr, &udp as &dyn Fn()),
        ("UDP sendto", udp_addr, &sendto as &dyn Fn()),
        ("TCP bind", tcp_addr, &bind as &dyn Fn()),
        // Its "FLAG match" rounds are listed-name rounds too: no IP rule applies to it.
        ("Unix connect", tcp_addr, &unix as &dyn Fn()),
    ] {
        let flag = [Rule::exact(addr.ip(), addr.port(), 0, RuleAction::Flag)];
        // The three cases take turns, round after round, so the noise of a shared machine
        // falls on all of them alike; the ring is drained every round so FLAG never measures
        // a full ring.
        const ROUNDS: usize = 40;
        const PER_ROUND: usize = 250;
        let times = |out: &mut Vec<Duration>| {
            for _ in 0..PER_ROUND {
                let start = Instant::now();
                connect();
                out.push(start.elapsed());
            }
        };
        let (mut root, mut none) = (Vec::new(), Vec::new());
        let (mut nomatch, mut flagged) = (Vec::new(), Vec::new());
        let (mut nomatch_kernel, mut flag_kernel) = (Duration::ZERO, Duration::ZERO);
        let (mut nomatch_runs, mut flag_runs) = (0u64, 0u64);
        let kernel = |m: &KernelMonitor| {
            m.run_stats()
                .unwrap()
                .iter()
                .fold((Duration::ZERO, 0), |(t, n), s| {
                    (t + s.run_time, n + s.runs)
                })
        };
        let before = monitor.counters().unwrap();
        let mut events = 0;
        times(&mut Vec::new()); // warm-up
        for _ in 0..ROUNDS {
            std::fs::write(&root_procs, &me).unwrap();
            times(&mut root);
            // The baseline is the session cgroup itself with nothing attached: being in a
            // non-root cgroup has costs of its own (socket accounting) that are not ours.
            cgroup.add_process(std::process::id()).unwrap();
            monitor.detach(&session).unwrap();
            times(&mut none);
            monitor.attach(&session, cgroup.path()).unwrap();
            monitor.sync_rules(&[], &[]).unwrap();
            let (t0, n0) = kernel(&monitor);
            times(&mut nomatch);
            let (t1, n1) = kernel(&monitor);
            monitor.sync_rules(&flag, &[]).unwrap();
            times(&mut flagged);
            let (t2, n2) = kernel(&monitor);
            nomatch_kernel += t1 - t0;
            nomatch_runs += n1 - n0;
            flag_kernel += t2 - t1;
            flag_runs += n2 - n1;
            toolwall::drain_connects(&mut ring, &mut |_| events += 1);
        }
        std::fs::write(&root_procs, &me).unwrap();
        let after = monitor.counters().unwrap();
        let n = ROUNDS * PER_ROUND;
        let ns = |d: Duration| d.as_nanos() as f64;
        let base = ns(median(none.clone()));
        let root_median = ns(median(root.clone()));
        println!(
            "   {proto}: root cgroup         {root_median:>8.0} ns  (p99 {:>8.0} ns)  {:.2}x  (for reference: outside any session)",
            ns(percentile(root, 0.99)),
            root_median / base
        );
        println!(
            "   {proto}: no program          {base:>8.0} ns  (p99 {:>8.0} ns)  1.00x  (in the session cgroup, nothing attached)",
            ns(percentile(none, 0.99))
        );
        for (name, samples, kernel_time, runs) in [
            ("attached, no match", nomatch, nomatch_kernel, nomatch_runs),
            ("FLAG match + event", flagged, flag_kernel, flag_runs),
        ] {
            let m = ns(median(samples.clone()));
            let in_kernel = if runs > 0 {
                format!("{:.0} ns in the program", ns(kernel_time) / runs as f64)
            } else {
                "kernel time not counted".to_owned()
            };
            println!(
                "   {proto}: {name}  {m:>8.0} ns  (p99 {:>8.0} ns)  {:.2}x  added {:+.0} ns  ({in_kernel})",
                ns(percentile(samples, 0.99)),
                m / base,
                m - base
            );
        }
        println!(
            "   ({proto}: {n} calls each; {} flagged, {events} events read, {} dropped; goal: < 1000 ns added)",
            after.flagged - before.flagged,
            after.ring_drops - before.ring_drops
        );
    }
    monitor.detach(&session).unwrap();
    monitor.pins().remove_if_unused().unwrap();
    drop(monitor);
    let _ = std::fs::remove_dir(&pins);
    cgroup.remove_if_empty().unwrap();
}
