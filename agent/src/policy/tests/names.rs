//! Names: bare, agent and sanitised name forms, and names no registry knows.

use super::*;

#[test]
fn ambiguous_bare_names() {
    let setup = |extra: &str| {
        let policy = policy(&format!("{SERVERS}{extra}"));
        policy.check_listed_all("filesystem", "stdio", &[tool("search", "Files")]);
        policy.check_listed_all("weather-api", "http", &[tool("search", "Weather")]);
        policy
    };
    let closed = setup("    fail_closed: true\n");
    assert_decision(
        &closed.check_call(&call("search")),
        Action::Block,
        r#"ambiguous tool name "search": offered by servers "filesystem", "weather-api" (fail closed)"#,
    );
    // The qualified forms are not ambiguous.
    assert_decision(
        &closed.check_call(&call("mcp__weather-api__search")),
        Action::Allow,
        "",
    );
    assert_decision(
        &closed.check_call(&on("filesystem", "search")),
        Action::Allow,
        "",
    );

    let open = setup("");
    assert_decision(
        &open.check_call(&call("search")),
        Action::Allow,
        r#"ambiguous tool name "search" (servers "filesystem", "weather-api"); allowed by every one"#,
    );
    let one_denies = setup("    denied_tools: [{server: weather-api, tool: search}]\n");
    let decision = one_denies.check_call(&call("search"));
    assert_decision(
        &decision,
        Action::Block,
        r#"on "weather-api": tool denied by denied_tools[0]"#,
    );
}

#[test]
fn agent_name_forms_reach_the_rules() {
    let yaml = r#"
sandbox:
  mcp:
    servers:
      - {id: everything, type: stdio, command: everything}
    denied_tools: [{server: everything, tool: get-sum}]
    name_patterns: ["{server}.{tool}"]
"#;
    let policy = policy(yaml);
    policy.check_listed_all(
        "everything",
        "stdio",
        &[tool("get-sum", "Adds"), tool("echo", "Echoes")],
    );
    let codex = CallQuery {
        server_id: None,
        name: "get_sum",
        namespace: Some("mcp__everything"),
        stage: CallStage::Proposed,
        arguments: None,
    };
    for query in [
        call("get-sum"),
        call("mcp__everything__get-sum"),
        call("everything.get-sum"),
        on("everything", "get-sum"),
        codex,
    ] {
        let decision = policy.check_call(&query);
        assert_decision(&decision, Action::Block, "denied_tools[0]");
        assert_eq!(decision.tool.map(|t| t.tool).as_deref(), Some("get-sum"));
    }
    assert_decision(
        &policy.check_call(&call("mcp__everything__echo")),
        Action::Allow,
        "",
    );
}

#[test]
fn a_declared_servers_tool_is_judged_before_its_shim_ever_listed_it() {
    // The model can name a stdio server's tool before the shim has registered anything: the
    // name's form points at a declared server, so the rules apply; it is not a native tool.
    let p = policy(
        r#"
sandbox:
  mcp:
    deny: ["^get-sum$"]
    servers:
      - id: everything
        type: stdio
        command: server-everything
"#,
    );
    let blocked = p.check_call(&call("mcp__everything__get-sum"));
    assert!(blocked.is_blocked(), "{blocked:?}");
    assert_eq!(
        blocked.tool.as_ref().map(|t| t.tool.as_str()),
        Some("get-sum")
    );
    let allowed = p.check_call(&call("mcp__everything__echo"));
    assert!(!allowed.is_blocked());
    assert_eq!(
        allowed.tool.as_ref().map(|t| t.server_id.as_str()),
        Some("everything"),
        "identified, so recorded"
    );
    // A server nobody declared stays unknown (not MCP) without fail_closed.
    assert!(p.check_call(&call("mcp__other__get-sum")).tool.is_none());
}

#[test]
fn codex_underscored_names_of_unregistered_tools_meet_rules_on_the_hyphenated_name() {
    let p = policy(
        r#"
sandbox:
  mcp:
    deny: ["^get-sum$"]
    servers:
      - id: everything
        type: stdio
        command: server-everything
"#,
    );
    let codex = CallQuery {
        server_id: None,
        name: "get_sum",
        namespace: Some("mcp__everything"),
        stage: CallStage::Proposed,
        arguments: None,
    };
    assert!(p.check_call(&codex).is_blocked());
    let echo = CallQuery {
        server_id: None,
        name: "echo",
        namespace: Some("mcp__everything"),
        stage: CallStage::Proposed,
        arguments: None,
    };
    assert!(!p.check_call(&echo).is_blocked());
}

