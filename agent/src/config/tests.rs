use std::{io::Write as _, net::SocketAddr};

use super::*;
use crate::config::describe;

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

#[test]
fn a_stdio_servers_egress_is_parsed_and_a_bad_entry_is_located() {
    let config = parse(
        "sandbox:\n  mcp:\n    servers:\n      - id: s\n        type: stdio\n        command: /bin/s\n        egress: ['127.0.0.53:53', '10.0.0.0/8', '[::1]:8080', '[fd00::/8]']\n",
    )
    .expect("valid");
    let egress = config.sandbox.mcp.servers[0].egress().expect("parsed");
    let rule = |addr: &str, prefix, port| EgressRule {
        addr: addr.parse().unwrap(),
        prefix,
        port,
    };
    assert_eq!(
        egress,
        Egress::Only(vec![
            rule("127.0.0.53", 32, 53),
            rule("10.0.0.0", 8, 0),
            rule("::1", 128, 8080),
            rule("fd00::", 8, 0),
        ])
    );
    let none = parse("sandbox:\n  mcp:\n    servers:\n      - id: s\n        type: stdio\n        command: /bin/s\n").unwrap();
    assert_eq!(
        none.sandbox.mcp.servers[0].egress(),
        Ok(Egress::Only(vec![]))
    );
    for bad in [
        "'::1'",
        "'10.0.0.0/33'",
        "'host.example:443'",
        "'1.2.3.4:x'",
        "any, '1.2.3.4'",
    ] {
        let text = error_text(&format!(
            "sandbox:\n  mcp:\n    servers:\n      - id: s\n        type: stdio\n        command: /bin/s\n        egress: [{bad}]\n"
        ));
        assert!(
            text.contains("egress") && text.contains("policy.yaml:4:"),
            "{bad}: {text}"
        );
    }
    let text = error_text(
        "sandbox:\n  mcp:\n    servers:\n      - id: n\n        type: http\n        url: http://127.0.0.1:1/mcp\n        user: nobody\n",
    );
    assert!(text.contains("`user` does not apply"), "{text}");
    let text = error_text(
        "sandbox:\n  mcp:\n    servers:\n      - id: s\n        type: stdio\n        command: /bin/s\n        cwd: relative\n",
    );
    assert!(text.contains("not an absolute path"), "{text}");
}

#[test]
fn a_bad_argument_rule_is_refused_with_its_file_line_and_what_to_do() {
    let rules = |when: &str| {
        format!(
            "sandbox:\n  mcp:\n    argument_rules:\n      - tool: write_file\n        action: block\n        when:\n{when}"
        )
    };
    let bad_regex = error_text(&rules(
        "          - pointer: /path\n            regex: '(unclosed'\n",
    ));
    assert!(
        bad_regex.contains("policy.yaml:7")
            && bad_regex.contains("argument_rules[0].when[0]")
            && bad_regex.contains("regex"),
        "{bad_regex}"
    );
    let two_tests = error_text(&rules(
        "          - pointer: /path\n            glob: '*'\n            present: true\n",
    ));
    assert!(two_tests.contains("exactly one test"), "{two_tests}");
    let not_pointer = error_text(&rules(
        "          - pointer: path\n            present: true\n",
    ));
    assert!(not_pointer.contains("not a JSON pointer"), "{not_pointer}");
    let relative = error_text(&rules(
        "          - pointer: /path\n            path_prefix: etc\n",
    ));
    assert!(relative.contains("absolute path"), "{relative}");
    let dotted = error_text(&rules(
        "          - pointer: /path\n            path_prefix: /etc/../var\n",
    ));
    assert!(dotted.contains("absolute path"), "{dotted}");
    let empty = error_text(
        "sandbox:\n  mcp:\n    argument_rules:\n      - tool: x\n        action: block\n        when: []\n",
    );
    assert!(empty.contains("at least one condition"), "{empty}");
    let range = error_text(&rules(
        "          - pointer: /n\n            range: { min: 5, max: 1 }\n",
    ));
    assert!(range.contains("above max"), "{range}");
    let action = error_text(
        "sandbox:\n  mcp:\n    argument_rules:\n      - tool: x\n        action: maybe\n        when:\n          - pointer: /a\n            present: true\n",
    );
    assert!(action.contains("maybe"), "{action}");
    // A prefix reached through a symlink names no call's real path.
    let dir = tempfile::tempdir().expect("dir");
    let real = dir.path().join("real");
    std::fs::create_dir(&real).expect("dir");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let linked = error_text(&rules(&format!(
        "          - pointer: /path\n            path_prefix: {}\n",
        link.display()
    )));
    assert!(
        linked.contains("symlink") && linked.contains("realpath"),
        "{linked}"
    );
    parse(&rules(&format!(
        "          - pointer: /path\n            path_prefix: {}\n",
        std::fs::canonicalize(&real).expect("real").display()
    )))
    .expect("the real directory is fine");
}

