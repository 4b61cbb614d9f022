//! The release binary for people: `cargo xtask run`, `demo` and `install`.

use std::{
    ffi::OsString,
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

use crate::{
    setup::{self, Toolchain},
    step::{self, timed},
};

/// Sets up what it can and builds `target/release/toolwall`; returns it and what setup did.
fn build() -> anyhow::Result<(PathBuf, Toolchain)> {
    let toolchain = setup::setup_if_possible()?;
    timed("cargo build --release -p agent", || {
        step::cargo(&["build", "--release", "-p", "agent"])
    })?;
    Ok((step::target_dir().join("release/toolwall"), toolchain))
}

/// `cargo xtask run`: the daemon replaces this process, so Ctrl-C and SIGTERM reach it directly.
/// It is the release build (a user's first proxy must not be an unoptimised one).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let (bin, toolchain) = build()?;
    // Said last, so it sits right above the daemon's own lines rather than above the build.
    eprintln!("xtask: {}", toolchain.summary());
    eprintln!("xtask: {}", where_to_reach(&bin));
    eprintln!("xtask: starting {} run {}", bin.display(), args.join(" "));
    exec(&bin, "run", args)
}

/// `cargo xtask demo`: the same release build as `run`, then `toolwall demo ARGS`.
pub fn demo(args: &[String]) -> anyhow::Result<()> {
    let (bin, toolchain) = build()?;
    eprintln!("xtask: {}", toolchain.summary());
    eprintln!("xtask: starting {} demo {}", bin.display(), args.join(" "));
    exec(&bin, "demo", args)
}

fn exec(bin: &Path, subcommand: &str, args: &[String]) -> anyhow::Result<()> {
    let error = Command::new(bin).arg(subcommand).args(args).exec();
    Err(anyhow::anyhow!("exec {}: {error}", bin.display()))
}

/// How a person reaches the binary after this: the `toolwall` on PATH when it is this build,
/// else the build's own path and how to install it.
fn where_to_reach(bin: &Path) -> String {
    match on_path("toolwall") {
        Some(found) if same_contents(&found, bin) => format!(
            "`toolwall` on PATH ({}) is this build: `toolwall --help` from another terminal",
            found.display()
        ),
        Some(found) => format!(
            "the binary is {}; the `toolwall` on PATH ({}) is a different build: run `cargo xtask install` to replace it",
            bin.display(),
            found.display()
        ),
        None => format!(
            "the binary is {}; run `cargo xtask install` to put toolwall on PATH",
            bin.display()
        ),
    }
}

/// `cargo xtask install`: builds the release binary and copies it to a directory on PATH:
/// `/usr/local/bin` as root, else `~/.local/bin` or `~/.cargo/bin`, whichever is on PATH.
pub fn install() -> anyhow::Result<()> {
    let (bin, toolchain) = build()?;
    eprintln!("xtask: {}", toolchain.summary());
    let (dir, dir_on_path) = destination()?;
    let dest = dir.join("toolwall");
    timed(&format!("install {}", dest.display()), || {
        copy_atomically(&bin, &dest)
    })?;
    if !dir_on_path {
        eprintln!(
            "xtask: installed {}, but {} is NOT on PATH: add it, e.g. `export PATH=\"{}:$PATH\"` in your shell's profile",
            dest.display(),
            dir.display(),
            dir.display()
        );
        return Ok(());
    }
    match on_path("toolwall") {
        Some(found) if found == dest => eprintln!(
            "xtask: installed {} ({} is on PATH): `toolwall --help` runs it",
            dest.display(),
            dir.display()
        ),
        Some(found) => eprintln!(
            "xtask: installed {}, but {} comes earlier on PATH and is what `toolwall` runs: remove it or reorder PATH",
            dest.display(),
            found.display()
        ),
        None => eprintln!(
            "xtask: installed {} ({} is on PATH; open a new shell if `toolwall` is not found)",
            dest.display(),
            dir.display()
        ),
    }
    Ok(())
}

/// Where `install` puts the binary, and whether that directory is on PATH.
fn destination() -> anyhow::Result<(PathBuf, bool)> {
    if step::is_root() {
        let dir = PathBuf::from("/usr/local/bin");
        let listed = path_dirs().any(|d| d == dir);
        return Ok((dir, listed));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .context("HOME is not set: cannot tell where to install toolwall")?;
    let cargo_bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cargo"))
        .join("bin");
    let candidates = [home.join(".local/bin"), cargo_bin];
    // The first candidate that appears on PATH, in PATH's own order.
    for dir in path_dirs() {
        if candidates.contains(&dir) {
            return Ok((dir, true));
        }
    }
    Ok((candidates[0].clone(), false))
}

/// Copies through a temporary file and a rename, so a daemon running the old binary keeps
/// running it (writing over it in place fails with "text file busy").
fn copy_atomically(from: &Path, to: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = to.parent().context("an install path has a parent")?;
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut temporary = OsString::from(to.as_os_str());
    temporary.push(".xtask-new");
    let temporary = PathBuf::from(temporary);
    fs::copy(from, &temporary)
        .with_context(|| format!("copy {} to {}", from.display(), temporary.display()))?;
    fs::set_permissions(&temporary, fs::Permissions::from_mode(0o755))?;
    fs::rename(&temporary, to)
        .with_context(|| format!("rename {} to {}", temporary.display(), to.display()))?;
    if !same_contents(from, to) {
        bail!(
            "{} differs from {} after copying",
            to.display(),
            from.display()
        );
    }
    Ok(())
}

fn path_dirs() -> impl Iterator<Item = PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
}

/// The first executable file called `name` on PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path_dirs()
        .map(|d| d.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

fn same_contents(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (fs::metadata(a), fs::metadata(b)) else {
        return false;
    };
    ma.len() == mb.len() && matches!((fs::read(a), fs::read(b)), (Ok(x), Ok(y)) if x == y)
}
