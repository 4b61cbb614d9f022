//! What `toolwall exec` knows of the agents it starts: how each finds its model endpoint (so
//! the session's proxy URL reaches it), whether that endpoint is one the proxy reads, and where
//! each keeps its MCP servers (so the ones not run through `toolwall shim` are named).
//!
//! Verified against the pinned agents (`xtask/peers/package.json`) by `tests/tests/real_agents/`:
//! - Claude Code reads `ANTHROPIC_BASE_URL` (and appends `/v1/messages`); MCP servers in
//!   `.mcp.json`, `~/.claude.json` (`mcpServers`, and per project).
//! - Codex CLI ignores `OPENAI_BASE_URL`: it gets `-c openai_base_url=…`; MCP servers in
//!   `$CODEX_HOME/config.toml` (`mcp_servers`).
//! - Gemini CLI reads `GOOGLE_GEMINI_BASE_URL` when it signs in with an API key
//!   (`security.auth.selectedType: gemini-api-key`); signed in with Google it talks to Code
//!   Assist, which toolwall does not read. MCP servers in `settings.json` (`mcpServers`).
//! - OpenCode reads `ANTHROPIC_BASE_URL` and `OPENAI_BASE_URL` as the `/v1` base (it appends
//!   `/messages`), so it gets `/v1` on both; MCP servers in `opencode.json` (`mcp`).
//! - Qwen Code reads `OPENAI_BASE_URL` (`/v1`); MCP servers in `settings.json` (`mcpServers`).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// An agent `exec` knows by its program's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Agent {
    ClaudeCode,
    Codex,
    GeminiCli,
    OpenCode,
    QwenCode,
    /// Any other program: the SDKs read the same variables.
    Other,
}

impl Agent {
    pub(super) fn of(program: &OsStr) -> Agent {
        match Path::new(program).file_name().and_then(OsStr::to_str) {
            Some("claude") => Agent::ClaudeCode,
            Some("codex") => Agent::Codex,
            Some("gemini") => Agent::GeminiCli,
            Some("opencode") => Agent::OpenCode,
            Some("qwen") => Agent::QwenCode,
            _ => Agent::Other,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "Claude Code",
            Agent::Codex => "Codex CLI",
            Agent::GeminiCli => "Gemini CLI",
            Agent::OpenCode => "OpenCode",
            Agent::QwenCode => "Qwen Code",
            Agent::Other => "the agent",
        }
    }
}

/// Points the agent at the session's proxy URL `proxy` (`…/s/<key>`): the variables every
/// supported agent and SDK reads, in the form this agent reads them, and Codex's option.
pub(super) fn point_at_proxy(
    agent: Agent,
    proxy: &str,
    cmd: &mut Command,
    args: &mut Vec<OsString>,
) {
    let v1 = format!("{proxy}/v1");
    let anthropic = if agent == Agent::OpenCode { &v1 } else { proxy };
    cmd.env("ANTHROPIC_BASE_URL", anthropic)
        .env("OPENAI_BASE_URL", &v1)
        .env("GOOGLE_GEMINI_BASE_URL", proxy);
    if agent == Agent::Codex {
        args.splice(
            0..0,
            [
                OsString::from("-c"),
                OsString::from(format!("openai_base_url=\"{v1}\"")),
            ],
        );
    }
}

/// What `exec` says of the agent's model traffic: `Ok` lines are facts, `Err` lines warnings.
pub(super) fn coverage(
    agent: Agent,
    proxy: &str,
    home: &Path,
    cwd: &Path,
) -> Vec<Result<String, String>> {
    let mut out = vec![Ok(format!(
        "LLM traffic through {proxy} for {}: ANTHROPIC_BASE_URL, OPENAI_BASE_URL and GOOGLE_GEMINI_BASE_URL are set (Claude Code, OpenCode, Qwen Code, Gemini CLI, and the Anthropic, OpenAI and Google SDKs read them){}",
        agent.name(),
        if agent == Agent::Codex {
            "; Codex CLI gets -c openai_base_url"
        } else {
            ""
        }
    ))];
    if agent == Agent::GeminiCli {
        match gemini_auth(home, cwd) {
            Some(kind) if kind == "gemini-api-key" => {}
            Some(kind) => out.push(Err(format!(
                "Gemini CLI signs in as {kind:?} (security.auth.selectedType): only with \"gemini-api-key\" does it send its model traffic to GOOGLE_GEMINI_BASE_URL; otherwise it goes to Google's Code Assist directly, unread by toolwall (netmon.pin_llm_egress refuses it to sessions)"
            ))),
            None => out.push(Err(
                "Gemini CLI reads GOOGLE_GEMINI_BASE_URL only when it signs in with an API key: set security.auth.selectedType to \"gemini-api-key\" in ~/.gemini/settings.json and export GEMINI_API_KEY; signed in with Google, its model traffic goes to Google's Code Assist directly, unread by toolwall (netmon.pin_llm_egress refuses it to sessions)".to_owned(),
            )),
        }
    }
    out
}