#[test]
fn otlp_settings_are_checked_with_their_line() {
    let ok = parse(
        "telemetry:\n  otlp:\n    endpoint: http://127.0.0.1:4318\n    protocol: http/protobuf\n    headers:\n      x-api-key: k\n    events: [mcp_tool_called]\n",
    )
    .expect("a good export section");
    let otlp = ok.telemetry.otlp.expect("otlp");
    assert_eq!(otlp.protocol, OtlpProtocol::HttpProtobuf);
    assert_eq!(
        (otlp.batch_size, otlp.interval_ms, otlp.spans),
        (512, 1000, true)
    );
    let cases: &[(&str, &str, &str)] = &[
        (
            "telemetry:\n  otlp:\n    endpoint: collector:4317\n",
            "policy.yaml:3:",
            "not an http:// or https:// URL",
        ),
        (
            "telemetry:\n  otlp:\n    endpoint: http://c:4317\n    protocol: otlp\n",
            "policy.yaml:4",
            "http/protobuf",
        ),
        (
            "telemetry:\n  otlp:\n    endpoint: http://c:4317\n    events: [mcp_tool_callled]\n",
            "policy.yaml:4:",
            "\"mcp_tool_callled\" is not an event type",
        ),
        (
            "telemetry:\n  otlp:\n    endpoint: http://c:4317\n    headers:\n      \"bad key\": v\n",
            "policy.yaml:",
            "cannot be sent",
        ),
        (
            "telemetry:\n  otlp:\n    endpoint: http://c:4317\n    tls:\n      ca_file: /etc/ca.pem\n",
            "policy.yaml:4:",
            "not https://",
        ),
        (
            "telemetry:\n  otlp:\n    endpoint: https://c:4317\n    tls:\n      ca_file: /nonexistent/ca.pem\n",
            "policy.yaml:5:",
            "cannot read /nonexistent/ca.pem",
        ),
        (
            "telemetry:\n  otlp:\n    endpoint: http://c:4317\n    batch_size: 0\n",
            "policy.yaml:4:",
            "between 1 and 10000",
        ),
    ];
    for (yaml, at, message) in cases {
        let text = error_text(yaml);
        assert!(
            text.starts_with(at) && text.contains(message),
            "{yaml}\n→ {text}"
        );
    }
}

#[test]
fn bundle_settings_are_checked_with_their_line() {
    let (_, public) = bundle::generate().expect("randomness");
    let ok = parse(&format!(
        "policy:\n  bundle:\n    url: https://p.example/b.json\n    public_key: \"{}\"\n",
        public.trim()
    ))
    .expect("a good bundle section");
    assert_eq!(ok.policy.bundle.expect("bundle").poll_secs, 60);
    let cases: &[(String, &str, &str)] = &[
        (
            format!(
                "policy:\n  bundle:\n    url: p.example/b.json\n    public_key: \"{}\"\n",
                public.trim()
            ),
            "policy.yaml:3:",
            "not an http:// or https:// URL",
        ),
        (
            "policy:\n  bundle:\n    url: https://p/b\n    public_key: ed25519:AAAA\n".into(),
            "policy.yaml:4:",
            "an ed25519 public key has 32",
        ),
        (
            format!(
                "policy:\n  bundle:\n    url: https://p/b\n    public_key: \"{}\"\n    poll_secs: 1\n",
                public.trim()
            ),
            "policy.yaml:5:",
            "between 5 and 86400",
        ),
    ];
    for (yaml, at, message) in cases {
        let text = error_text(yaml);
        assert!(
            text.starts_with(at) && text.contains(message),
            "{yaml}\n→ {text}"
        );
    }
}