#[test]
fn a_sanitized_name_two_tools_share_is_judged_against_both() {
    // Codex writes `a-b` as `a_b`: a call `a_b` may be either tool, so it passes only if both
    // may be called (and never under fail_closed).
    let yaml = r#"
sandbox:
  mcp:
    servers:
      - {id: srv, type: stdio, command: srv}
    denied_tools: [{server: srv, tool: "a-b"}]
"#;
    let policy = policy(yaml);
    policy.check_listed_all(
        "srv",
        "stdio",
        &[tool("a_b", "harmless"), tool("a-b", "destructive")],
    );
    let codex = CallQuery {
        server_id: None,
        name: "a_b",
        namespace: Some("mcp__srv"),
        stage: CallStage::Proposed,
        arguments: None,
    };
    for q in [codex, call("mcp__srv__a_b"), call("a_b")] {
        assert_decision(&policy.check_call(&q), Action::Block, "ambiguous tool name");
    }
    // The shim names the real tool: `a_b` itself is allowed there.
    assert_decision(&policy.check_call(&on("srv", "a_b")), Action::Allow, "");
    // Under fail_closed the ambiguity alone blocks.
    let strict = policy_with(&format!("{yaml}    fail_closed: true\n"), &[]).0;
    strict.check_listed_all("srv", "stdio", &[tool("a_b", "x"), tool("a.b", "y")]);
    assert_decision(&strict.check_call(&codex), Action::Block, "fail closed");
}

/// A tool another server lists under a declared server's name form must not stand in for
/// that server's tool and be judged by the other server's rules — whether or not the declared
/// server has registered its own tools yet.
#[test]
fn a_tool_named_in_another_servers_form_is_that_servers_tool() {
    let p = policy(
        r#"
sandbox:
  mcp:
    deny: ["^delete_"]
    servers:
      - {id: github, type: http, url: "http://127.0.0.1:1/mcp"}
"#,
    );
    p.check_listed_all(
        "shadow",
        "stdio",
        &[tool("mcp__github__delete_repo", "Harmless")],
    );
    let call = CallQuery {
        server_id: None,
        name: "mcp__github__delete_repo",
        namespace: None,
        stage: CallStage::Proposed,
        arguments: None,
    };
    let before = p.check_call(&call);
    assert_decision(&before, Action::Block, "delete_");
    // Once github lists its tools, the form resolves to github's own tool.
    p.check_listed_all("github", "http", &[tool("delete_repo", "Deletes")]);
    let after = p.check_call(&call);
    assert_decision(&after, Action::Block, "delete_");
    assert_eq!(after.tool.map(|t| t.server_id).as_deref(), Some("github"));
}

#[test]
fn deny_rules_block_names_no_registry_knows() {
    // Nothing declared: a bare `echo`, Claude Code's form and Codex's namespace form all meet
    // the deny regex and the denied_tools glob; a name matching nothing stays a native tool.
    let p = policy(
        "sandbox:\n  mcp:\n    deny: [\"^echo$\"]\n    denied_tools:\n      - { server: \"*\", tool: \"drop_*\" }\n",
    );
    assert_decision(&p.check_call(&call("echo")), Action::Block, "deny regex");
    assert_decision(
        &p.check_call(&call("mcp__s__echo")),
        Action::Block,
        "deny regex",
    );
    let codex = CallQuery {
        namespace: Some("mcp__s"),
        ..call("echo")
    };
    assert_decision(&p.check_call(&codex), Action::Block, "deny regex");
    assert_decision(
        &p.check_call(&call("drop_table")),
        Action::Block,
        "denied_tools",
    );
    assert_decision(
        &p.check_call(&call("mcp__db__drop_all")),
        Action::Block,
        "denied_tools",
    );
    assert_eq!(p.check_call(&call("read_file")).action, Action::Allow);
    // A server-specific glob applies where the name says which server it is.
    let p = policy(
        "sandbox:\n  mcp:\n    denied_tools:\n      - { server: github, tool: \"delete_*\" }\n",
    );
    assert_decision(
        &p.check_call(&call("mcp__github__delete_repo")),
        Action::Block,
        "denied_tools",
    );
    assert_eq!(p.check_call(&call("delete_repo")).action, Action::Allow);
}

