//! The settings of one section each, checked with their line: a stdio server's egress, argument
//! rules, OTLP export and policy bundles.

use super::*;

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