#[test]
fn many_yaml_aliases_are_refused_with_the_line_of_the_first_past_the_limit() {
    // One anchored value and MAX_ALIASES + 1 aliases of it, one per line from line 5.
    let mut text =
        String::from("sandbox:\n  mcp:\n    name_patterns:\n      - &a \"{server}__{tool}\"\n");
    for _ in 0..=MAX_ALIASES {
        text.push_str("      - *a\n");
    }
    let error = error_text(&text);
    let line = 4 + MAX_ALIASES + 1;
    assert!(
        error.starts_with(&format!("policy.yaml:{line}:")),
        "the line of alias {}: {error}",
        MAX_ALIASES + 1
    );
    assert!(
        error.contains("aliases") && error.contains("hint:"),
        "{error}"
    );
    // Aliases in a flow list, on one line.
    let flow = format!(
        "sandbox:\n  mcp:\n    name_patterns: [&a \"{{server}}__{{tool}}\"{}]\n",
        ",*a".repeat(5_000)
    );
    assert!(error_text(&flow).starts_with("policy.yaml:3:"));
    // A big file allows fewer: each alias may expand to the whole file.
    let padding = format!("# {}\n", "x".repeat(900 * 1024));
    let big = format!(
        "{padding}{}",
        text.replace(&"      - *a\n".repeat(MAX_ALIASES - 20), "")
    );
    assert!(error_text(&big).contains("aliases"), "{}", error_text(&big));
}

#[test]
fn a_few_aliases_quoted_globs_comments_and_block_scalars_are_accepted() {
    let mut text = String::from(
        "# * a comment with * stars * is not an alias\nsandbox:\n  mcp:\n    denied_servers: [{id: \"*-beta\"}, {id: '*'}, {id: \"a\\\" *\"}]\n    argument_rules:\n      - tool: \"*\"\n        server: '*'\n        action: block\n        when:\n          - &cond {pointer: /path, glob: \"/etc/*\"}\n          - *cond\n        reason: >-\n",
    );
    // A block scalar's lines are text: bullets are not aliases.
    for _ in 0..2 * MAX_ALIASES {
        text.push_str("          * never * this\n");
    }
    text.push_str(
        "      - {tool: \"x\", action: block, when: [*cond, *cond], reason: \"* and *\"}  # *\n",
    );
    let config = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.sandbox.mcp.argument_rules.len(), 2);
    assert_eq!(config.sandbox.mcp.argument_rules[1].when.len(), 2);
    assert!(
        config.sandbox.mcp.argument_rules[0]
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("* never * this * never")),
        "{:?}",
        config.sandbox.mcp.argument_rules[0].reason
    );
}

/// Every key the configuration accepts, as dotted paths (`sandbox.mcp.servers[].url`), found by
/// tracing the `Deserialize` implementations themselves: a key added to a config type is in
/// this list without anyone remembering to add it.
fn accepted_keys() -> Vec<String> {
    use serde_reflection::{ContainerFormat, Format, Samples, Tracer, TracerConfig};
    let mut tracer = Tracer::new(TracerConfig::default());
    tracer
        .trace_type::<Config>(&Samples::new())
        .expect("trace the configuration's types");
    // Enums are traced by one variant only; their variants are values, not keys, so the
    // registry is taken as it is.
    let registry = tracer.registry_unchecked();

    fn walk(
        registry: &serde_reflection::Registry,
        format: &Format,
        path: &str,
        out: &mut Vec<String>,
    ) {
        match format {
            Format::TypeName(name) => {
                if let Some(ContainerFormat::Struct(fields)) = registry.get(name) {
                    for field in fields {
                        let key = if path.is_empty() {
                            field.name.clone()
                        } else {
                            format!("{path}.{}", field.name)
                        };
                        out.push(key.clone());
                        walk(registry, &field.value, &key, out);
                    }
                }
            }
            Format::Option(inner) => walk(registry, inner, path, out),
            Format::Seq(inner) => walk(registry, inner, &format!("{path}[]"), out),
            // Map keys are names the user picks (server ids, header names), not schema keys.
            Format::Map { value, .. } => walk(registry, value, &format!("{path}.*"), out),
            _ => {}
        }
    }
    let mut keys = Vec::new();
    walk(&registry, &Format::TypeName("Config".into()), "", &mut keys);
    keys
}

