//! The examples in README.md and docs/ work as written. Fenced blocks are marked for this test:
//! ```` ```yaml config ```` is a whole configuration `toolwall config check` must accept;
//! ```` ```sh test ```` is run with `bash -euo pipefail` in a fresh directory (also its HOME),
//! the built `toolwall` first on PATH. Other blocks (`sh`, `text`, `yaml`, `json`) are shown,
//! not run: they need a provider key, a real agent's login, or are sample output. A block with
//! any other info string fails the test, so a typo cannot turn an example's test off.

use std::path::{Path, PathBuf};
use std::process::Command;

use toolwall_tests::{is_root, toolwall_bin, workspace_root};

/// One fenced block: where it is, its info string, its text.
struct Block {
    at: String,
    info: String,
    text: String,
}

/// README.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The fenced blocks of one Markdown page (backtick fences, indented ones too).
fn blocks(page: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(page).expect("read the page");
    let name = page
        .strip_prefix(workspace_root())
        .unwrap_or(page)
        .display()
        .to_string();
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let indent = line.len() - line.trim_start().len();
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let mut body = String::new();
        for (_, line) in lines.by_ref() {
            if line.trim() == "```" {
                break;
            }
            body.push_str(line.get(indent..).unwrap_or(line.trim_start()));
            body.push('\n');
        }
        out.push(Block {
            at: format!("{name}:{}", n + 1),
            info: info.trim().to_owned(),
            text: body,
        });
    }
    out
}

fn all_blocks() -> Vec<Block> {
    let blocks: Vec<Block> = pages().iter().flat_map(|p| blocks(p)).collect();
    let unknown: Vec<String> = blocks
        .iter()
        .filter(|b| {
            ![
                "",
                "sh",
                "text",
                "yaml",
                "json",
                "toml",
                "sh test",
                "yaml config",
            ]
            .contains(&b.info.as_str())
        })
        .map(|b| format!("{} ({:?})", b.at, b.info))
        .collect();
    assert!(unknown.is_empty(), "blocks of no known kind: {unknown:?}");
    blocks
}

#[test]
fn every_configuration_example_is_accepted() {
    let blocks = all_blocks();
    let configs: Vec<&Block> = blocks.iter().filter(|b| b.info == "yaml config").collect();
    assert!(
        configs.len() >= 10,
        "only {} yaml config blocks found",
        configs.len()
    );
    let dir = tempfile::tempdir().unwrap();
    let mut failed = Vec::new();
    for (i, block) in configs.iter().enumerate() {
        let file = dir.path().join(format!("example-{i}.yaml"));
        std::fs::write(&file, &block.text).unwrap();
        let out = Command::new(toolwall_bin())
            .args(["config", "check"])
            .arg(&file)
            .current_dir(dir.path())
            .output()
            .unwrap();
        if !out.status.success() {
            failed.push(format!(
                "{}: {}{}",
                block.at,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "examples refused:\n{}",
        failed.join("\n")
    );
}

/// Shell examples run as root: some start a daemon, the demo loads eBPF programs.
#[test]
#[ignore = "privileged: needs root and BPF; `cargo xtask test` runs it as root"]
fn privileged_every_shell_example_runs() {
    assert!(is_root());
    let blocks = all_blocks();
    let shells: Vec<&Block> = blocks.iter().filter(|b| b.info == "sh test").collect();
    assert!(
        shells.len() >= 5,
        "only {} sh test blocks found",
        shells.len()
    );
    assert!(
        shells.iter().any(|b| b.text.contains("toolwall demo")),
        "the README's demo is among the examples"
    );
    let bin_dir = toolwall_bin().parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin_dir).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    let mut failed = Vec::new();
    for block in shells {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &block.text])
            .current_dir(dir.path())
            .env("HOME", dir.path())
            .env("PATH", &path)
            .env_remove("TOOLWALL_LOG")
            .output()
            .unwrap();
        println!("--- {} ({})", block.at, out.status);
        if !out.status.success() {
            failed.push(format!(
                "{} exited {}:\n{}\n{}",
                block.at,
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failed.is_empty(), "examples failed:\n{}", failed.join("\n"));
}
