//! `cargo xtask fuzz [--seconds N] [TARGET]`: the `cargo fuzz` targets of `agent/fuzz`, each
//! for a fixed time, with its dictionary and its committed seeds.

use std::process::Command;

use anyhow::bail;

use crate::step::{self, timed};

/// Every target, with its libFuzzer dictionary (under `agent/fuzz`).
const TARGETS: &[(&str, &str)] = &[("mcp_filter", "mcp.dict"), ("llm_sse", "llm.dict")];

/// The toolchain cargo-fuzz needs (sanitizer flags are nightly-only).
const NIGHTLY: &str = "+nightly";

/// Installs cargo-fuzz if missing, then runs `target` (or every target) for `seconds` each.
pub fn fuzz(seconds: u32, target: Option<&str>) -> anyhow::Result<()> {
    let targets: Vec<&(&str, &str)> = match target {
        None => TARGETS.iter().collect(),
        Some(t) => match TARGETS.iter().find(|(name, _)| *name == t) {
            Some(found) => vec![found],
            None => bail!(
                "unknown fuzz target {t:?}; the targets are: {}",
                TARGETS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    };
    let nightly = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !nightly {
        bail!("cargo fuzz needs a nightly toolchain: rustup toolchain install nightly");
    }
    let have_fuzz = Command::new(step::cargo_bin())
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_fuzz {
        timed("cargo install cargo-fuzz --locked", || {
            step::cargo(&["install", "cargo-fuzz", "--locked"])
        })?;
    }
    let dir = step::workspace_root().join("agent/fuzz");
    for (name, dict) in targets {
        timed(&format!("fuzz {name} for {seconds} s"), || {
            let corpus = dir.join("corpus").join(name);
            std::fs::create_dir_all(&corpus)?;
            let mut cmd = Command::new("cargo");
            cmd.args([NIGHTLY, "fuzz", "run", name])
                .arg(&corpus)
                .current_dir(&dir)
                .env("TOOLWALL_EBPF", "off")
                // rustup's cargo picks the toolchain from `+nightly`; the stable cargo that
                // runs xtask must not leak into it.
                .env_remove("CARGO")
                .env_remove("RUSTC");
            let seeds = dir.join("seeds").join(name);
            if seeds.is_dir() {
                cmd.arg(&seeds);
            }
            cmd.arg("--")
                .arg(format!("-max_total_time={seconds}"))
                .arg(format!("-dict={}", dir.join(dict).display()))
                .arg("-print_final_stats=1");
            step::run(&mut cmd)
        })?;
    }
    Ok(())
}
