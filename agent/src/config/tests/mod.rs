use std::{io::Write as _, net::SocketAddr};

use super::*;
use crate::config::describe;

mod sections;
mod yaml;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, "policy.yaml")
}

fn error_text(text: &str) -> String {
    match parse(text) {
        Ok(config) => panic!("expected an error, got {config:?}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn embedded_default_allows_everything_and_records() {
    let config = Config::load(None).expect("embedded default is valid");
    let mcp = &config.sandbox.mcp;
    assert!(mcp.servers.is_empty());
    assert!(mcp.enforce_policy);
    assert!(!mcp.fail_closed);
    assert_eq!(mcp.server_policy, ListPolicy::None);
    assert_eq!(mcp.tool_policy, ListPolicy::None);
    assert!(mcp.denied_tools.is_empty() && mcp.denied_servers.is_empty() && mcp.deny.is_empty());
    assert!(!mcp.version_pinning.enabled);
    assert!(!mcp.rate_limits.enabled);
    assert_eq!(config.proxy.mode, ProxyMode::Embedded);
    assert_eq!(
        config.proxy.listen,
        "127.0.0.1:18080".parse::<SocketAddr>().expect("addr")
    );
    assert_eq!(
        config.proxy.providers.anthropic,
        "https://api.anthropic.com"
    );
    assert_eq!(config.proxy.providers.openai, "https://api.openai.com");
    assert_eq!(config.origin, EMBEDDED_ORIGIN);
}

#[test]
fn embedded_default_equals_the_built_in_defaults() {
    // A file that leaves every section out means the same as the embedded default.
    let mut embedded = Config::load(None).expect("default");
    let mut empty = parse("# nothing\n").expect("empty file");
    embedded.origin.clear();
    empty.origin.clear();
    assert_eq!(embedded, empty);
    assert!(empty.netmon.enabled && !empty.netmon.deny_direct && !empty.netmon.pin_llm_egress);
    assert_eq!(empty.netmon.resolve_interval_secs, 60);
    assert_eq!(empty.api.listen.to_string(), "127.0.0.1:18081");
    assert_eq!(empty.api.socket, None);
    assert_eq!(empty.correlator.window_ms, 2000);
    assert_eq!(empty.interceptor.on_malformed, OnMalformed::FailClosed);
    assert_eq!(empty.interceptor.max_stream_buffer_bytes, 8 * 1024 * 1024);
}

const SEED_EXAMPLE: &str = r#"
sandbox:
  mcp:
    enforce_policy: true
    fail_closed: true
    servers:
      - id: filesystem
        type: stdio
        command: npx
        args: ["@modelcontextprotocol/server-filesystem", "/home/user"]
      - id: weather-api
        type: http
        url: https://mcp.example.com/sse
      - id: internal-tools
        type: http
        url: https://mcp.internal.corp:8443/mcp
        tls_fingerprint: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        via_proxy: true
    server_policy: allowlist
    allowed_servers:
      - id: filesystem
      - id: weather-api
    denied_servers:
      - id: "*"
    tool_policy: denylist
    allowed_tools:
      - server: "*"
        tool: "*"
    denied_tools:
      - server: weather-api
        tool: "delete_*"
      - server: "*"
        tool: "execute_command"
        content_hash: "SHA256:ABCDEFABCDEFABCDEFABCDEFABCDEFABCDEFABCDEFABCDEFABCDEFABCDEFABCD"
    deny: ["^exec", "_database$"]
    name_patterns: ["{server}.{tool}"]
    version_pinning:
      enabled: true
      on_change: alert
      auto_trust_first: true
    rate_limits:
      enabled: true
      default_rpm: 60
      per_server:
        weather-api:
          calls_per_minute: 10
          burst: 3
proxy:
  mode: mcp-only
store:
  path: /tmp/tw.db
netmon:
  deny_direct: true
interceptor:
  on_malformed: fail_open
"#;

#[test]
fn seed_example_parses() {
    let config = parse(SEED_EXAMPLE).expect("seed example is valid");
    let mcp = &config.sandbox.mcp;
    assert_eq!(mcp.servers.len(), 3);
    assert_eq!(mcp.servers[0].server_type, ServerType::Stdio);
    assert_eq!(mcp.servers[1].addr(), "mcp.example.com:443");
    assert_eq!(mcp.servers[2].addr(), "mcp.internal.corp:8443");
    assert_eq!(mcp.servers[2].via_proxy, Some(true));
    assert_eq!(mcp.server_policy, ListPolicy::Allowlist);
    // Content hashes are normalized to bare lowercase hex.
    assert_eq!(
        mcp.denied_tools[1].content_hash.as_deref(),
        Some("abcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcd")
    );
    assert_eq!(mcp.allowed_tools[0].server, "*");
    assert_eq!(mcp.version_pinning.on_change, OnChange::Alert);
    assert_eq!(mcp.rate_limits.per_server["weather-api"].burst, Some(3));
    assert_eq!(config.proxy.mode, ProxyMode::McpOnly);
    assert_eq!(config.store_path(), std::path::PathBuf::from("/tmp/tw.db"));
    assert!(config.netmon.deny_direct);
    assert!(
        !config.must_use_proxy(&mcp.servers[0]),
        "stdio is never proxied"
    );
    assert!(
        config.must_use_proxy(&mcp.servers[1]),
        "netmon.deny_direct default"
    );
    let mut relaxed = config.clone();
    relaxed.netmon.deny_direct = false;
    assert!(!relaxed.must_use_proxy(&relaxed.sandbox.mcp.servers[1]));
    assert!(
        relaxed.must_use_proxy(&relaxed.sandbox.mcp.servers[2]),
        "via_proxy overrides"
    );
    assert_eq!(config.interceptor.on_malformed, OnMalformed::FailOpen);

    let described = describe(&config);
    for want in [
        "filesystem stdio: npx",
        "weather-api http: https://mcp.example.com/sse (mcp.example.com:443)",
        "direct connections denied (via_proxy)",
        "allowlist",
        "denied_tools[0]: server \"weather-api\", tool \"delete_*\"",
        "deny[0]: \"^exec\"",
        "version pinning: on",
        "weather-api: 10 calls/min, burst 3",
        "LLM proxy: mcp-only on 127.0.0.1:18080",
        "store: /tmp/tw.db",
    ] {
        assert!(
            described.contains(want),
            "missing {want:?} in:\n{described}"
        );
    }
}

#[test]
fn unknown_key_names_file_line_and_key() {
    let text = "sandbox:\n  mcp:\n    enforce_polcy: true\n";
    let error = error_text(text);
    assert!(error.starts_with("policy.yaml:3:"), "{error}");
    assert!(error.contains("unknown field `enforce_polcy`"), "{error}");
    assert!(error.contains("sandbox.mcp"), "{error}");
    assert!(error.contains("hint:"), "{error}");
}

#[test]
fn misspelt_rule_key_is_an_error_not_a_silent_no_op() {
    let text = "sandbox:\n  mcp:\n    denied_tools:\n      - server: \"*\"\n        tool: exec\n        contnet_hash: abc\n";
    let error = error_text(text);
    assert!(error.starts_with("policy.yaml:6:"), "{error}");
    assert!(error.contains("unknown field `contnet_hash`"), "{error}");
}

#[test]
fn bad_enum_value_lists_the_valid_ones() {
    let error = error_text("sandbox:\n  mcp:\n    server_policy: alowlist\n");
    assert!(error.starts_with("policy.yaml:3:"), "{error}");
    assert!(error.contains("unknown variant `alowlist`"), "{error}");
    assert!(error.contains("allowlist"), "{error}");
    let error = error_text("proxy:\n  mode: full\n");
    assert!(error.starts_with("policy.yaml:2:"), "{error}");
    assert!(error.contains("mcp-only"), "{error}");
}

#[test]
fn semantic_errors_name_line_key_and_fix() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "sandbox:\n  mcp:\n    servers:\n      - id: fs\n        type: stdio\n",
            "policy.yaml:4:",
            &[
                "sandbox.mcp.servers[0].command",
                "has no `command`",
                "hint:",
            ],
        ),
        (
            "sandbox:\n  mcp:\n    servers:\n      - id: web\n        type: http\n",
            "policy.yaml:4:",
            &["servers[0].url", "has no `url`"],
        ),
        (
            "sandbox:\n  mcp:\n    servers:\n      - id: web\n        type: sse\n        url: https://x/sse\n        command: node\n",
            "policy.yaml:4:",
            &["servers[0].command", "do not apply"],
        ),
        (
            "sandbox:\n  mcp:\n    servers:\n      - id: fs\n        type: stdio\n        command: x\n        url: http://a/\n",
            "policy.yaml:4:",
            &["servers[0].url", "does not apply to stdio"],
        ),
        (
            "sandbox:\n  mcp:\n    servers:\n      - id: a\n        type: stdio\n        command: x\n      - id: a\n        type: stdio\n        command: y\n",
            "policy.yaml:7:",
            &["servers[1].id", "duplicate server id \"a\""],
        ),
        (
            "sandbox:\n  mcp:\n    servers:\n      - id: a\n        type: stdio\n        command: x\n      - id: \"everything \"\n        type: stdio\n        command: y\n",
            "policy.yaml:7:",
            &[
                "servers[1].id",
                "server id \"everything \" is not 1 to 128 characters",
                "hint:",
            ],
        ),
        (
            "sandbox:\n  mcp:\n    servers:\n      - id: everything\n        type: stdio\n        command: x\n      - id: Everything\n        type: stdio\n        command: y\n",
            "policy.yaml:7:",
            &["servers[1].id", "differs from \"everything\" only in case"],
        ),
        (
            "sandbox:\n  mcp:\n    servers:\n      - id: w\n        type: http\n        url: ftp://x\n",
            "policy.yaml:6:",
            &["servers[0].url", "not an http:// or https:// URL"],
        ),
        (
            "sandbox:\n  mcp:\n    deny:\n      - \"^ok\"\n      - \"(unclosed\"\n",
            "policy.yaml:5:",
            &["sandbox.mcp.deny[1]", "invalid regex"],
        ),
        (
            "sandbox:\n  mcp:\n    deny:\n      - '(\\w{100}){100}'\n",
            "policy.yaml:4:",
            &["sandbox.mcp.deny[0]", "compiles to more than"],
        ),
        (
            "sandbox:\n  mcp:\n    name_patterns: [\"{tool}.{server}\"]\n",
            "policy.yaml:3:",
            &["name_patterns[0]", "before"],
        ),
        (
            "sandbox:\n  mcp:\n    denied_tools:\n      - tool: x\n        content_hash: nothex\n",
            "policy.yaml:5:",
            &["denied_tools[0].content_hash", "not a SHA-256"],
        ),
        (
            "sandbox:\n  mcp:\n    rate_limits:\n      default_rpm: 0\n",
            "policy.yaml:4:",
            &["rate_limits.default_rpm"],
        ),
        (
            "correlator:\n  window_ms: 0\n",
            "policy.yaml:2:",
            &["correlator.window_ms"],
        ),
        (
            "proxy:\n  providers:\n    openai: api.openai.com\n",
            "policy.yaml:3:",
            &["proxy.providers.openai"],
        ),
        (
            "api:\n  socket: run/api.sock\n",
            "policy.yaml:2:",
            &["api.socket", "is a relative path", "/run/toolwall/api.sock"],
        ),
    ];
    for (text, at, wants) in cases {
        let error = error_text(text);
        assert!(error.starts_with(at), "want {at}: {error}");
        for want in *wants {
            assert!(error.contains(want), "want {want:?}: {error}");
        }
    }
}

