//! An upgrade takes over running sessions: a session started under build A (a toolwall whose
//! eBPF object differs by a constant, `TOOLWALL_EBPF_VARIANT`) is guarded by build B's rules once
//! B starts, with no gap in its refusals and none of A's events lost, and A's pins are gone.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
};

use toolwall_tests::{
    Daemon, is_root,
    session::{events, session_cgroup_gone, shared_dir, wait_for_text, write_agent},
};

/// Connects to `refused` (never allowed) and `changed` (allowed by A's configuration, not by
/// B's) once per phase; a phase after the first starts when its mark file appears.
const AGENT: &str = r#"
import os, socket, sys, time
refused, changed, marks = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def attempt(n, label, port):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        print(n, label, "THROUGH", flush=True)
    except PermissionError:
        print(n, label, "EPERM", flush=True)
    finally:
        s.close()
for n in (1, 2, 3):
    while n > 1 and not os.path.exists(os.path.join(marks, "go%d" % n)):
        time.sleep(0.05)
    attempt(n, "refused", refused)
    attempt(n, "changed", changed)
"#;

fn variant_bin() -> PathBuf {
    std::env::var_os("TOOLWALL_VARIANT_BIN")
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .expect("TOOLWALL_VARIANT_BIN: a toolwall of another eBPF build (`cargo xtask test` builds it with TOOLWALL_EBPF_VARIANT=1)")
}

/// The build directories under a daemon's pin root.
fn builds(pin_root: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(pin_root)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[test]
#[ignore = "privileged: needs root, BPF and a second build; `cargo xtask test` runs it as root"]
fn privileged_an_upgrade_takes_over_a_live_session_with_no_gap_and_no_loss() {
    assert!(is_root());
    let old = variant_bin();
    let listeners: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("listen"))
        .collect();
    let port = |i: usize| listeners[i].local_addr().expect("addr").port();
    let (refused, changed, unused) = (port(0), port(1), port(2));
    let allowing = |p: u16| format!("netmon:\n  egress:\n    allow:\n      - 127.0.0.1:{p}\n");
    let mut daemon = Daemon::start_of(&allowing(changed), &old);
    let before = builds(&daemon.pin_dir);
    assert_eq!(before.len(), 1, "build A's pins: {before:?}");

    let dir = shared_dir();
    let agent = write_agent(dir.path(), "upgrade.py", AGENT);
    let out_file = dir.path().join("agent.out");
    // The session is started by build A's `exec`, as it would have been before the upgrade.
    let mut child = std::process::Command::new(&old)
        .args(["exec", "--config"])
        .arg(&daemon.config)
        .args(["--user", "nobody", "--session", "upgrade", "--"])
        .arg("/usr/bin/python3")
        .arg(&agent)
        .args([
            refused.to_string(),
            changed.to_string(),
            dir.path().display().to_string(),
        ])
        .env_remove("SUDO_USER")
        .stdout(std::fs::File::create(&out_file).expect("out"))
        .stderr(std::fs::File::create(dir.path().join("exec.err")).expect("err"))
        .spawn()
        .expect("exec");
    wait_for_text(&out_file, "1 changed");
    // A stops (an upgrade's restart); the session runs on under A's programs alone.
    daemon.stop();
    std::fs::write(dir.path().join("go2"), "").expect("mark");
    wait_for_text(&out_file, "2 changed");
    // B starts with a configuration that no longer allows `changed`.
    let config = std::fs::read_to_string(&daemon.config).expect("config");
    std::fs::write(
        &daemon.config,
        config.replace(
            &format!("127.0.0.1:{changed}"),
            &format!("127.0.0.1:{unused}"),
        ),
    )
    .expect("rewrite config");
    daemon.relaunch("stderr-b");
    std::fs::write(dir.path().join("go3"), "").expect("mark");
    let seen = wait_for_text(&out_file, "3 changed");
    let status = child.wait().expect("exec exit");
    let exec_err = std::fs::read_to_string(dir.path().join("exec.err")).unwrap_or_default();
    println!("{seen}\n{exec_err}");
    for n in 1..=3 {
        assert!(
            seen.contains(&format!("{n} refused EPERM")),
            "refused in every phase, with no gap: {seen}"
        );
    }
    assert!(
        seen.contains("1 changed THROUGH") && seen.contains("2 changed THROUGH"),
        "A's rules while A's programs enforce: {seen}"
    );
    assert!(
        seen.contains("3 changed EPERM"),
        "B's rules once B took over: {seen}"
    );
    assert_eq!(status.code(), Some(1), "exec says the daemon went away");

    let stderr_b = std::fs::read_to_string(daemon.dir.path().join("stderr-b")).unwrap_or_default();
    assert!(
        stderr_b.contains("took over session \"upgrade\""),
        "{stderr_b}"
    );
    let after = builds(&daemon.pin_dir);
    assert_eq!(after.len(), 1, "only build B's pins are left: {after:?}");
    assert_ne!(after, before, "build B's pins are another directory");

    let connections = events(&daemon, "mcp_network_connection", |e| {
        e.iter()
            .filter(|e| e["session_id"] == "upgrade" && e["action"] == "block")
            .count()
            >= 4
    });
    let blocked = |port: u16| {
        connections
            .iter()
            .filter(|e| {
                e["session_id"] == "upgrade"
                    && e["action"] == "block"
                    && e["remote_addr"] == format!("127.0.0.1:{port}").as_str()
            })
            .map(|e| e["count"].as_u64().unwrap_or(1))
            .sum::<u64>()
    };
    assert_eq!(
        blocked(refused),
        3,
        "every refusal recorded once: by A, from A's ring by B (made while no daemon ran), by B: {connections:#?}"
    );
    assert_eq!(blocked(changed), 1, "{connections:#?}");
    let alerts = events(&daemon, "kernel_alert", |e| {
        e.iter().any(|a| a["alert"] == "session_taken_over")
    });
    assert!(
        alerts
            .iter()
            .any(|a| a["alert"] == "session_taken_over" && a["session_id"] == "upgrade"),
        "{alerts:#?}"
    );
    // exec closed the session through B: nothing of it is left.
    assert!(session_cgroup_gone("upgrade"), "session cgroup removed");
}
