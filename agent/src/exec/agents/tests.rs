use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use super::*;

fn envs(cmd: &Command) -> Vec<(String, String)> {
    cmd.get_envs()
        .filter_map(|(k, v)| {
            Some((
                k.to_string_lossy().into_owned(),
                v?.to_string_lossy().into_owned(),
            ))
        })
        .collect()
}

#[test]
fn each_agent_is_pointed_at_the_proxy_the_way_it_reads_it() {
    let proxy = "http://127.0.0.1:18080/s/k3y";
    let run = |program: &str| {
        let mut cmd = Command::new(program);
        let mut args: Vec<OsString> = vec!["exec".into()];
        point_at_proxy(Agent::of(program.as_ref()), proxy, &mut cmd, &mut args);
        (envs(&cmd), args)
    };
    let (env, args) = run("/usr/bin/claude");
    assert!(env.contains(&("ANTHROPIC_BASE_URL".into(), proxy.into())));
    assert!(env.contains(&("OPENAI_BASE_URL".into(), format!("{proxy}/v1"))));
    assert!(env.contains(&("GOOGLE_GEMINI_BASE_URL".into(), proxy.into())));
    assert_eq!(args, [OsString::from("exec")]);
    // OpenCode appends `/messages` to its Anthropic base URL.
    let (env, _) = run("opencode");
    assert!(env.contains(&("ANTHROPIC_BASE_URL".into(), format!("{proxy}/v1"))));
    // Codex ignores OPENAI_BASE_URL.
    let (_, args) = run("codex");
    assert_eq!(
        args,
        ["-c", &format!("openai_base_url=\"{proxy}/v1\""), "exec"].map(OsString::from)
    );
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
    std::fs::write(path, text).expect("write");
}

#[test]
fn servers_outside_the_shim_are_named_in_every_agents_configuration() {
    let home = tempfile::tempdir().expect("home");
    let cwd = tempfile::tempdir().expect("cwd");
    let (home, cwd) = (home.path(), cwd.path());
    let shim = r#"{"command": "/usr/local/bin/toolwall", "args": ["shim", "--server-id", "ok", "--", "npx"]}"#;
    let raw = r#"{"command": "npx", "args": ["-y", "server"]}"#;
    write(
        &cwd.join(".mcp.json"),
        &format!(r#"{{"mcpServers": {{"ok": {shim}, "claude-raw": {raw}}}}}"#),
    );
    write(
        &home.join(".claude.json"),
        &format!(
            r#"{{"projects": {{"{}": {{"mcpServers": {{"project-raw": {raw}}}}}}}}}"#,
            cwd.display()
        ),
    );
    write(
        &home.join(".gemini/settings.json"),
        &format!(
            r#"{{"mcpServers": {{"gemini-raw": {raw}, "remote": {{"httpUrl": "https://mcp.example/mcp"}}, "ok": {shim}}}}}"#
        ),
    );
    write(
        &cwd.join(".qwen/settings.json"),
        &format!(r#"{{"mcpServers": {{"qwen-raw": {raw}}}}}"#),
    );
    write(
        &cwd.join("opencode.json"),
        r#"{"mcp": {"oc-raw": {"type": "local", "command": ["npx", "server"]}, "oc-ok": {"type": "local", "command": ["toolwall", "shim", "--", "npx"]}, "off": {"type": "local", "command": ["x"], "enabled": false}}}"#,
    );
    write(
        &home.join(".codex/config.toml"),
        "[mcp_servers.codex-raw]\ncommand = \"npx\"\n[mcp_servers.ok]\ncommand = \"toolwall\"\nargs = [\"shim\", \"--\", \"npx\"]\n",
    );
    let names = |agent| {
        let mut n: Vec<String> = unshimmed_servers(agent, home, cwd)
            .into_iter()
            .map(|s| s.name)
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(Agent::ClaudeCode), ["claude-raw", "project-raw"]);
    assert_eq!(names(Agent::GeminiCli), ["gemini-raw", "remote"]);
    assert_eq!(names(Agent::QwenCode), ["qwen-raw"]);
    assert_eq!(names(Agent::OpenCode), ["oc-raw"]);
    if std::env::var_os("CODEX_HOME").is_none() {
        assert_eq!(names(Agent::Codex), ["codex-raw"]);
    }
    // Another program may be any of them: every agent's files are read.
    assert!(names(Agent::Other).len() >= 6);
    let remote = unshimmed_servers(Agent::GeminiCli, home, cwd)
        .into_iter()
        .find(|s| s.remote)
        .expect("remote");
    assert!(warning(Agent::GeminiCli, &remote).contains("toolwall mcp-proxy"));
    let local = unshimmed_servers(Agent::Codex, home, cwd)
        .into_iter()
        .next();
    if let Some(local) = local {
        let text = warning(Agent::Codex, &local);
        assert!(
            text.contains("code mode") && text.contains("config.toml"),
            "{text}"
        );
    }
}

#[test]
fn gemini_cli_is_told_whether_its_sign_in_reaches_the_proxy() {
    let home = tempfile::tempdir().expect("home");
    let cwd = tempfile::tempdir().expect("cwd");
    let warnings = |home: &Path| {
        coverage(Agent::GeminiCli, "http://p", home, cwd.path())
            .into_iter()
            .filter_map(Result::err)
            .collect::<Vec<_>>()
    };
    if std::env::var_os("GEMINI_CLI_HOME").is_some() {
        return;
    }
    assert_eq!(warnings(home.path()).len(), 1, "no settings: told how");
    write(
        &home.path().join(".gemini/settings.json"),
        r#"{"security": {"auth": {"selectedType": "oauth-personal"}}}"#,
    );
    assert!(warnings(home.path())[0].contains("oauth-personal"));
    write(
        &home.path().join(".gemini/settings.json"),
        r#"{"security": {"auth": {"selectedType": "gemini-api-key"}}}"#,
    );
    assert!(warnings(home.path()).is_empty());
}
