//! `cargo xtask setup`: the eBPF toolchain, from Debian's packages and crates.io only.
//!
//! The rustup toolchain cannot download `rust-src` here, so `-Z build-std` is out. Debian's
//! `rustc-web` installs `/usr/bin/rustc` (sysroot `/usr`) and `libstd-rust-web-dev-bpf` a
//! precompiled `core` for `bpfel-unknown-none`; `bpf-linker` must be built against the same LLVM
//! major as that rustc (22). The rustup toolchain stays first on PATH and builds everything else:
//! nothing here touches it.

use std::{path::PathBuf, process::Command};

use anyhow::bail;

use crate::step::{self, timed};

/// Debian packages the eBPF build needs.
const PACKAGES: &[&str] = &[
    "rustc-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
    "bpftool",
];
/// The bpf-linker release that works with LLVM 22 and this rustc.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// What is missing, as found by [`survey`].
struct Missing {
    packages: Vec<&'static str>,
    linker: bool,
}

impl Missing {
    fn nothing(&self) -> bool {
        self.packages.is_empty() && !self.linker
    }

    /// The exact commands a person should run to install what is missing.
    fn commands(&self) -> String {
        let mut out = String::new();
        if !self.packages.is_empty() {
            out += &format!(
                "  apt-get update\n  apt-get install -y --no-install-recommends {}\n",
                self.packages.join(" ")
            );
        }
        if self.linker {
            out += &format!(
                "  LLVM_PREFIX=/usr/lib/llvm-22 CARGO_PROFILE_RELEASE_DEBUG=false cargo install bpf-linker --version {BPF_LINKER_VERSION} --locked \\\n      --no-default-features --features llvm-22\n"
            );
        }
        out
    }
}

fn survey() -> Missing {
    let packages = PACKAGES
        .iter()
        .copied()
        .filter(|p| !package_installed(p))
        .collect();
    Missing {
        packages,
        linker: !linker_ok(),
    }
}

/// Whether a Debian package is installed.
pub fn package_installed(name: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .output()
        .map(|o| o.status.success() && o.stdout.ends_with(b"install ok installed"))
        .unwrap_or(false)
}

fn linker_path() -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"));
    home.join("bin/bpf-linker")
}

fn linker_ok() -> bool {
    Command::new(linker_path())
        .arg("--version")
        .output()
        .map(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION)
        })
        .unwrap_or(false)
}

/// Installs what is missing; refuses (with the commands to run) when it cannot.
pub fn setup() -> anyhow::Result<()> {
    let missing = survey();
    if missing.nothing() {
        eprintln!(
            "xtask: eBPF toolchain already installed (rustc-web, bpf core, LLVM 22, bpf-linker {BPF_LINKER_VERSION})"
        );
        return Ok(());
    }
    if !std::path::Path::new("/etc/debian_version").exists() {
        bail!(
            "this is not a Debian host; install the equivalent of:\n{}",
            missing.commands()
        );
    }
    if !step::is_root() {
        bail!(
            "installing the eBPF toolchain needs root; run as root:\n{}",
            missing.commands()
        );
    }
    if !missing.packages.is_empty() {
        timed("apt-get update", || {
            step::run(Command::new("apt-get").args(["update", "-qq"]))
        })?;
        timed(
            &format!("apt-get install {}", missing.packages.join(" ")),
            || {
                step::run(
                    Command::new("apt-get")
                        .args(["install", "-y", "-qq", "--no-install-recommends"])
                        .args(&missing.packages)
                        .env("DEBIAN_FRONTEND", "noninteractive"),
                )
            },
        )?;
    }
    if missing.linker {
        timed(
            &format!("cargo install bpf-linker {BPF_LINKER_VERSION} (LLVM 22)"),
            || {
                step::run(
                    Command::new(step::cargo_bin())
                        .args([
                            "install",
                            "bpf-linker",
                            "--version",
                            BPF_LINKER_VERSION,
                            "--locked",
                        ])
                        .args(["--no-default-features", "--features", "llvm-22"])
                        .env("LLVM_PREFIX", "/usr/lib/llvm-22")
                        // bpf-linker's own release profile asks for full debug info: without
                        // it the build took 18% less CPU and the binary is 2.8 MB, not 42 MB,
                        // and it links the very same eBPF object.
                        .env("CARGO_PROFILE_RELEASE_DEBUG", "false"),
                )
            },
        )?;
    }
    Ok(())
}