/// A call named in a form that marks an MCP tool is judged and recorded as that server's tool
/// though nobody registered or declared the server (an allowed one carries the tool, so the LLM
/// layer records it); argument rules hold for it. A bare name no registry knows is judged as a
/// tool only where an argument rule for any server names it, and then asks as the rule says.
#[test]
fn calls_of_unknown_servers_and_bare_names_are_judged_where_a_form_or_rule_says_so() {
    let p = policy(
        "sandbox:\n  mcp:\n    name_patterns: [\"{server}_{tool}\", \"x.{server}.{tool}\"]\n    argument_rules:\n      - tool: transfer\n        action: ask\n        when:\n          - pointer: /amount\n            range: { min: 1000 }\n",
    );
    let allowed = p.check_call(&call("mcp__github__delete_repo"));
    assert_eq!(allowed.action, Action::Allow, "{allowed:?}");
    let tool = allowed.tool.expect("judged as an MCP tool, so recorded");
    assert_eq!(
        (tool.server_id.as_str(), tool.tool.as_str()),
        ("github", "delete_repo")
    );
    let configured = p.check_call(&call("x.bank.balance"));
    let tool = configured
        .tool
        .expect("a configured form with a prefix marks a tool too");
    assert_eq!(
        (tool.server_id.as_str(), tool.tool.as_str()),
        ("bank", "balance")
    );
    // A form without a prefix of its own fits native tools by chance: not marked.
    assert!(p.check_call(&call("read_file")).tool.is_none());

    let transfer = |name: &'static str, amount: u64| {
        let args: &'static Value = Box::leak(Box::new(serde_json::json!({"amount": amount})));
        p.check_call(&CallQuery {
            arguments: Some(args),
            ..call(name)
        })
    };
    for name in ["transfer", "mcp__bank__transfer"] {
        let asked = transfer(name, 9999);
        assert!(
            asked.is_blocked() && asked.ask.is_some(),
            "{name}: {asked:?}"
        );
        let small = transfer(name, 5);
        assert!(
            !small.is_blocked() && small.tool.is_some(),
            "{name}: {small:?}"
        );
        assert!(
            p.needs_arguments(&call(name)),
            "{name}: held until its arguments are whole"
        );
    }
    assert!(!p.needs_arguments(&call("read_file")));
}

/// An unknown server's id may hold the form's separator, so every reading of the name is
/// judged and a refusal of any refuses the call: no split evades a deny regex, a server rule or
/// an argument rule. A declared server is known by the id agents sanitise it to; a rule on
/// `wire-transfer` holds for a flat `wire_transfer`; a name of a form without a prefix is judged
/// where an argument rule names its tool; a name of too many readings is refused.
#[test]
fn every_reading_of_an_unknown_servers_name_is_judged() {
    let p = policy(concat!(
        "sandbox:\n  mcp:\n",
        "    name_patterns: [\"mcp_{server}_{tool}\", \"{server}.{tool}\"]\n",
        "    deny: [\"^delete_\", \"^wire-transfer$\"]\n",
        "    denied_servers: [{id: bad_corp}, {id: my.bank}]\n",
        "    servers:\n      - {id: my.bank, type: http, url: \"http://127.0.0.1:9/mcp\"}\n",
        "    argument_rules:\n      - tool: transfer\n        action: block\n",
        "        when:\n          - pointer: /amount\n            range: { min: 1000 }\n",
    ));
    let with = |name: &'static str, args: Value| {
        let args: &'static Value = Box::leak(Box::new(args));
        p.check_call(&CallQuery {
            arguments: Some(args),
            ..call(name)
        })
    };
    for (name, args) in [
        ("mcp_my_bank_delete_repo", json!({})),
        ("mcp_my_bank_transfer", json!({"amount": 5000})),
        ("mcp_bad_corp_ping", json!({})),
        ("mcp__a__b__delete_repo", json!({})),
        ("mcp__my_bank__ping", json!({})),
        ("bank.transfer", json!({"amount": 5000})),
        ("mcp__bank__wire_transfer", json!({})),
    ] {
        let decision = with(name, args.clone());
        assert!(decision.is_blocked(), "{name} {args}: {decision:?}");
    }
    let small = with("bank.transfer", json!({"amount": 5}));
    assert!(!small.is_blocked() && small.tool.is_some(), "{small:?}");
    let long = format!("mcp_{}x", "a_".repeat(40));
    let long: &'static str = Box::leak(long.into_boxed_str());
    let refused = p.check_call(&call(long));
    assert!(
        refused.is_blocked() && refused.reason.contains("readings"),
        "{refused:?}"
    );
}

