//! Proves the whole eBPF chain on a real kernel: build → load → verify → attach to a throw-away
//! cgroup → a real `connect()` from a process inside it → counter read back.
//!
//! Needs root and a kernel with BPF; `cargo xtask test` runs it when it is root and reports it
//! as skipped (with the reason) when it is not.

use std::{net::TcpListener, process::Command};

use toolwall::{KernelMonitor, SessionCgroup};

/// Runs `bash -c script` inside `cgroup` and asserts it succeeded.
fn run_in(cgroup: &SessionCgroup, script: &str) {
    let mut cmd = Command::new("bash");
    cmd.args(["-c", script]);
    // Without SHELL, bash asks glibc for its user's shell, and glibc first asks nscd over a
    // Unix socket: a lookup every session makes, which must not count as a refusal.
    cmd.env_remove("SHELL");
    let _procs = cgroup
        .enter_on_spawn(&mut cmd)
        .expect("prepare cgroup entry");
    let status = cmd.status().expect("spawn bash");
    assert!(status.success(), "{script:?} failed: {status}");
}

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_connect_counter_counts_connects_from_inside_the_cgroup_only() {
    let cgroup =
        SessionCgroup::create(&format!("smoke-{}", std::process::id())).expect("create cgroup");
    // Pins of its own, so that a daemon on this host is not disturbed.
    let pin_root =
        std::path::PathBuf::from(format!("/sys/fs/bpf/toolwall-smoke-{}", std::process::id()));
    // Another build's pins that nothing uses (a daemon of another version killed with no
    // session open) are removed by the next daemon.
    // (Opening a build of other bytes mounts bpffs if needed, and leaves one such build too.)
    let other = b"another build";
    drop(toolwall::PinDir::open(&pin_root, other).expect("pin dir"));
    let stale = pin_root.join("0000000000000000");
    std::fs::create_dir_all(stale.join("maps")).expect("stale maps dir");
    std::fs::create_dir_all(stale.join("sessions")).expect("stale sessions dir");
    let mut monitor = KernelMonitor::load(false, &pin_root).expect("load eBPF programs");
    for gone in [stale, pin_root.join(toolwall::build_id(other))] {
        assert!(!gone.exists(), "{} removed", gone.display());
    }
    monitor
        .attach("smoke", cgroup.path())
        .expect("attach to cgroup");
    println!(
        "attached connect4/6 + sendmsg4/6 to {} (cgroup id {})",
        cgroup.path().display(),
        cgroup.id().unwrap()
    );

    let v4 = TcpListener::bind("127.0.0.1:0").unwrap();
    let v6 = TcpListener::bind("[::1]:0").unwrap();
    let (p4, p6) = (
        v4.local_addr().unwrap().port(),
        v6.local_addr().unwrap().port(),
    );
    let before = monitor.counters().unwrap();

    // Three IPv4 connects and one IPv6 connect, by a process inside the cgroup.
    run_in(
        &cgroup,
        &format!(
            "for i in 1 2 3; do exec 3<>/dev/tcp/127.0.0.1/{p4}; exec 3<&-; done; exec 3<>/dev/tcp/::1/{p6}"
        ),
    );
    let inside = monitor.counters().unwrap();
    println!("counters read back after 4 connects inside: {inside:?}");
    assert_eq!(
        inside.connects - before.connects,
        4,
        "every connect from inside counted"
    );
    assert_eq!(
        inside.unmatched - before.unmatched,
        4,
        "no rule loaded: all unmatched"
    );
    assert_eq!(inside.denied + inside.flagged, 0);

    // A connect from this (outside) process is not seen.
    std::net::TcpStream::connect(("127.0.0.1", p4)).unwrap();
    assert_eq!(
        monitor.counters().unwrap(),
        inside,
        "a process outside the cgroup is not counted"
    );

    // Links are pinned (they outlive the process); detaching unpins them.
    monitor.detach("smoke").expect("detach");
    assert!(
        monitor.pins().remove_if_unused().expect("unpin"),
        "nothing left pinned"
    );
    assert!(!pin_root.exists(), "{} removed", pin_root.display());
    drop(monitor);
    assert!(
        cgroup.remove_if_empty().unwrap(),
        "cgroup removed once empty"
    );
}
