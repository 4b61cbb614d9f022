//! What the real-agent tests share: the fake model (`tests/peers/fake_llm.py`), a daemon whose
//! proxy forwards every provider to it, `toolwall exec` as a user runs it, and the records
//! every agent's run must leave.

#![allow(dead_code)]

use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;
use toolwall_tests::{Daemon, peers_dir, server_everything, toolwall_bin};

/// Claude Code without a key of its own or traffic besides its model's.
pub const CLAUDE_QUIET: &[(&str, &str)] = &[
    ("ANTHROPIC_API_KEY", "sk-test"),
    // Its MCP servers get time to start on a busy machine (a Python server under load took
    // longer than Claude Code's default and its tools were not offered).
    ("MCP_TIMEOUT", "60000"),
    // and `-p` waits for them: by default it starts the first turn while they still connect,
    // offering only a `WaitForMcpServers` tool, and a slow server's tools miss that turn.
    ("MCP_CONNECTION_NONBLOCKING", "0"),
    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ("DISABLE_AUTOUPDATER", "1"),
    ("DISABLE_TELEMETRY", "1"),
    ("DISABLE_ERROR_REPORTING", "1"),
];

/// The fake model, logging every request into `dir`; killed on drop.
pub struct FakeLlm {
    child: std::process::Child,
    pub url: String,
    log: std::path::PathBuf,
}

impl FakeLlm {
    pub fn start(dir: &Path) -> FakeLlm {
        Self::start_with(dir, &[])
    }