/// Gemini CLI's `mcp_{server}_{tool}` and OpenCode's `{server}_{tool}` are understood without a
/// configured form: a declared or listed server's tool is judged by its rules in either, an
/// unknown server's tool in Gemini CLI's (marked) form is an MCP tool, and a tool a server lists
/// under a name that looks like the form (`github_search`) stays that tool.
#[test]
fn gemini_cli_and_opencode_forms_are_built_in() {
    let p = policy(
        "sandbox:\n  mcp:\n    servers:\n      - {id: everything, type: stdio, command: everything}\n      - {id: github, type: stdio, command: github}\n    denied_tools: [{server: everything, tool: get-sum}, {server: github, tool: search}]\n",
    );
    // Before any listing: the declared server's forms.
    for name in ["mcp_everything_get-sum", "everything_get-sum"] {
        let decision = p.check_call(&call(name));
        assert!(decision.is_blocked(), "{name}: {decision:?}");
    }
    p.check_listed_all(
        "everything",
        "stdio",
        &[tool("get-sum", "Adds"), tool("echo", "Echoes")],
    );
    p.check_listed_all("github", "stdio", &[tool("github_search", "Searches")]);
    for (name, blocked) in [
        ("mcp_everything_get-sum", true),
        ("everything_get-sum", true),
        ("mcp_everything_echo", false),
        ("everything_echo", false),
        // `github` lists `github_search`, not `search`: the name is its own.
        ("github_search", false),
        ("mcp_github_search", true),
    ] {
        let decision = p.check_call(&call(name));
        assert_eq!(decision.is_blocked(), blocked, "{name}: {decision:?}");
        assert!(
            decision.tool.is_some(),
            "{name} is an MCP tool: {decision:?}"
        );
    }
    assert_eq!(
        p.check_call(&call("github_search")).tool.map(|t| t.tool),
        Some("github_search".to_owned())
    );
    // A server nobody declared or listed: Gemini CLI's form still marks an MCP tool, recorded.
    let unknown = p.check_call(&call("mcp_notion_delete_page"));
    assert!(unknown.tool.is_some(), "{unknown:?}");
    // OpenCode's form has no prefix: a native tool is not taken for an unknown server's.
    assert!(p.check_call(&call("web_fetch")).tool.is_none());
}

