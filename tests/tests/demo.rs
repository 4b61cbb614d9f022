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
    // The record and the way to the web view.
    assert!(stdout.contains("joined"));
    assert!(stdout.contains("intercept_only"));
    assert!(stdout.contains("execution_only"));
    assert!(stdout.contains("/#token="));

    // Nothing left behind.
    let dir = field(&stdout, "directory");
    assert!(!std::path::Path::new(dir).exists(), "{dir} left behind");
    let pid = field(&stdout, "daemon")
        .strip_prefix("pid ")
        .and_then(|rest| rest.split(',').next())
        .expect("the daemon's pid");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the demo's daemon (pid {pid}) is still running"
    );
    let pins: Vec<_> = std::fs::read_dir("/sys/fs/bpf")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("toolwall-demo-")
        })
        .map(|e| e.path())
        .collect();
    assert!(pins.is_empty(), "pins left behind: {pins:?}");
}