/// What [`setup_if_possible`] did about the eBPF toolchain, so `run` can say it again where
/// it is seen: next to the daemon's first lines, not scrolled away above a long build.
pub enum Toolchain {
    Present,
    Installed,
    /// Not installed, and why; the build then has no eBPF programs (kernel layer off).
    Skipped(String),
}

impl Toolchain {
    /// One line for `xtask: ...`.
    pub fn summary(&self) -> String {
        match self {
            Toolchain::Present => {
                format!(
                    "eBPF toolchain present (bpf-linker {BPF_LINKER_VERSION}, LLVM 22): the kernel programs are built in"
                )
            }
            Toolchain::Installed => {
                "eBPF toolchain installed just now: the kernel programs are built in".to_owned()
            }
            Toolchain::Skipped(why) => format!(
                "SKIPPED the eBPF toolchain ({why}): this build has no kernel programs, so the daemon's kernel layer is off"
            ),
        }
    }
}

/// Setup for `run`, `test` and the other builds: installs when it can; otherwise says plainly
/// that the build will have no eBPF programs (the binary then reports the kernel layer off),
/// with the commands that would install it, and goes on.
pub fn setup_if_possible() -> anyhow::Result<Toolchain> {
    if std::env::var("TOOLWALL_EBPF").as_deref() == Ok("off") {
        let why = "TOOLWALL_EBPF=off is set, so the build leaves the eBPF programs out anyway";
        eprintln!("xtask: not installing the eBPF toolchain: {why}");
        return Ok(Toolchain::Skipped(why.to_owned()));
    }
    let missing = survey();
    if missing.nothing() {
        return Ok(Toolchain::Present);
    }
    let debian = std::path::Path::new("/etc/debian_version").exists();
    let root = step::is_root();
    if root && debian {
        timed("setup (eBPF toolchain)", setup)?;
        return Ok(Toolchain::Installed);
    }
    let (why, remedy) = if debian {
        (
            "installing it needs root",
            "run `cargo xtask setup` as root",
        )
    } else {
        (
            "this is not Debian, whose packages the setup installs",
            "install the equivalent of the commands printed above",
        )
    };
    eprintln!(
        "xtask: WARNING: the eBPF toolchain is missing and is not installed: {why};\n\
         xtask: building without the kernel layer. To install it, run as root:\n{}",
        missing.commands()
    );
    Ok(Toolchain::Skipped(format!("{why}; to have it, {remedy}")))
}

/// The benchmarks' baseline relay: Debian's nginx (`cargo xtask bench` compares the LLM proxy
/// with it). Installed when missing and possible; otherwise the bench says it skipped.
pub fn bench_tools() -> anyhow::Result<()> {
    if std::path::Path::new("/usr/sbin/nginx").exists() {
        return Ok(());
    }
    if !(step::is_root() && std::path::Path::new("/etc/debian_version").exists()) {
        eprintln!(
            "xtask: nginx (the relay baseline) is missing; as root: apt-get install -y --no-install-recommends nginx"
        );
        return Ok(());
    }
    timed("apt-get install nginx (the relay baseline)", || {
        step::run(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends", "nginx"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    })
}

/// `cargo xtask build-ebpf`: builds through agent/build.rs and reports the embedded object.
pub fn build_ebpf() -> anyhow::Result<()> {
    setup()?;
    timed("build agent (with eBPF)", || {
        step::cargo(&["build", "-p", "agent"])
    })?;
    let object = step::target_dir().join("ebpf/bpfel-unknown-none/release/toolwall");
    let size = std::fs::metadata(&object).map(|m| m.len()).unwrap_or(0);
    if size == 0 {
        bail!(
            "no eBPF object at {}; see the build output above",
            object.display()
        );
    }
    eprintln!(
        "xtask: eBPF object {} ({size} bytes), embedded in target/debug/toolwall",
        object.display()
    );
    Ok(())
}