    /// [`FakeLlm::start`] with `env` (`FAKE_LLM_ECHO`: what its model asks `echo` to say).
    pub fn start_with(dir: &Path, env: &[(&str, &str)]) -> FakeLlm {
        let log = dir.join("requests.jsonl");
        let port_file = dir.join("port");
        let child = Command::new("python3")
            .envs(env.iter().copied())
            .arg(toolwall_tests::workspace_root().join("tests/peers/fake_llm.py"))
            .arg("--log")
            .arg(&log)
            .arg("--port-file")
            .arg(&port_file)
            .spawn()
            .expect("start fake_llm.py");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let port = loop {
            if let Ok(port) = std::fs::read_to_string(&port_file) {
                break port;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "fake_llm.py did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        FakeLlm {
            child,
            url: format!("http://127.0.0.1:{}", port.trim()),
            log,
        }
    }

    /// Every request the agent's model got, in order.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn agent_bin(name: &str) -> std::path::PathBuf {
    let bin = peers_dir().join("node/node_modules/.bin").join(name);
    assert!(
        bin.exists(),
        "{} is missing: run `cargo xtask peers`",
        bin.display()
    );
    bin
}

/// A daemon whose proxy forwards every provider to `llm` and whose policy denies `get-sum`.
pub fn daemon(llm: &str) -> Daemon {
    daemon_with(llm, r#"deny: ["^get-sum$"]"#)
}

/// [`daemon`] with `policy` (YAML under `sandbox.mcp`, indented by four) instead of the deny.
pub fn daemon_with(llm: &str, policy: &str) -> Daemon {
    Daemon::start(&format!(
        r#"proxy:
  listen: 127.0.0.1:0
  providers:
    anthropic: {llm}
    openai: {llm}
    gemini: {llm}
sandbox:
  mcp:
    {policy}
    servers:
      - id: everything
        type: stdio
        command: {everything}
        args: [stdio]
"#,
        everything = server_everything().display()
    ))
}

/// The shim command line the agents start their MCP server with.
pub fn shim_args(daemon: &Daemon) -> Vec<String> {
    vec![
        "shim".into(),
        "--config".into(),
        daemon.config.display().to_string(),
        "--server-id".into(),
        "everything".into(),
        "--".into(),
        server_everything().display().to_string(),
        "stdio".into(),
    ]
}

/// `toolwall exec --session NAME -- program args...` in a fresh home, with `env`.
pub fn exec(
    daemon: &Daemon,
    session: &str,
    home: &Path,
    env: &[(&str, &str)],
    program: &Path,
    args: &[String],
) -> std::process::Output {
    let mut cmd = Command::new(toolwall_bin());
    cmd.args(["exec", "--as-root", "--session", session, "--config"])
        .arg(&daemon.config)
        .arg("--")
        .arg(program)
        .args(args)
        .current_dir(home)
        .env("HOME", home)
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("GOOGLE_GEMINI_BASE_URL")
        .stdin(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run toolwall exec");
    println!(
        "{session}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `claude -p PROMPT` with only the MCP servers of `mcp_path` and `allowed` tools allowed.
pub fn claude_args(mcp_path: &Path, prompt: &str, allowed: &str) -> Vec<String> {
    [
        "-p",
        prompt,
        "--mcp-config",
        &mcp_path.display().to_string(),
        "--strict-mcp-config",
        "--allowedTools",
        allowed,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// `codex exec` non-interactive, its MCP server `everything` started as `command args`, with
/// `prompt`.
pub fn codex_args(command: &str, args: &[String], prompt: &str) -> Vec<String> {
    let args = args
        .iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(",");
    [
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--disable",
        "plugins",
        "-c",
        "analytics.enabled=false",
        "-c",
        "check_for_update_on_startup=false",
        // A model outside Codex's catalog gets the MCP tools offered directly.
        "-m",
        "fake-model",
        "-c",
    ]
    .map(str::to_owned)
    .into_iter()
    .chain([
        format!("mcp_servers.everything.command={command:?}"),
        "-c".to_owned(),
        format!("mcp_servers.everything.args=[{args}]"),
        // The first turn waits for the server (by default it starts without a server still
        // connecting on a busy machine, and its tools miss that turn), given time to start.
        "-c".to_owned(),
        "mcp_servers.everything.required=true".to_owned(),
        "-c".to_owned(),
        "mcp_servers.everything.startup_timeout_sec=60".to_owned(),
        prompt.to_owned(),
    ])
    .collect()
}

/// Codex's home and keys under `home`.
pub fn codex_env(home: &Path) -> Vec<(&'static str, String)> {
    let codex_home = home.join(".codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    vec![
        ("CODEX_HOME", codex_home.display().to_string()),
        // With `openai_base_url` (what exec sets), Codex reads its key from CODEX_API_KEY.
        ("CODEX_API_KEY", "sk-test".into()),
        ("OPENAI_API_KEY", "sk-test".into()),
    ]
}

/// `toolwall mcp calls --json --session S` once the correlation window has passed.
pub fn calls(daemon: &Daemon, session: &str) -> Vec<Value> {
    std::thread::sleep(Duration::from_millis(2500));
    let records = daemon.json_lines(&["mcp", "calls", "--json", "--session", session]);
    for r in &records {
        println!(
            "call: {} {} {} {} llm={} exec={}",
            r["server_id"],
            r["tool"],
            r["kind"],
            r["action"],
            r["intercept"]["layer"],
            r["execution"]["layer"]
        );
    }
    records
}

/// The allowed call joined across the LLM layer and the shim; the denied one blocked at the
/// LLM layer with no execution.
pub fn assert_calls(records: &[Value], llm_layer: &str) {
    let find = |tool: &str| {
        records
            .iter()
            .find(|r| r["server_id"] == "everything" && r["tool"] == tool)
            .unwrap_or_else(|| panic!("no record for everything/{tool} in {records:#?}"))
    };
    let echo = find("echo");
    assert_eq!(echo["kind"], "joined", "{echo:#}");
    assert_eq!(echo["action"], "allow");
    assert_eq!(echo["intercept"]["layer"], llm_layer);
    assert_eq!(echo["execution"]["layer"], "shim");
    let sum = find("get-sum");
    assert_eq!(sum["kind"], "intercept_only", "{sum:#}");
    assert_eq!(sum["action"], "block");
    assert!(
        records
            .iter()
            .all(|r| !(r["tool"] == "get-sum" && r["execution"].is_object())),
        "get-sum must never run: {records:#?}"
    );
}
