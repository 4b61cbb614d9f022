//! `toolwall shim install AGENT` / `toolwall shim uninstall AGENT`: every stdio MCP server of
//! an agent's configuration files (the ones `exec` reads, `agents.rs`) wrapped in
//! `toolwall shim --server-id NAME -- COMMAND ARGS…`, or unwrapped again. The wrapped form holds
//! the server's own command after `--`, so unwrapping gives back exactly what was there; each
//! file changed is copied first to `FILE.toolwall-backup` (once: the first copy is the
//! original). Remote servers cannot be wrapped: they are named, to be reached through
//! `toolwall mcp-proxy`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use serde_json::Value;

use super::Agent;

/// What `toolwall shim install|uninstall` does.
#[derive(Debug, clap::Subcommand)]
pub enum ShimAction {
    /// Wrap every stdio MCP server of AGENT's configuration in `toolwall shim`.
    Install(InstallArgs),
    /// Unwrap the servers `install` wrapped, giving back their own commands.
    Uninstall(InstallArgs),
}

/// Arguments of `toolwall shim install|uninstall`.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// claude, codex, gemini, opencode or qwen.
    #[arg(value_name = "AGENT")]
    pub agent: String,
    /// The configuration the wrapped shims record with (`toolwall shim --config FILE`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Change only this file (default: every file the agent reads, user and project).
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Say what would change and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// The agents `install` knows, by the name a user types.
fn agent_named(name: &str) -> anyhow::Result<Agent> {
    Ok(match name {
        "claude" | "claude-code" => Agent::ClaudeCode,
        "codex" => Agent::Codex,
        "gemini" | "gemini-cli" => Agent::GeminiCli,
        "opencode" => Agent::OpenCode,
        "qwen" | "qwen-code" => Agent::QwenCode,
        other => anyhow::bail!(
            "unknown agent {other:?}: name one of claude, codex, gemini, opencode, qwen"
        ),
    })
}

