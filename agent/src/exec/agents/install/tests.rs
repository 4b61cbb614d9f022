use super::*;

fn shim() -> Shim {
    Shim {
        toolwall: "/usr/local/bin/toolwall".to_owned(),
        config: Some("/etc/toolwall/config.yaml".to_owned()),
    }
}

/// Install wraps every stdio server of each agent's file format, names remote ones, and
/// uninstall gives back exactly the server's own command line.
#[test]
fn install_wraps_every_stdio_server_and_uninstall_gives_back_what_was_there() {
    let cases: [(Agent, &str); 4] = [
        (
            Agent::ClaudeCode,
            r#"{"mcpServers": {"fs": {"command": "npx", "args": ["-y", "@x/fs", "/tmp"], "env": {"A": "1"}}, "web": {"type": "http", "url": "https://x/mcp"}}, "projects": {"/p": {"mcpServers": {"p": {"command": "uvx", "args": ["srv"]}}}}}"#,
        ),
        (
            Agent::GeminiCli,
            r#"{"security": {"auth": {"selectedType": "gemini-api-key"}}, "mcpServers": {"fs": {"command": "node", "args": ["server.js"]}, "web": {"httpUrl": "https://x/mcp"}}}"#,
        ),
        (
            Agent::QwenCode,
            r#"{"mcpServers": {"fs": {"command": "python3", "args": ["-m", "srv"], "alwaysLoadTools": true}}}"#,
        ),
        (
            Agent::OpenCode,
            r#"{"mcp": {"fs": {"type": "local", "command": ["npx", "-y", "srv"]}, "web": {"type": "remote", "url": "https://x/mcp"}}}"#,
        ),
    ];
    for (agent, text) in cases {
        let (wrapped, report) = edit_json(agent, text, &shim(), true).expect("install");
        assert!(
            report.changed.contains(&"fs".to_owned()),
            "{agent:?}: {report:?}"
        );
        let v: Value = serde_json::from_str(&wrapped).expect("json");
        let fs = if agent == Agent::OpenCode {
            &v["mcp"]["fs"]
        } else {
            &v["mcpServers"]["fs"]
        };
        let line = fs.to_string();
        assert!(
            line.contains("/usr/local/bin/toolwall")
                && line.contains("\"--server-id\",\"fs\",\"--\"")
                && line.contains("/etc/toolwall/config.yaml"),
            "{agent:?}: {line}"
        );
        // A second install changes nothing; uninstall gives the original back.
        let (_, again) = edit_json(agent, &wrapped, &shim(), true).expect("again");
        assert!(again.changed.is_empty(), "{agent:?}: {again:?}");
        let (restored, back) = edit_json(agent, &wrapped, &shim(), false).expect("uninstall");
        assert_eq!(back.changed.len(), report.changed.len(), "{agent:?}");
        assert_eq!(
            serde_json::from_str::<Value>(&restored).expect("json"),
            serde_json::from_str::<Value>(text).expect("json"),
            "{agent:?}"
        );
        if agent != Agent::QwenCode {
            assert_eq!(report.remote, ["web"], "{agent:?}");
        }
    }
    let (_, claude) = edit_json(Agent::ClaudeCode, cases[0].1, &shim(), true).expect("claude");
    assert_eq!(claude.changed, ["fs", "p"], "per-project servers too");
}

#[test]
fn codex_toml_keeps_its_comments_and_layout() {
    let text = "# my settings\nmodel = \"gpt\"\n\n[mcp_servers.fs] # the files\ncommand = \"npx\"\nargs = [\"-y\", \"srv\"]\n\n[mcp_servers.web]\nurl = \"https://x/mcp\"\n";
    let (wrapped, report) = edit_toml(text, &shim(), true).expect("install");
    assert_eq!(
        (report.changed.as_slice(), report.remote.as_slice()),
        (&["fs".to_owned()][..], &["web".to_owned()][..])
    );
    assert!(
        wrapped.starts_with("# my settings\nmodel = \"gpt\"\n"),
        "{wrapped}"
    );
    assert!(wrapped.contains("# the files"), "{wrapped}");
    assert!(
        wrapped.contains("command = \"/usr/local/bin/toolwall\""),
        "{wrapped}"
    );
    let (restored, _) = edit_toml(&wrapped, &shim(), false).expect("uninstall");
    let parsed = |t: &str| t.parse::<toml::Table>().expect("toml");
    assert_eq!(parsed(&restored), parsed(text));
}

#[test]
fn a_file_is_backed_up_once_and_replaced_whole() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("settings.json");
    let original = r#"{"mcpServers": {"fs": {"command": "npx", "args": ["srv"]}}}"#;
    std::fs::write(&file, original).expect("write");
    let report = edit_file(Agent::GeminiCli, &file, &shim(), true, true).expect("dry run");
    assert_eq!(report.changed, ["fs"]);
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        original,
        "a dry run changes nothing"
    );
    edit_file(Agent::GeminiCli, &file, &shim(), true, false).expect("install");
    let backup = dir.path().join("settings.json.toolwall-backup");
    assert_eq!(std::fs::read_to_string(&backup).expect("backup"), original);
    edit_file(Agent::GeminiCli, &file, &shim(), false, false).expect("uninstall");
    edit_file(Agent::GeminiCli, &file, &shim(), true, false).expect("install again");
    assert_eq!(
        std::fs::read_to_string(&backup).expect("backup"),
        original,
        "the first copy stays"
    );
    assert!(!dir.path().join("settings.json.toolwall-new").exists());
    assert!(agent_named("cursor").is_err());
}
