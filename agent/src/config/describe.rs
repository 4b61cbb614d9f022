//! The effective policy in words, for `toolwall config check` (`cli/config.rs`) and the
//! daemon's start-up log.

use std::fmt::Write as _;

use super::{Config, ListPolicy, OnChange};

/// The effective policy in words: what `config check` prints, and what the daemon logs at
/// start-up, so a person can see what a file actually means (defaults included).
/// The policy (`sandbox:`) as toolwall will apply it: what `toolwall policy verify` prints of a
/// bundle, which carries nothing else.
pub(crate) fn describe_policy(config: &Config) -> String {
    let mcp = &config.sandbox.mcp;
    let mut out = String::new();
    // Writing to a String cannot fail; `let _` keeps that visible without unwraps.
    let _ = writeln!(out, "configuration: {}", config.origin);
    let _ = writeln!(
        out,
        "enforcement: {}; unknown tools and undeclared servers: {}",
        if mcp.enforce_policy {
            "on (blocks)"
        } else {
            "audit only (enforce_policy: false, nothing is blocked)"
        },
        if mcp.fail_closed {
            "blocked (fail_closed)"
        } else {
            "allowed as non-MCP (fail_closed: false)"
        },
    );

    let _ = writeln!(out, "\nservers ({}):", mcp.servers.len());
    for server in &mcp.servers {
        match server.server_type {
            super::ServerType::Stdio => {
                let _ = writeln!(
                    out,
                    "  {} stdio: {} {}",
                    server.id,
                    server.command.as_deref().unwrap_or_default(),
                    server.args.join(" ")
                );
            }
            kind => {
                let via_proxy = config.must_use_proxy(server);
                let _ = writeln!(
                    out,
                    "  {} {kind}: {} ({}){}{}",
                    server.id,
                    server.url.as_deref().unwrap_or_default(),
                    server.addr(),
                    server
                        .tls_fingerprint
                        .as_deref()
                        .map(|fp| format!(", tls {fp}"))
                        .unwrap_or_default(),
                    if via_proxy {
                        ", direct connections denied (via_proxy)"
                    } else {
                        ""
                    },
                );
            }
        }
    }

    let _ = writeln!(
        out,
        "\nserver policy: {}",
        list_policy(mcp.server_policy, "servers")
    );
    for (i, rule) in mcp.allowed_servers.iter().enumerate() {
        let _ = writeln!(out, "  allowed_servers[{i}]: {:?}", rule.id);
    }
    for (i, rule) in mcp.denied_servers.iter().enumerate() {
        let _ = writeln!(out, "  denied_servers[{i}]: {:?}", rule.id);
    }
    let _ = writeln!(
        out,
        "  (the most specific matching rule decides; a tie goes to the deny rule)"
    );

    let _ = writeln!(
        out,
        "\ntool policy: {}",
        list_policy(mcp.tool_policy, "tools")
    );
    for (list, rules) in [
        ("allowed_tools", &mcp.allowed_tools),
        ("denied_tools", &mcp.denied_tools),
    ] {
        for (i, rule) in rules.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {list}[{i}]: server {:?}, tool {:?}{}",
                rule.server,
                rule.tool,
                rule.content_hash
                    .as_deref()
                    .map(|h| format!(", only definition {h}"))
                    .unwrap_or_default()
            );
        }
    }
    let _ = writeln!(
        out,
        "  (the most specific matching rule decides; a tie goes to the deny rule)"
    );

    let _ = writeln!(
        out,
        "\ndeny regexes on tool names ({}; a match always blocks):",
        mcp.deny.len()
    );
    for (i, pattern) in mcp.deny.iter().enumerate() {
        let _ = writeln!(out, "  deny[{i}]: {pattern:?}");
    }
    let _ = writeln!(
        out,
        "\nname forms: mcp__{{server}}__{{tool}} (Claude Code, Qwen Code), Codex namespace mcp__{{server}}, mcp_{{server}}_{{tool}} (Gemini CLI), {{server}}_{{tool}} (OpenCode){}",
        mcp.name_patterns
            .iter()
            .map(|p| format!(", {p}"))
            .collect::<String>()
    );
    let _ = writeln!(
        out,
        "dispatchers (judged as the call their arguments name): tool_call (Qwen Code){}",
        mcp.dispatchers
            .iter()
            .map(|d| format!(", {d}"))
            .collect::<String>()
    );

    let _ = writeln!(
        out,
        "\nargument rules ({}; call-time only, after the name rules; the first allow/block rule that holds decides, every redact rule that holds hides its values from the record):",
        mcp.argument_rules.len()
    );
    for (i, rule) in mcp.argument_rules.iter().enumerate() {
        let name = rule
            .name
            .as_deref()
            .map(|n| format!(" {n:?}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  argument_rules[{i}]{name}: server {:?}, tool {:?}, {} when {} condition(s) on {}",
            rule.server,
            rule.tool,
            match rule.action {
                super::ArgumentAction::Allow => "allow",
                super::ArgumentAction::Block => "block",
                super::ArgumentAction::Redact => "redact",
                super::ArgumentAction::Ask => "ask a person",
            },
            rule.when.len(),
            rule.when
                .iter()
                .map(|c| c.pointer.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    if mcp
        .argument_rules
        .iter()
        .any(|r| r.action == super::ArgumentAction::Ask)
    {
        let approval = &mcp.approval;
        let _ = writeln!(
            out,
            "  asked calls wait {} s for `toolwall approve|deny ID` or the web view (at most {} at once){}; stand-alone shims and filter proxies ask the running daemon, and with no daemon to ask such calls are refused",
            approval.timeout_secs,
            approval.max_pending,
            approval
                .webhook
                .as_ref()
                .map(|w| format!(", each posted to {}", w.url))
                .unwrap_or_default()
        );
    }

    let results = &mcp.result_inspection;
    let _ = writeln!(
        out,
        "\nresult inspection (what servers send toward the client): secrets (gitleaks' rules) {}; {} pattern(s); {} exemption(s)",
        results.secrets.as_str(),
        results.patterns.len(),
        results.exempt.len()
    );
    for (i, p) in results.patterns.iter().enumerate() {
        let _ = writeln!(
            out,
            "  patterns[{i}] {:?}: {} on /{}/",
            p.name,
            p.action.as_str(),
            p.regex
        );
    }
    for (i, e) in results.exempt.iter().enumerate() {
        let _ = writeln!(
            out,
            "  exempt[{i}]: server {:?}, tool {:?} from {}",
            e.server,
            e.tool,
            match e.rules.is_empty() {
                true => "every rule".to_owned(),
                false => e.rules.join(", "),
            }
        );
    }

    let _ = writeln!(
        out,
        "\ndefinition checks (what listed tools say to the model): hidden instructions {}; shadowing {}",
        mcp.definition_checks.poisoning.as_str(),
        mcp.definition_checks.shadowing.as_str()
    );

    let pinning = &mcp.version_pinning;
    if pinning.enabled {
        let _ = writeln!(
            out,
            "\nversion pinning: on; first definition {}; a changed or new tool is {}",
            if pinning.auto_trust_first {
                "trusted and pinned"
            } else {
                "not trusted until pinned explicitly"
            },
            match pinning.on_change {
                OnChange::Block => "blocked",
                OnChange::Alert => "allowed with an alert",
            }
        );
    } else {
        let _ = writeln!(out, "\nversion pinning: off");
    }

    let limits = &mcp.rate_limits;
    if limits.enabled {
        let _ = writeln!(
            out,
            "\nrate limits: {} calls/min per server, burst {}",
            limits.default_rpm, limits.default_burst
        );
        for (id, limit) in &limits.per_server {
            let _ = writeln!(
                out,
                "  {id}: {} calls/min, burst {}",
                limit.calls_per_minute,
                limit.burst.unwrap_or(limits.default_burst)
            );
        }
    } else {
        let _ = writeln!(out, "\nrate limits: off");
    }

    out
}

/// [`describe_policy`] followed by this host's own settings (proxy, kernel, API, store,
/// bundles, export): what `toolwall config check` prints.
pub(crate) fn describe(config: &Config) -> String {
    let mut out = describe_policy(config);
    let proxy = &config.proxy;
    let _ = writeln!(
        out,
        "\nLLM proxy: {} on {} (anthropic {}, openai {}, gemini {})",
        proxy.mode.as_str(),
        proxy.listen,
        proxy.providers.anthropic,
        proxy.providers.openai,
        proxy.providers.gemini
    );
    let _ = writeln!(
        out,
        "LLM proxy bounds: {} connections per client (user and cgroup), {} bytes held across all exchanges",
        proxy.max_connections_per_client, proxy.memory_budget_bytes
    );
    let _ = match proxy.pass_through.is_empty() {
        true => writeln!(
            out,
            "LLM routes: only those toolwall reads are relayed (no pass_through)"
        ),
        false => writeln!(
            out,
            "LLM routes: relayed UNINSPECTED (each request recorded): {}",
            proxy
                .pass_through
                .iter()
                .map(|e| format!("{} {}", e.provider.as_str(), e.route))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let _ = writeln!(
        out,
        "interceptor: malformed responses {}, stream buffer {} bytes",
        config.interceptor.on_malformed.as_str(),
        config.interceptor.max_stream_buffer_bytes
    );
    let _ = writeln!(
        out,
        "kernel layer: {}; deny direct MCP connections by default: {}; pin LLM egress: {}; re-resolve every {} s",
        if config.netmon.enabled { "on" } else { "off" },
        config.netmon.deny_direct,
        config.netmon.pin_llm_egress,
        config.netmon.resolve_interval_secs
    );
    let _ = writeln!(
        out,
        "api: {}{}",
        config.api.listen,
        config
            .api
            .socket
            .as_ref()
            .map(|s| format!(" and {}", s.display()))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "correlation window: {} ms",
        config.correlator.window_ms
    );
    let _ = writeln!(out, "store: {}", config.store_path().display());
    if let Some(bundle) = &config.policy.bundle {
        let _ = writeln!(
            out,
            "policy bundles: pulled from {} every {} s, signed by {}; a verified bundle's `sandbox:` replaces this file's for every layer of the daemon (stand-alone shims and filter proxies keep this file's)",
            bundle.url, bundle.poll_secs, bundle.public_key
        );
    }
    match &config.telemetry.otlp {
        Some(otlp) => {
            let _ = writeln!(
                out,
                "OTLP export: {} to {} ({} header(s)); log records of {}, {}; from the store behind a saved cursor, at least once",
                otlp.protocol.as_str(),
                otlp.endpoint,
                otlp.headers.len(),
                match otlp.events.is_empty() {
                    true => "every event".to_owned(),
                    false => otlp.events.join(", "),
                },
                match otlp.spans {
                    true => "a span per correlated call",
                    false => "no spans",
                }
            );
        }
        None => {
            let _ = writeln!(out, "OTLP export: off (telemetry.otlp not set)");
        }
    }
    out
}

fn list_policy(policy: ListPolicy, what: &str) -> String {
    match policy {
        ListPolicy::Allowlist => format!("allowlist (only {what} matching an allow rule pass)"),
        ListPolicy::Denylist | ListPolicy::None => {
            format!("{} (all {what} pass unless denied)", policy.as_str())
        }
    }
}