/// Runs `toolwall shim install|uninstall`.
pub(crate) fn install(action: ShimAction) -> anyhow::Result<ExitCode> {
    let (args, wrap) = match action {
        ShimAction::Install(args) => (args, true),
        ShimAction::Uninstall(args) => (args, false),
    };
    let agent = agent_named(&args.agent)?;
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .context("HOME is not set: the agent's user configuration cannot be found")?;
    let cwd = std::env::current_dir().context("the working directory")?;
    let mut files = match &args.file {
        Some(file) => vec![file.clone()],
        None => super::config_files(agent, &home, &cwd),
    };
    // The project's file may be the user's (run from the home directory): edited once.
    let mut seen = std::collections::HashSet::new();
    files.retain(|f| seen.insert(std::fs::canonicalize(f).unwrap_or_else(|_| f.clone())));
    let toolwall = std::env::current_exe().context("toolwall's own path")?;
    let shim = Shim {
        toolwall: toolwall.display().to_string(),
        config: args.config.as_ref().map(|c| c.display().to_string()),
    };
    let mut changed_any = false;
    for file in files.iter().filter(|f| f.exists()) {
        let report = edit_file(agent, file, &shim, wrap, args.dry_run)
            .with_context(|| format!("{}", file.display()))?;
        for name in &report.changed {
            println!(
                "{}: {} {name:?}{}",
                file.display(),
                if wrap { "wrapped" } else { "unwrapped" },
                if args.dry_run { " (dry run)" } else { "" }
            );
        }
        for name in &report.remote {
            println!(
                "{}: {name:?} is a remote server: not wrapped; reach it through `toolwall mcp-proxy`",
                file.display()
            );
        }
        changed_any |= !report.changed.is_empty();
    }
    if !changed_any {
        println!(
            "nothing to {} in {}",
            if wrap { "wrap" } else { "unwrap" },
            files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// How the shim is started.
struct Shim {
    toolwall: String,
    config: Option<String>,
}

impl Shim {
    /// `shim [--config C] --server-id NAME --` followed by the server's command line.
    fn args(&self, name: &str) -> Vec<String> {
        let mut args = vec!["shim".to_owned()];
        if let Some(config) = &self.config {
            args.extend(["--config".to_owned(), config.clone()]);
        }
        args.extend(["--server-id".to_owned(), name.to_owned(), "--".to_owned()]);
        args
    }
}

/// What changed in one file.
#[derive(Debug, Default, PartialEq, Eq)]
struct Report {
    changed: Vec<String>,
    remote: Vec<String>,
}

/// The server's own command line from a wrapped one (`toolwall shim … -- CMD ARGS…`).
fn unwrapped(command: &str, args: &[String]) -> Option<Vec<String>> {
    let is_toolwall = Path::new(command)
        .file_name()
        .is_some_and(|f| f == "toolwall");
    if !is_toolwall || args.first().map(String::as_str) != Some("shim") {
        return None;
    }
    let at = args.iter().position(|a| a == "--")?;
    let own = args[at + 1..].to_vec();
    (!own.is_empty()).then_some(own)
}

fn edit_file(
    agent: Agent,
    file: &Path,
    shim: &Shim,
    wrap: bool,
    dry_run: bool,
) -> anyhow::Result<Report> {
    let text = std::fs::read_to_string(file).context("read")?;
    let (new, report) = if file.extension().is_some_and(|e| e == "toml") {
        edit_toml(&text, shim, wrap)?
    } else {
        edit_json(agent, &text, shim, wrap)?
    };
    if report.changed.is_empty() || dry_run {
        return Ok(report);
    }
    let backup = PathBuf::from(format!("{}.toolwall-backup", file.display()));
    if !backup.exists() {
        std::fs::copy(file, &backup).with_context(|| format!("back up to {}", backup.display()))?;
    }
    // Written whole to a file beside it, then renamed over it: never half a file.
    let temp = PathBuf::from(format!("{}.toolwall-new", file.display()));
    std::fs::write(&temp, new).context("write the new file")?;
    if let Ok(meta) = std::fs::metadata(file) {
        std::fs::set_permissions(&temp, meta.permissions()).context("keep its permissions")?;
    }
    std::fs::rename(&temp, file).context("replace it")?;
    Ok(report)
}

/// Where an agent's JSON file keeps its servers: `mcpServers` (Claude, Gemini, Qwen; Claude's
/// user file also per project), OpenCode's `mcp`.
fn json_server_maps(agent: Agent, root: &mut Value) -> Vec<&mut serde_json::Map<String, Value>> {
    let mut maps = Vec::new();
    let Some(top) = root.as_object_mut() else {
        return maps;
    };
    let key = if agent == Agent::OpenCode {
        "mcp"
    } else {
        "mcpServers"
    };
    let mut projects = None;
    for (k, v) in top.iter_mut() {
        if k == key {
            if let Some(m) = v.as_object_mut() {
                maps.push(m);
            }
        } else if k == "projects" && agent == Agent::ClaudeCode {
            projects = Some(v);
        }
    }
    if let Some(projects) = projects.and_then(Value::as_object_mut) {
        for project in projects.values_mut() {
            if let Some(m) = project.get_mut("mcpServers").and_then(Value::as_object_mut) {
                maps.push(m);
            }
        }
    }
    maps
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn edit_json(
    agent: Agent,
    text: &str,
    shim: &Shim,
    wrap: bool,
) -> anyhow::Result<(String, Report)> {
    let mut root: Value = serde_json::from_str(text).context(
        "not JSON toolwall can read (comments?); edit it by hand, or name another file with --file",
    )?;
    let mut report = Report::default();
    for servers in json_server_maps(agent, &mut root) {
        for (name, server) in servers.iter_mut() {
            let Some(server) = server.as_object_mut() else {
                continue;
            };
            // OpenCode: `command` is the whole command line; the others: `command` + `args`.
            let line: Vec<String> = if agent == Agent::OpenCode {
                strings(server.get("command"))
            } else {
                match server.get("command").and_then(Value::as_str) {
                    Some(c) => std::iter::once(c.to_owned())
                        .chain(strings(server.get("args")))
                        .collect(),
                    None => Vec::new(),
                }
            };
            let Some((program, args)) = line.split_first() else {
                if ["url", "httpUrl", "serverUrl"]
                    .iter()
                    .any(|k| server.contains_key(*k))
                    && wrap
                {
                    report.remote.push(name.clone());
                }
                continue;
            };
            let new_line = match (wrap, unwrapped(program, args)) {
                (true, None) => {
                    let mut l = vec![shim.toolwall.clone()];
                    l.extend(shim.args(name));
                    l.extend(line.iter().cloned());
                    l
                }
                (false, Some(own)) => own,
                _ => continue,
            };
            if agent == Agent::OpenCode {
                server.insert("command".to_owned(), Value::from(new_line));
            } else {
                let (program, args) = new_line.split_first().unwrap_or((&new_line[0], &[]));
                server.insert("command".to_owned(), Value::from(program.clone()));
                server.insert("args".to_owned(), Value::from(args.to_vec()));
            }
            report.changed.push(name.clone());
        }
    }
    let mut out = serde_json::to_string_pretty(&root).context("serialise")?;
    out.push('\n');
    Ok((out, report))
}

/// Codex's `config.toml`, edited in place (comments and layout kept).
fn edit_toml(text: &str, shim: &Shim, wrap: bool) -> anyhow::Result<(String, Report)> {
    let mut doc: toml_edit::DocumentMut = text.parse().context("not TOML")?;
    let mut report = Report::default();
    if let Some(servers) = doc
        .get_mut("mcp_servers")
        .and_then(toml_edit::Item::as_table_like_mut)
    {
        for (name, server) in servers.iter_mut() {
            let Some(server) = server.as_table_like_mut() else {
                continue;
            };
            let Some(program) = server
                .get("command")
                .and_then(|c| c.as_str())
                .map(str::to_owned)
            else {
                if server.contains_key("url") && wrap {
                    report.remote.push(name.to_string());
                }
                continue;
            };
            let args: Vec<String> = server
                .get("args")
                .and_then(|a| a.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let new_line = match (wrap, unwrapped(&program, &args)) {
                (true, None) => {
                    let mut l = vec![shim.toolwall.clone()];
                    l.extend(shim.args(&name));
                    l.push(program.clone());
                    l.extend(args);
                    l
                }
                (false, Some(own)) => own,
                _ => continue,
            };
            let (program, args) = new_line.split_first().unwrap_or((&new_line[0], &[]));
            server.insert("command", toml_edit::value(program.as_str()));
            let mut array = toml_edit::Array::new();
            for a in args {
                array.push(a.as_str());
            }
            server.insert("args", toml_edit::value(array));
            report.changed.push(name.to_string());
        }
    }
    Ok((doc.to_string(), report))
}

#[cfg(test)]
mod tests;
