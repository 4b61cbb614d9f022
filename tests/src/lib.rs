//! Helpers shared by the end-to-end tests: where the built `toolwall` binary and the real peers
//! (official Python SDKs in a virtualenv, reference MCP servers from npm) are.
//!
//! `cargo xtask test` builds the binary and installs the peers under `target/peers` before it
//! runs these tests, and passes both locations in the environment. Run directly with
//! `cargo test -p toolwall-tests`, they fall back to the same default places and fail with a
//! message saying to run `cargo xtask test` (or `cargo xtask peers`) when something is missing.

use std::path::{Path, PathBuf};

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The `toolwall` binary under test: `TOOLWALL_BIN`, else `target/debug/toolwall`.
pub fn toolwall_bin() -> PathBuf {
    let bin = std::env::var_os("TOOLWALL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("debug/toolwall"));
    assert!(
        bin.exists(),
        "{} does not exist: run `cargo build -p agent` or `cargo xtask test`",
        bin.display()
    );
    bin
}

/// Where xtask installs the real peers: `TOOLWALL_PEERS_DIR`, else `target/peers`.
pub fn peers_dir() -> PathBuf {
    std::env::var_os("TOOLWALL_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("peers"))
}

fn peer(relative: &str) -> PathBuf {
    let path = peers_dir().join(relative);
    assert!(
        path.exists(),
        "{} does not exist: run `cargo xtask peers` (or `cargo xtask test`)",
        path.display()
    );
    path
}

/// The virtualenv's Python, with `anthropic`, `openai` and `mcp` installed.
pub fn python() -> PathBuf {
    peer("venv/bin/python")
}

/// The reference MCP server `@modelcontextprotocol/server-everything` (stdio, sse, streamableHttp).
pub fn server_everything() -> PathBuf {
    peer("node/node_modules/.bin/mcp-server-everything")
}

/// Whether this process runs as root (privileged tests need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