#[test]
fn invalid_yaml_and_wrong_types_are_located() {
    let error = error_text("proxy:\n  listen: not-an-address\n");
    assert!(error.starts_with("policy.yaml:2:"), "{error}");
    let error = error_text("sandbox:\n  mcp:\n    fail_closed: [\n");
    assert!(error.starts_with("policy.yaml:"), "{error}");
}

#[test]
fn load_reads_files_and_names_them_in_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, SEED_EXAMPLE).expect("write");
    let config = Config::load(Some(&good)).expect("valid file");
    assert_eq!(config.origin, good.display().to_string());

    let bad = dir.path().join("bad.yaml");
    let mut file = std::fs::File::create(&bad).expect("create");
    writeln!(file, "store:\n  paht: /x").expect("write");
    let error = Config::load(Some(&bad)).expect_err("typo").to_string();
    assert!(
        error.starts_with(&format!("{}:2:", bad.display())),
        "{error}"
    );
    assert!(error.contains("unknown field `paht`"), "{error}");

    let missing = dir.path().join("missing.yaml");
    let error = Config::load(Some(&missing))
        .expect_err("missing")
        .to_string();
    assert!(error.contains("missing.yaml: cannot read"), "{error}");
}

#[test]
fn url_host_port_forms() {
    let cases = [
        ("https://a.example", "a.example:443"),
        ("http://a.example/mcp", "a.example:80"),
        ("http://a.example:8080/mcp?x=1", "a.example:8080"),
        ("https://user@a.example:9/x", "a.example:9"),
        ("http://[::1]:8080/", "[::1]:8080"),
        ("http://[::1]/", "[::1]:80"),
        ("ftp://a", ""),
        ("https:///x", ""),
    ];
    for (url, want) in cases {
        assert_eq!(servers::url_host_port(url), want, "{url}");
    }
}

#[test]
fn find_line_handles_lists_quotes_and_repeats() {
    let text = "a:\n  - id: x\n  - id: \"y\"\n  - id: x # again\ndeny:\n  - '^a'\n";
    assert_eq!(validate::find_line(text, "id", "x", 0), Some(2));
    assert_eq!(validate::find_line(text, "id", "x", 1), Some(4));
    assert_eq!(validate::find_line(text, "id", "y", 0), Some(3));
    assert_eq!(validate::find_line(text, "", "^a", 0), Some(6));
    assert_eq!(validate::find_line(text, "id", "zzz", 0), None);
}
