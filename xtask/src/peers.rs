//! `cargo xtask peers`: the real programs the end-to-end tests talk to, from PyPI and npm,
//! pinned in `xtask/peers/`, installed under `target/peers` (never system-wide).

use std::{fs, path::Path, process::Command};

use anyhow::Context;

use crate::step::{self, timed};

/// Debian packages the end-to-end tests use: a browser for the web view test, Prometheus
/// to scrape the daemon's `/metrics`, systemd's `systemd-analyze` to verify the package's unit,
/// and the host services a session must not reach (an ssh daemon, socat forwarders, an HTTP
/// proxy).
const DEBIAN_PACKAGES: &[&str] = &[
    "chromium",
    "prometheus",
    "systemd",
    "openssh-server",
    "socat",
    "tinyproxy",
];

/// Installs (or confirms) the Python virtualenv, the npm packages and the Debian packages.
pub fn install() -> anyhow::Result<()> {
    let mut wanted = DEBIAN_PACKAGES.to_vec();
    // Debian's python3 makes no virtualenv without `ensurepip`, which python3-venv brings.
    if !python_makes_venvs() {
        wanted.push("python3-venv");
    }
    let missing: Vec<&str> = wanted
        .into_iter()
        .filter(|p| !crate::setup::package_installed(p))
        .collect();
    if !missing.is_empty() {
        if step::is_root() {
            timed(&format!("apt-get install {}", missing.join(" ")), || {
                step::run(Command::new("apt-get").args(["update", "-qq"]))?;
                step::run(
                    Command::new("apt-get")
                        .args(["install", "-y", "-qq", "--no-install-recommends"])
                        .args(&missing)
                        .env("DEBIAN_FRONTEND", "noninteractive"),
                )
            })?;
        } else {
            eprintln!(
                "xtask: WARNING: {} missing (needs root to install: apt-get install {}); the tests that need it are skipped",
                missing.join(" "),
                missing.join(" ")
            );
        }
    }
    let root = step::workspace_root();
    let pins = root.join("xtask/peers");
    let dir = step::target_dir().join("peers");
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;

    let requirements = pins.join("requirements.txt");
    let venv = dir.join("venv");
    if is_current(&requirements, &venv.join(".toolwall-installed"))? {
        eprintln!("xtask: Python peers up to date ({})", venv.display());
    } else {
        timed(
            "Python peers (anthropic, openai, google-genai, mcp, the OTLP collector stand-in's opentelemetry-proto and grpcio) into target/peers/venv",
            || {
                step::run(Command::new("python3").args(["-m", "venv"]).arg(&venv)).context(
                    "python3 cannot make a virtualenv (on Debian: apt-get install python3-venv)",
                )?;
                step::run(
                    Command::new(venv.join("bin/pip"))
                        .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
                        .arg(&requirements),
                )?;
                mark_current(&requirements, &venv.join(".toolwall-installed"))
            },
        )?;
    }

    crate::node::ensure()?;
    npm(
        &pins.join("package.json"),
        &dir.join("node"),
        "npm peers (server-everything, @anthropic-ai/sdk, openai, @google/genai, Claude Code, Codex CLI, Gemini CLI, OpenCode, Qwen Code, playwright-core) into target/peers/node",
    )?;
    // Apart from the others: its reference server needs zod 3, server-everything zod 4.
    npm(
        &pins.join("conformance/package.json"),
        &dir.join("conformance"),
        "MCP conformance suite and its reference server's packages into target/peers/conformance",
    )?;
    Ok(())
}

/// Whether `python3` has what `python3 -m venv` needs (venv, and ensurepip to put pip in it).
fn python_makes_venvs() -> bool {
    Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Installs the npm packages pinned in `package` into `dir` (unless its stamp says they are).
fn npm(package: &Path, dir: &Path, what: &str) -> anyhow::Result<()> {
    let stamp = dir.join(".toolwall-installed");
    if is_current(package, &stamp)? {
        eprintln!("xtask: npm peers up to date ({})", dir.display());
        return Ok(());
    }
    timed(what, || {
        fs::create_dir_all(dir)?;
        fs::copy(package, dir.join("package.json"))?;
        step::run(
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(dir),
        )?;
        mark_current(package, &stamp)
    })
}

/// Whether `stamp` records exactly the current contents of `pins`.
fn is_current(pins: &Path, stamp: &Path) -> anyhow::Result<bool> {
    let want = fs::read(pins).with_context(|| format!("read {}", pins.display()))?;
    Ok(fs::read(stamp).map(|have| have == want).unwrap_or(false))
}

fn mark_current(pins: &Path, stamp: &Path) -> anyhow::Result<()> {
    fs::copy(pins, stamp).with_context(|| format!("write {}", stamp.display()))?;
    Ok(())
}