/// Gemini CLI's sign-in method, from its settings (the project's, then the user's).
fn gemini_auth(home: &Path, cwd: &Path) -> Option<String> {
    gemini_settings(home, cwd).into_iter().find_map(|path| {
        let v = read_json(&path)?;
        v.pointer("/security/auth/selectedType")
            .and_then(Value::as_str)
            .map(str::to_owned)
    })
}

fn gemini_home(home: &Path) -> PathBuf {
    std::env::var_os("GEMINI_CLI_HOME").map_or_else(|| home.to_owned(), PathBuf::from)
}

fn gemini_settings(home: &Path, cwd: &Path) -> Vec<PathBuf> {
    vec![
        cwd.join(".gemini/settings.json"),
        gemini_home(home).join(".gemini/settings.json"),
    ]
}

/// An MCP server of an agent's configuration that does not run through `toolwall shim`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Unshimmed {
    /// The file it is configured in.
    pub(super) file: PathBuf,
    pub(super) name: String,
    /// Its command, or its URL for a remote server.
    pub(super) runs: String,
    pub(super) remote: bool,
}

/// The files in which `agent` keeps its MCP servers (user and project), whether or not they
/// exist.
pub(super) fn config_files(agent: Agent, home: &Path, cwd: &Path) -> Vec<PathBuf> {
    match agent {
        Agent::ClaudeCode => vec![cwd.join(".mcp.json"), home.join(".claude.json")],
        Agent::Codex => vec![codex_config_path(home)],
        Agent::GeminiCli => gemini_settings(home, cwd),
        Agent::QwenCode => vec![
            cwd.join(".qwen/settings.json"),
            std::env::var_os("QWEN_HOME")
                .map_or_else(|| home.join(".qwen"), PathBuf::from)
                .join("settings.json"),
        ],
        Agent::OpenCode => {
            let config = std::env::var_os("XDG_CONFIG_HOME")
                .map_or_else(|| home.join(".config"), PathBuf::from)
                .join("opencode");
            let mut files = vec![cwd.join("opencode.json"), config.join("opencode.json")];
            files.extend(std::env::var_os("OPENCODE_CONFIG").map(PathBuf::from));
            files
        }
        Agent::Other => Vec::new(),
    }
}

/// The MCP servers in every configuration file `agent` reads (for another program, every
/// supported agent's) that do not run through `toolwall shim`.
pub(super) fn unshimmed_servers(agent: Agent, home: &Path, cwd: &Path) -> Vec<Unshimmed> {
    let agents = match agent {
        Agent::Other => vec![
            Agent::ClaudeCode,
            Agent::Codex,
            Agent::GeminiCli,
            Agent::QwenCode,
            Agent::OpenCode,
        ],
        one => vec![one],
    };
    let mut out = Vec::new();
    for agent in agents {
        for path in config_files(agent, home, cwd) {
            match agent {
                Agent::Codex => codex_servers(&path, &mut out),
                Agent::OpenCode => opencode_servers(&path, &mut out),
                _ => json_servers(&path, "/mcpServers", &mut out),
            }
            if agent == Agent::ClaudeCode && path == home.join(".claude.json") {
                // Per project: `projects` is keyed by the project's path.
                let pointer = format!(
                    "/projects/{}/mcpServers",
                    cwd.to_string_lossy().replace('~', "~0").replace('/', "~1")
                );
                json_servers(&path, &pointer, &mut out);
            }
        }
    }
    out
}