/// The dotted paths of the keys `default.yaml` writes, live or commented out: a comment whose
/// `#` starts its line is read as if the `#` were a space, so a commented example keeps its
/// place in the tree. List items add `[]` to their parent, flow mappings (`{min: 1, max: 2}`)
/// their keys.
fn written_paths() -> std::collections::BTreeSet<String> {
    let is_key =
        |key: &str| !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let join = |parent: &str, key: &str| {
        if parent.is_empty() {
            key.to_owned()
        } else {
            format!("{parent}.{key}")
        }
    };
    let mut out = std::collections::BTreeSet::new();
    // (indentation, path) of the keys the next line may sit under.
    let mut stack: Vec<(usize, String)> = Vec::new();
    for raw in DEFAULT_YAML.lines() {
        let line = match raw.trim_start().strip_prefix('#') {
            Some(rest) => format!("{} {rest}", &raw[..raw.len() - raw.trim_start().len()]),
            None => raw.to_owned(),
        };
        let indent = line.len() - line.trim_start().len();
        let mut rest = line.trim_start();
        let mut key_indent = indent;
        if let Some(item) = rest.strip_prefix("- ") {
            while stack.last().is_some_and(|(i, _)| *i >= indent) {
                stack.pop();
            }
            let parent = stack.last().map_or("", |(_, p)| p.as_str());
            stack.push((indent, format!("{parent}[]")));
            key_indent = indent + 2 + (item.len() - item.trim_start().len());
            rest = item.trim_start();
        }
        let Some((key, value)) = rest.split_once(':') else {
            continue;
        };
        if !is_key(key) {
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= key_indent) {
            stack.pop();
        }
        let path = join(stack.last().map_or("", |(_, p)| p.as_str()), key);
        if let Some(flow) = value.trim().strip_prefix('{') {
            for part in flow.split([',', '}']) {
                if let Some((inner, _)) = part.split_once(':')
                    && is_key(inner.trim())
                {
                    out.insert(join(&path, inner.trim()));
                }
            }
        }
        out.insert(path.clone());
        stack.push((key_indent, path));
    }
    out
}

/// `toolwall config default` is the reference: each key the configuration accepts is explained
/// there, at its place in the tree, as a live key or a commented example (`#  key:`), so a user
/// never meets a key that the default does not name. The test fails on a key added to a config
/// type and not to `default.yaml`, also when a key of the same name stands elsewhere.
#[test]
fn the_embedded_default_explains_every_accepted_key() {
    let keys = accepted_keys();
    assert!(
        keys.iter().any(|k| k == "sandbox.mcp.servers[].url"),
        "the trace reaches nested lists: {keys:?}"
    );
    let written = written_paths();
    assert!(
        written.contains("sandbox.mcp.servers[].url"),
        "commented examples are read at their place: {written:?}"
    );
    // `*` in an accepted path is a map's key, which the user names (a server id).
    let matches = |accepted: &str, written: &str| {
        let (a, w): (Vec<&str>, Vec<&str>) =
            (accepted.split('.').collect(), written.split('.').collect());
        a.len() == w.len() && a.iter().zip(&w).all(|(a, w)| *a == "*" || a == w)
    };
    let missing: Vec<&String> = keys
        .iter()
        .filter(|accepted| !written.iter().any(|w| matches(accepted, w)))
        .collect();
    assert!(
        missing.is_empty(),
        "keys the configuration accepts that `toolwall config default` does not explain at their place: {missing:?}"
    );
}
