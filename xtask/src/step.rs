//! Running and timing the steps of a task, loudly.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

/// The workspace root (xtask's parent directory).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent")
        .to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` when set (relative to the workspace root),
/// else `target/`, so the binaries and peers xtask points at are the ones cargo built there.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => workspace_root().join(dir),
        _ => workspace_root().join("target"),
    }
}

/// Runs `f` as a named step, printing its name and how long it took.
pub fn timed<T>(name: &str, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    eprintln!("xtask: ── {name}");
    let start = Instant::now();
    let out = f().with_context(|| format!("step failed: {name}"));
    eprintln!(
        "xtask:    {name}: {} in {}",
        if out.is_ok() { "done" } else { "FAILED" },
        human(start.elapsed())
    );
    out
}

/// `1.2 s` / `3 min 4 s`.
pub fn human(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else {
        format!("{} min {} s", d.as_secs() / 60, d.as_secs() % 60)
    }
}

/// Runs a command (in the workspace root unless it names a directory), inheriting stdio; fails
/// if it fails.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    if cmd.get_current_dir().is_none() {
        cmd.current_dir(workspace_root());
    }
    let shown = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("start {shown}"))?;
    if !status.success() {
        bail!("{shown} exited with {status}");
    }
    Ok(())
}

/// Runs `cargo ARGS` with the same cargo that runs xtask.
pub fn cargo(args: &[&str]) -> anyhow::Result<()> {
    run(Command::new(cargo_bin()).args(args))
}

/// The cargo that invoked us.
pub fn cargo_bin() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // `id -u` keeps xtask free of libc; it is on every Linux.
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.trim_ascii() == b"0")
        .unwrap_or(false)
}
