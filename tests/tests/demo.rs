//! `toolwall demo`, as a newcomer runs it: offline, no key, one command. It must show a denied
//! tool blocked at each layer and the joined record, check itself, and leave nothing behind —
//! no directory, no daemon, no pinned programs.

use std::process::Command;

use toolwall_tests::{is_root, toolwall_bin};

/// The value printed after `label` on the demo's set-up lines.
fn field<'a>(out: &'a str, label: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{out}"))
}

#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_the_demo_blocks_a_denied_tool_at_every_layer_and_cleans_up() {
    assert!(is_root());
    let out = Command::new(toolwall_bin())
        .args(["demo", "--no-wait"])
        .output()
        .expect("run toolwall demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the demo failed its own checks");
    assert!(stdout.contains("Every layer did what the policy asks."));
    // Each layer's verdict, as the agent met it.
    assert!(stdout.contains("[toolwall] Tool 'mcp__demo__delete_files' blocked by policy"));
    assert!(stdout.contains("tool_use  mcp__demo__echo  (reached the agent)"));
    assert!(!stdout.contains("tool_use  mcp__demo__delete_files"));
    assert!(stdout.contains("tools/call delete_files  REFUSED"));
    assert!(stdout.contains("tools/call echo          ran: hello from the model"));
    assert!(stdout.contains("REFUSED by the kernel"));
    assert!(stdout.contains("the agent runs as nobody"));
    // The record (the demo checks each record's kind itself) and the way to the web view.
    assert!(stdout.contains("blocked (llm/anthropic)"));
    assert!(stdout.contains("blocked (shim)"));
    assert!(stdout.contains("blocked (kernel)"));
    assert!(stdout.contains("/#token="));

    // Nothing left behind: no directory, no daemon, no pins, no cgroup. Only this demo's own:
    // a demo killed earlier on this machine is not this one's to clean.
    assert_eq!(leftovers(&stdout), Vec::<String>::new());
}

/// Runs `toolwall demo --no-wait` until it prints a line starting with `until`, then sends it
/// `signal` (after SIGKILL to its daemon, when `daemon_too`: then nothing of the demo runs to
/// clean up); what it printed, and how it ended.
fn demo_stopped_at(
    until: &str,
    signal: libc::c_int,
    daemon_too: bool,
) -> (String, std::process::ExitStatus) {
    use std::io::{BufRead as _, Read as _};
    let mut child = Command::new(toolwall_bin())
        .args(["demo", "--no-wait"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run toolwall demo");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut out = String::new();
    loop {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the demo ended early:\n{out}"
        );
        out.push_str(&line);
        if line.trim_start().starts_with(until) {
            break;
        }
    }
    if daemon_too {
        let pid: libc::pid_t = field(&out, "daemon")
            .strip_prefix("pid ")
            .and_then(|rest| rest.split(',').next())
            .and_then(|pid| pid.parse().ok())
            .expect("the daemon's pid");
        // SAFETY: kill(2) on the demo's daemon, which cannot be reaped before its parent is.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    stdout.read_to_string(&mut out).unwrap();
    let status = child.wait().unwrap();
    println!("{out}");
    (out, status)
}

/// What a demo leaves that is still there: its directory, its daemon, its pins, its session's
/// cgroup.
fn leftovers(out: &str) -> Vec<String> {
    let dir = field(out, "directory");
    let suffix = dir.rsplit('-').next().unwrap();
    let mut left = Vec::new();
    if std::path::Path::new(dir).exists() {
        left.push(dir.to_owned());
    }
    if let Some(pid) = out
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("daemon"))
        .and_then(|rest| rest.trim().strip_prefix("pid "))
        .and_then(|rest| rest.split(',').next())
        && std::path::Path::new(&format!("/proc/{pid}")).exists()
    {
        left.push(format!("daemon pid {pid}"));
    }
    left.extend(
        std::fs::read_dir("/sys/fs/bpf")
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with(&format!("-{suffix}")))
            .map(|p| p.display().to_string()),
    );
    let cgroup = toolwall::cgroup2_mount()
        .unwrap()
        .join("toolwall")
        .join(format!("demo-{suffix}"));
    if cgroup.exists() {
        left.push(cgroup.display().to_string());
    }
    left
}

/// Interrupted while its agent runs (SIGTERM here; SIGINT and SIGHUP take the same path), the
/// demo ends the session's processes before it stops the daemon — stopped with processes in
/// its session, a daemon keeps the session pinned for a successor — and leaves nothing.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_an_interrupted_demo_leaves_nothing_behind() {
    assert!(is_root());
    let (out, status) = demo_stopped_at("The agent runs under", libc::SIGTERM, false);
    assert_eq!(status.code(), Some(130), "{out}");
    assert!(out.contains("demo: interrupted"), "{out}");
    assert_eq!(leftovers(&out), Vec::<String>::new());
}

/// Demos killed outright (SIGKILL: nothing of them runs) leave their directories (and, when their
/// daemons are killed too, their pins); the next demo removes them before it starts, the pins
/// also when their directory is gone (removed by hand, or made under another `TMPDIR`).
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_what_a_killed_demo_left_is_removed_by_the_next() {
    assert!(is_root());
    let (killed, _) = demo_stopped_at("daemon", libc::SIGKILL, false);
    let dir = field(&killed, "directory").to_owned();
    let (orphaned, _) = demo_stopped_at("daemon", libc::SIGKILL, true);
    let orphan_dir = field(&orphaned, "directory").to_owned();
    std::fs::remove_dir_all(&orphan_dir).unwrap();
    let orphan_pins: Vec<String> = leftovers(&orphaned)
        .into_iter()
        .filter(|p| p.starts_with("/sys/fs/bpf/"))
        .collect();
    assert_eq!(
        orphan_pins.len(),
        1,
        "the killed demo's pins: {orphan_pins:?}"
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let next = Command::new(toolwall_bin())
        .args(["demo", "--no-wait"])
        .output()
        .expect("run toolwall demo");
    let said = String::from_utf8_lossy(&next.stdout);
    println!("{said}");
    assert!(next.status.success(), "{said}");
    // Each demo removes what the ones killed before it left, and says so.
    assert!(
        orphaned.contains(&format!("left: {dir}")),
        "the next demo says what it removed:\n{orphaned}"
    );
    assert!(
        said.contains(&format!("left: {}", orphan_pins[0])),
        "the next demo says it removed the pins without their directory:\n{said}"
    );
    assert_eq!(leftovers(&killed), Vec::<String>::new());
    assert_eq!(leftovers(&orphaned), Vec::<String>::new());
    assert_eq!(leftovers(&said), Vec::<String>::new());
}
