//! Builds `agent-ebpf` for `bpfel-unknown-none` and leaves the object in `OUT_DIR/toolwall.bpf.o`
//! for `include_bytes_aligned!`.
//!
//! The eBPF build needs Debian's `rustc-web` (whose sysroot has a precompiled `core` for the BPF
//! target) and `bpf-linker`; `cargo xtask setup` installs both. When either is missing, or
//! `TOOLWALL_EBPF=off` is set, an empty object is written instead, so `cargo check`, `clippy`
//! and `build` work anywhere; the binary then says at run time that the kernel layer is off and
//! how to fix it. A failing eBPF build with the toolchain present is an error, never a stub.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

/// Debian's rustc: the one toolchain here that ships `core` for bpfel-unknown-none.
const BPF_RUSTC: &str = "/usr/bin/rustc";

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let ebpf_dir = manifest_dir.join("../agent-ebpf");
    let object = out_dir.join("toolwall.bpf.o");

    println!("cargo:rerun-if-env-changed=TOOLWALL_EBPF");
    // A build whose object differs from this one by a constant only (`--cfg toolwall_variant`):
    // the other build `tests/tests/session_upgrade.rs` upgrades from.
    println!("cargo:rerun-if-env-changed=TOOLWALL_EBPF_VARIANT");
    let variant = env::var_os("TOOLWALL_EBPF_VARIANT").is_some_and(|v| !v.is_empty());
    for dir in ["../agent-ebpf/src", "../agent-common/src"] {
        println!("cargo:rerun-if-changed={dir}");
    }
    println!("cargo:rerun-if-changed=../agent-ebpf/Cargo.toml");
    println!("cargo:rerun-if-changed=../agent-ebpf/Cargo.lock");

    let linker = bpf_linker();
    // Re-run when the toolchain appears or changes, so a stub build heals itself after setup.
    println!("cargo:rerun-if-changed={BPF_RUSTC}");
    println!("cargo:rerun-if-changed={}", linker.display());

    let missing = match (Path::new(BPF_RUSTC).exists(), linker.exists()) {
        _ if env::var("TOOLWALL_EBPF").as_deref() == Ok("off") => Some("TOOLWALL_EBPF=off"),
        (false, _) => Some("Debian's rustc-web (/usr/bin/rustc) is not installed"),
        (_, false) => Some("bpf-linker is not installed"),
        _ => None,
    };
    if let Some(why) = missing {
        println!(
            "cargo:warning=building toolwall without its eBPF programs: {why}; run `cargo xtask setup`"
        );
        std::fs::write(&object, b"").expect("write stub eBPF object");
        println!("cargo:rustc-env=TOOLWALL_EBPF_MISSING={why}");
        return;
    }

    // A target dir of its own: the outer build holds the lock on the workspace's.
    let target_dir = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest_dir.join("../target"))
        .join(if variant { "ebpf-variant" } else { "ebpf" });
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&ebpf_dir)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            "bpfel-unknown-none",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        // Whatever the outer build was told about compilers and flags is for the host, not BPF.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env("RUSTC", BPF_RUSTC)
        .env("RUSTDOC", "/usr/bin/rustdoc")
        // aya-ebpf uses feature(asm_experimental_arch); allow it for that crate only.
        .env("RUSTC_BOOTSTRAP", "aya_ebpf")
        .env(
            "RUSTFLAGS",
            if variant {
                "-C debuginfo=2 -C link-arg=--btf --cfg toolwall_variant"
            } else {
                "-C debuginfo=2 -C link-arg=--btf"
            },
        )
        .env("PATH", path_with(linker.parent().unwrap_or(Path::new("/"))));
    let status = cmd.status().expect("run cargo for agent-ebpf");
    assert!(
        status.success(),
        "building agent-ebpf failed ({status}); see the errors above"
    );

    let built = target_dir.join("bpfel-unknown-none/release/toolwall");
    std::fs::copy(&built, &object)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", built.display(), object.display()));
}

/// Where `cargo install bpf-linker` puts it (CARGO_HOME/bin), or the first one on PATH.
fn bpf_linker() -> PathBuf {
    let home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"));
    let installed = home.join("bin/bpf-linker");
    if installed.exists() {
        return installed;
    }
    env::var_os("PATH")
        .iter()
        .flat_map(env::split_paths)
        .map(|dir| dir.join("bpf-linker"))
        .find(|p| p.exists())
        .unwrap_or(installed)
}

fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    paths.extend(env::var_os("PATH").iter().flat_map(env::split_paths));
    env::join_paths(paths).expect("PATH entries contain no separator")
}
