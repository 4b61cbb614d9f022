//! `cargo xtask package`: a `.deb` of the release binary (the eBPF object inside it), the
//! systemd units (`xtask/package/toolwall.service` and `.socket`), the embedded default configuration as the
//! conffile `/etc/toolwall/toolwall.yaml`, and the README with docs/ — built with `dpkg-deb` from a staged
//! tree, so nothing beyond Debian's own tools is needed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::step::{self, timed};

/// Builds the package; returns its path (`target/package/toolwall_VERSION_ARCH.deb`).
pub fn package() -> anyhow::Result<PathBuf> {
    crate::setup::setup_if_possible()?;
    timed(
        "cargo build --release -p agent (the packaged binary)",
        || step::cargo(&["build", "--release", "-p", "agent"]),
    )?;
    let root = step::workspace_root();
    let bin = step::target_dir().join("release/toolwall");
    let version = output(Command::new(&bin).arg("--version"))?
        .split_whitespace()
        .last()
        .context("toolwall --version printed no version")?
        .to_owned();
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
    let out = step::target_dir().join("package");
    let stage = out.join(format!("toolwall_{version}_{arch}"));
    let _ = fs::remove_dir_all(&stage);
    let put = |relative: &str, contents: &[u8], mode: u32| -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let path = stage.join(relative);
        fs::create_dir_all(path.parent().context("a staged path has a parent")?)?;
        fs::write(&path, contents).with_context(|| format!("stage {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    put(
        "usr/bin/toolwall",
        &fs::read(&bin).with_context(|| format!("read {}", bin.display()))?,
        0o755,
    )?;
    // Whatever debug info the profile left (none for release, line tables for `profiling`).
    step::run(
        Command::new("strip")
            .arg("--strip-debug")
            .arg(stage.join("usr/bin/toolwall")),
    )?;
    for unit in ["toolwall.service", "toolwall.socket"] {
        put(
            &format!("lib/systemd/system/{unit}"),
            &fs::read(root.join("xtask/package").join(unit))?,
            0o644,
        )?;
    }
    let config = output(Command::new(&bin).args(["config", "default"]))?;
    put(
        "etc/toolwall/toolwall.yaml",
        format!("{config}\n").as_bytes(),
        0o644,
    )?;
    put(
        "usr/share/doc/toolwall/README.md",
        &fs::read(root.join("README.md"))?,
        0o644,
    )?;
    // The README links to docs/: the pages ship beside it, so the links hold on the host.
    let mut pages: Vec<_> = fs::read_dir(root.join("docs"))
        .context("read docs/")?
        .collect::<Result<_, _>>()
        .context("read docs/")?;
    pages.sort_by_key(fs::DirEntry::file_name);
    for page in pages {
        let name = page.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            put(
                &format!("usr/share/doc/toolwall/docs/{name}"),
                &fs::read(page.path())?,
                0o644,
            )?;
        }
    }
    let size_kib = dir_size(&stage)? / 1024;
    put(
        "DEBIAN/control",
        format!(
            "Package: toolwall\nVersion: {version}\nArchitecture: {arch}\nMaintainer: toolwall developers <toolwall@localhost>\nInstalled-Size: {size_kib}\nDepends: libc6\nSection: admin\nPriority: optional\nDescription: guard for AI agents' MCP tool use\n toolwall decides which MCP tools an AI agent may call, enforces it before they\n run at three layers (LLM API proxy, MCP shim and filter proxy, eBPF connect\n hooks) and records every call. Start it with: systemctl enable --now toolwall\n"
        )
        .as_bytes(),
        0o644,
    )?;
    put("DEBIAN/conffiles", b"/etc/toolwall/toolwall.yaml\n", 0o644)?;
    let deb = out.join(format!("toolwall_{version}_{arch}.deb"));
    timed(&format!("dpkg-deb --build {}", deb.display()), || {
        step::run(
            Command::new("dpkg-deb")
                .args(["--build", "--root-owner-group"])
                .arg(&stage)
                .arg(&deb),
        )
    })?;
    println!("{}", deb.display());
    Ok(deb)
}

fn output(command: &mut Command) -> anyhow::Result<String> {
    let out = command
        .output()
        .with_context(|| format!("run {command:?}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn dir_size(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