fn read_json(path: &Path) -> Option<Value> {
    // A missing file lists nothing; a broken one is the agent's to report.
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn shimmed(command: &str, args: &[&str]) -> bool {
    Path::new(command)
        .file_name()
        .is_some_and(|f| f == "toolwall")
        && args.first() == Some(&"shim")
}

/// Notes a server of `path` that runs `command args` (unless through the shim) or is reached
/// at `url`.
fn note(
    out: &mut Vec<Unshimmed>,
    path: &Path,
    name: &str,
    command: Option<&str>,
    args: &[&str],
    url: Option<&str>,
) {
    let (runs, remote) = match (command, url) {
        (Some(command), _) if shimmed(command, args) => return,
        (Some(command), _) => (command, false),
        (None, Some(url)) => (url, true),
        (None, None) => return,
    };
    out.push(Unshimmed {
        file: path.to_owned(),
        name: name.to_owned(),
        runs: runs.to_owned(),
        remote,
    });
}

/// `{name: {command, args} | {url} | {httpUrl}}` at `pointer` of a JSON file.
fn json_servers(path: &Path, pointer: &str, out: &mut Vec<Unshimmed>) {
    let Some(v) = read_json(path) else {
        return;
    };
    let Some(servers) = v.pointer(pointer).and_then(Value::as_object) else {
        return;
    };
    for (name, server) in servers {
        let args: Vec<&str> = server
            .get("args")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let remote = ["url", "httpUrl", "serverUrl"]
            .iter()
            .find_map(|k| server.get(*k).and_then(Value::as_str));
        let command = server.get("command").and_then(Value::as_str);
        note(out, path, name, command, &args, remote);
    }
}

/// OpenCode's `mcp: {name: {type: "local", command: [...]} | {type: "remote", url}}`.
fn opencode_servers(path: &Path, out: &mut Vec<Unshimmed>) {
    let Some(v) = read_json(path) else {
        return;
    };
    let Some(servers) = v.get("mcp").and_then(Value::as_object) else {
        return;
    };
    for (name, server) in servers {
        if server.get("enabled") == Some(&Value::Bool(false)) {
            continue;
        }
        let command: Vec<&str> = server
            .get("command")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let (program, args) = command
            .split_first()
            .map_or((None, &[][..]), |(p, a)| (Some(*p), a));
        note(
            out,
            path,
            name,
            program,
            args,
            server.get("url").and_then(Value::as_str),
        );
    }
}

/// Codex's configuration: `$CODEX_HOME/config.toml`, default `~/.codex/config.toml`.
fn codex_config_path(home: &Path) -> PathBuf {
    std::env::var_os("CODEX_HOME")
        .map_or_else(|| home.join(".codex"), PathBuf::from)
        .join("config.toml")
}

/// `[mcp_servers.NAME]` tables with a `command` or a `url`.
fn codex_servers(path: &Path, out: &mut Vec<Unshimmed>) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let Ok(table) = text.parse::<toml::Table>() else {
        return;
    };
    let Some(servers) = table.get("mcp_servers").and_then(toml::Value::as_table) else {
        return;
    };
    for (name, server) in servers {
        let args: Vec<&str> = server
            .get("args")
            .and_then(toml::Value::as_array)
            .map(|a| a.iter().filter_map(toml::Value::as_str).collect())
            .unwrap_or_default();
        let url = server.get("url").and_then(toml::Value::as_str);
        let command = server.get("command").and_then(toml::Value::as_str);
        note(out, path, name, command, &args, url);
    }
}

/// The warning `exec` prints for one server.
pub(super) fn warning(agent: Agent, server: &Unshimmed) -> String {
    let Unshimmed {
        file,
        name,
        runs,
        remote,
    } = server;
    let file = file.display();
    if *remote {
        return format!(
            "MCP server {name:?} in {file} is reached at {runs} directly: unless that is a `toolwall mcp-proxy`, its tools are not filtered and a call the LLM layer cannot read (code mode, a name computed at run time, a server it never saw) is decided by nobody; reach it through `toolwall mcp-proxy`"
        );
    }
    let code_mode = if agent == Agent::Codex {
        " (in code mode a tool whose name the code computes at run time passes the LLM layer undecided)"
    } else {
        ""
    };
    format!(
        "MCP server {name:?} in {file} runs {runs:?} directly, not through `toolwall shim`: its tools are not filtered where they run{code_mode}; wrap it: command \"toolwall\", args [\"shim\", \"--server-id\", \"{name}\", \"--\", {runs:?}, ...its args] (`toolwall shim install` does it for you)"
    )
}

pub(super) mod install;
#[cfg(test)]
mod tests;