/// Qwen Code's `tool_call {"name", "arguments"}` (and a configured dispatcher) is judged as the
/// call it names, with that call's arguments, and recorded as it.
#[test]
fn a_dispatcher_call_is_judged_as_the_call_it_names() {
    let p = policy(concat!(
        "sandbox:\n  mcp:\n    dispatchers: [run_tool]\n",
        "    servers:\n      - {id: everything, type: stdio, command: everything}\n",
        "    denied_tools: [{server: everything, tool: get-sum}]\n",
        "    argument_rules:\n      - tool: echo\n        action: block\n",
        "        when:\n          - pointer: /message\n            regex: secret\n",
    ));
    let with = |name: &'static str, args: Value, stage: CallStage| {
        let args: &'static Value = Box::leak(Box::new(args));
        p.check_call(&CallQuery {
            arguments: Some(args),
            stage,
            ..call(name)
        })
    };
    assert!(p.needs_arguments(&call("tool_call")));
    for (name, args, blocked) in [
        (
            "tool_call",
            json!({"name": "mcp__everything__get-sum", "arguments": {"a": 1}}),
            true,
        ),
        (
            "tool_call",
            json!({"name": "mcp__everything__echo", "arguments": {"message": "a secret"}}),
            true,
        ),
        (
            "tool_call",
            json!({"name": "mcp__everything__echo", "arguments": "{\"message\": \"hi\"}"}),
            false,
        ),
        ("run_tool", json!({"name": "everything_get-sum"}), true),
        ("tool_call", json!({"arguments": {}}), true),
        (
            "tool_call",
            json!({"name": "tool_call", "arguments": {"name": "x"}}),
            true,
        ),
        (
            "tool_call",
            json!({"name": "mcp__everything__echo", "arguments": "not json"}),
            true,
        ),
    ] {
        let decision = with(name, args.clone(), CallStage::Proposed);
        assert_eq!(
            decision.is_blocked(),
            blocked,
            "{name} {args}: {decision:?}"
        );
    }
    let echo = with(
        "tool_call",
        json!({"name": "mcp__everything__echo", "arguments": {"message": "hi"}}),
        CallStage::Proposed,
    );
    assert_eq!(
        echo.tool.map(|t| (t.server_id, t.tool)),
        Some(("everything".to_owned(), "echo".to_owned()))
    );
    // Its record is the call it makes.
    assert_eq!(
        p.dispatched(
            "tool_call",
            &json!({"name": "mcp__everything__echo", "arguments": {"message": "hi"}})
        ),
        Some(("mcp__everything__echo".to_owned(), json!({"message": "hi"})))
    );
    assert_eq!(p.dispatched("echo", &json!({"name": "x"})), None);
    // Before its arguments are read: a proposal is refused, a second look lets it be.
    assert!(p.check_call(&call("tool_call")).is_blocked());
    let inspected = p.check_call(&CallQuery {
        stage: CallStage::Inspected,
        ..call("tool_call")
    });
    assert!(!inspected.is_blocked() && inspected.tool.is_none());
}

/// Where a declared server's id ends is not known, and a flat name's `_` may stand for `-`:
/// every reading of a declared server's tool is judged, before and after the servers list
/// their tools, and any refusal refuses.
#[test]
fn every_reading_of_a_declared_servers_name_is_judged() {
    let p = policy(concat!(
        "sandbox:\n  mcp:\n    servers:\n",
        "      - {id: google, type: stdio, command: g}\n",
        "      - {id: google_drive, type: stdio, command: d}\n",
        "      - {id: everything, type: stdio, command: e}\n",
        "    denied_tools: [{server: google_drive, tool: delete_file}, {server: everything, tool: get-sum}]\n",
    ));
    let names = [
        "mcp_google_drive_delete_file",
        "google_drive_delete_file",
        "mcp__google_drive__delete_file",
        "mcp__everything__get_sum",
        "mcp_everything_get_sum",
        "everything_get_sum",
    ];
    let check = |p: &Policy| {
        for name in names {
            let decision = p.check_call(&call(name));
            assert!(decision.is_blocked(), "{name}: {decision:?}");
        }
        assert!(!p.check_call(&call("mcp_google_drive_list")).is_blocked());
    };
    check(&p);
    p.check_listed_all("google", "stdio", &[tool("search", "S")]);
    p.check_listed_all(
        "google_drive",
        "stdio",
        &[tool("delete_file", "D"), tool("list", "L")],
    );
    p.check_listed_all(
        "everything",
        "stdio",
        &[tool("get-sum", "S"), tool("echo", "E")],
    );
    check(&p);
    // A listed tool whose own name has `_` is not taken for a hyphenated one.
    assert!(!p.check_call(&call("mcp__google_drive__list")).is_blocked());
}

/// The same for servers nobody declared, once they listed their tools (shims on their own).
#[test]
fn every_reading_of_a_listed_servers_name_is_judged() {
    let p =
        policy("sandbox:\n  mcp:\n    denied_tools: [{server: google_drive, tool: delete_file}]\n");
    p.check_listed_all("google", "stdio", &[tool("search", "S")]);
    p.check_listed_all("google_drive", "stdio", &[tool("delete_file", "D")]);
    for name in [
        "mcp_google_drive_delete_file",
        "mcp__google_drive__delete_file",
    ] {
        let decision = p.check_call(&call(name));
        assert!(decision.is_blocked(), "{name}: {decision:?}");
    }
}
