//! Checks that parse cannot do: fields that depend on each other, duplicates, patterns that
//! must compile. Each failure points at the line of the offending value when it can be found
//! in the source text (serde does not keep positions after parsing, so the line is found by
//! looking for the key and value that were rejected).

mod bundle;
mod lines;
mod otlp;
mod servers;

use std::collections::HashSet;

use super::{
    ArgumentTest, ConfigError, Location, compile_condition,
    deny_regex::compile_deny_regex,
    types::{Config, ListPolicy},
};
use crate::registry::NamePattern;
use bundle::validate_bundle;
pub(crate) use lines::find_line;
use otlp::validate_otlp;
use servers::validate_servers;

/// The accumulated context of one validation run.
struct Check<'a> {
    file: &'a str,
    source: &'a str,
}

impl Check<'_> {
    /// An error at the `nth` (0-based) line where `key: value` (or `- value` when `key` is
    /// empty) appears, or at no particular line.
    fn error(
        &self,
        key_path: String,
        line_of: (&str, &str, usize),
        message: impl Into<String>,
        hint: &'static str,
    ) -> ConfigError {
        let (key, value, nth) = line_of;
        ConfigError::Invalid {
            location: Location {
                file: self.file.to_string(),
                line: find_line(self.source, key, value, nth),
                column: None,
            },
            key: key_path,
            message: message.into(),
            hint,
        }
    }
}

/// Validates `config` (parsed from `source`, read from `file`) and normalizes what has a
/// canonical form (content hashes to lowercase hex).
pub(crate) fn validate(config: &mut Config, file: &str, source: &str) -> Result<(), ConfigError> {
    let check = Check { file, source };
    // Every process that reads this file finds the daemon by this path: a relative one is
    // relative to each one's own directory (a client run from `/tmp` would ask a socket anyone
    // could have made there).
    if let Some(socket) = config.api.socket.as_deref()
        && !socket.is_absolute()
    {
        let shown = socket.to_string_lossy().into_owned();
        return Err(check.error(
            "api.socket".to_owned(),
            ("socket", shown.as_str(), 0),
            format!("api.socket {shown:?} is a relative path"),
            "write it in full, e.g. /run/toolwall/api.sock",
        ));
    }
    for (i, entry) in config.netmon.egress.allow.iter().enumerate() {
        if let Err(why) = super::parse_allow(entry) {
            return Err(check.error(
                format!("netmon.egress.allow[{i}]"),
                ("", entry.as_str(), 0),
                why,
                "write e.g. `127.0.0.1:5432`, `10.0.0.0/8`, `[fd00::1]:443` or `db.internal:5432`",
            ));
        }
    }
    for (i, entry) in config.exec.allow_unix.iter().enumerate() {
        if let Err(why) = super::unix_name(entry) {
            return Err(check.error(
                format!("exec.allow_unix[{i}]"),
                ("", entry.as_str(), 0),
                why,
                "write an absolute path such as `/run/docker.sock`, or `@name` for an abstract socket",
            ));
        }
    }
    // A size past what tmpfs counts wraps to 0, which to tmpfs means no bound at all.
    if !(1..=1 << 20).contains(&config.exec.tmp_size_mib) {
        let size = config.exec.tmp_size_mib.to_string();
        return Err(check.error(
            "exec.tmp_size_mib".to_string(),
            ("tmp_size_mib", size.as_str(), 0),
            format!(
                "{} MiB is not a size for a private temporary directory (1 to 1048576)",
                config.exec.tmp_size_mib
            ),
            "write a size in MiB, e.g. 1024",
        ));
    }
    let mcp = &mut config.sandbox.mcp;
    let at = "sandbox.mcp";

    let ids = validate_servers(&check, at, &mcp.servers)?;

    for (list, rules) in [
        ("allowed_servers", &mcp.allowed_servers),
        ("denied_servers", &mcp.denied_servers),
    ] {
        for (i, rule) in rules.iter().enumerate() {
            if rule.id.trim().is_empty() {
                return Err(check.error(
                    format!("{at}.{list}[{i}].id"),
                    ("id", "", 0),
                    "empty server rule",
                    "write a server id or a glob such as `*`",
                ));
            }
        }
    }
    if mcp.server_policy == ListPolicy::Allowlist && mcp.allowed_servers.is_empty() {
        tracing::warn!(
            "{file}: server_policy is allowlist with no allowed_servers: every MCP server is blocked"
        );
    }
    if mcp.tool_policy == ListPolicy::Allowlist && mcp.allowed_tools.is_empty() {
        tracing::warn!(
            "{file}: tool_policy is allowlist with no allowed_tools: every MCP tool is blocked"
        );
    }

    for list in ["allowed_tools", "denied_tools"] {
        let rules = if list == "allowed_tools" {
            &mut mcp.allowed_tools
        } else {
            &mut mcp.denied_tools
        };
        for (i, rule) in rules.iter_mut().enumerate() {
            let key = format!("{at}.{list}[{i}]");
            if rule.tool.trim().is_empty() || rule.server.trim().is_empty() {
                return Err(check.error(
                    key,
                    ("tool", rule.tool.as_str(), 0),
                    "tool rule with an empty `server` or `tool`",
                    "use `*` to mean any server or any tool",
                ));
            }
            if let Some(hash) = rule.content_hash.as_mut() {
                let lower = hash.to_ascii_lowercase();
                let hex = lower.strip_prefix("sha256:").unwrap_or(&lower).to_string();
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(check.error(
                        format!("{key}.content_hash"),
                        ("content_hash", hash.as_str(), 0),
                        format!("{hash:?} is not a SHA-256 hex digest"),
                        "copy the tool_hash shown by `toolwall mcp tools` (64 hex digits)",
                    ));
                }
                *hash = hex;
            }
        }
    }

    let mut deny_seen = std::collections::HashMap::<&str, usize>::new();
    for (i, pattern) in mcp.deny.iter().enumerate() {
        let nth = *deny_seen
            .entry(pattern.as_str())
            .and_modify(|n| *n += 1)
            .or_insert(0);
        if let Err(why) = compile_deny_regex(pattern) {
            return Err(check.error(
                format!("{at}.deny[{i}]"),
                ("", pattern.as_str(), nth),
                format!("{pattern:?}: {why}"),
                "fix or remove the pattern; toolwall will not start with a deny rule it cannot apply",
            ));
        }
    }

    for (i, pattern) in mcp.name_patterns.iter().enumerate() {
        if let Err(why) = NamePattern::parse(pattern) {
            return Err(check.error(
                format!("{at}.name_patterns[{i}]"),
                ("", pattern.as_str(), 0),
                format!("{pattern:?} {why}"),
                "write the form with placeholders, e.g. \"{server}.{tool}\" or \"mcp_{server}_{tool}\"",
            ));
        }
    }

    // Argument rules: each condition compiles; a path prefix is the real directory (a rule on
    // a symlink's path would not see calls naming the target).
    let mut pointer_seen = std::collections::HashMap::<&str, usize>::new();
    for (i, rule) in mcp.argument_rules.iter().enumerate() {
        let key = format!("{at}.argument_rules[{i}]");
        if rule.when.is_empty() {
            return Err(check.error(
                format!("{key}.when"),
                ("when", "[]", 0),
                "an argument rule needs at least one condition under `when:`",
                "add a condition such as `- pointer: /path` with `path_prefix: /etc`, or write a rule on the name alone in denied_tools",
            ));
        }
        for (j, condition) in rule.when.iter().enumerate() {
            let nth = *pointer_seen
                .entry(condition.pointer.as_str())
                .and_modify(|n| *n += 1)
                .or_insert(0);
            let line_of = ("pointer", condition.pointer.as_str(), nth);
            let test = match compile_condition(condition) {
                Ok(test) => test,
                Err(why) => {
                    return Err(check.error(
                        format!("{key}.when[{j}]"),
                        line_of,
                        why,
                        "a condition is `pointer:` plus one of glob, regex, path_prefix, range, present",
                    ));
                }
            };
            if let ArgumentTest::PathPrefix(prefix) = &test
                && let Ok(real) = std::fs::canonicalize(prefix)
                && real.as_os_str() != prefix.as_str()
            {
                return Err(check.error(
                    format!("{key}.when[{j}].path_prefix"),
                    ("path_prefix", prefix.as_str(), 0),
                    format!(
                        "{prefix} is reached through a symlink (it is {}): calls naming the real path would not be under it",
                        real.display()
                    ),
                    "write the real directory (`realpath` prints it)",
                ));
            }
        }
    }

    // Result patterns compile, and each has a name of its own (findings and redactions say it).
    let results = &mcp.result_inspection;
    let mut names = HashSet::new();
    for (i, pattern) in results.patterns.iter().enumerate() {
        let key = format!("{at}.result_inspection.patterns[{i}]");
        if pattern.name.is_empty() || !names.insert(pattern.name.as_str()) {
            return Err(check.error(
                format!("{key}.name"),
                ("name", pattern.name.as_str(), 0),
                format!("pattern name {:?} is empty or used twice", pattern.name),
                "give each pattern a name of its own: findings and `[toolwall:redacted:NAME]` say it",
            ));
        }
        if let Err(why) = compile_deny_regex(&pattern.regex) {
            return Err(check.error(
                format!("{key}.regex"),
                ("regex", pattern.regex.as_str(), 0),
                why,
                "write a regex of the `regex` crate (no look-around, no back-references)",
            ));
        }
    }

    let approval = &mcp.approval;
    if !(1..=3600).contains(&approval.timeout_secs) {
        return Err(check.error(
            format!("{at}.approval.timeout_secs"),
            ("timeout_secs", &approval.timeout_secs.to_string(), 0),
            format!("{} seconds", approval.timeout_secs),
            "give a person between 1 and 3600 seconds to answer (clients give up on a call that waits longer)",
        ));
    }
    if !(1..=4096).contains(&approval.max_pending) {
        return Err(check.error(
            format!("{at}.approval.max_pending"),
            ("max_pending", &approval.max_pending.to_string(), 0),
            format!("{} calls waiting at once", approval.max_pending),
            "allow between 1 and 4096 calls to wait at once",
        ));
    }
    if let Some(webhook) = &approval.webhook {
        let parsed = webhook.url.parse::<http::Uri>().ok().filter(|uri| {
            matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some()
        });
        if parsed.is_none() {
            return Err(check.error(
                format!("{at}.approval.webhook.url"),
                ("url", webhook.url.as_str(), 0),
                format!("{:?} is not an http:// or https:// URL", webhook.url),
                "write the receiver's full URL, e.g. https://hooks.example.com/toolwall",
            ));
        }
        for (name, value) in &webhook.headers {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err()
                || http::HeaderValue::from_str(value).is_err()
            {
                return Err(check.error(
                    format!("{at}.approval.webhook.headers"),
                    (name.as_str(), "", 0),
                    format!("header {name:?} cannot be sent (a name or value with characters HTTP forbids)"),
                    "write header names of letters, digits and `-`, and values of visible ASCII",
                ));
            }
        }
    }

    let limits = &mcp.rate_limits;
    if limits.default_rpm == 0 {
        return Err(check.error(
            format!("{at}.rate_limits.default_rpm"),
            ("default_rpm", "0", 0),
            "0 calls per minute",
            "use at least 1, or block the servers or tools instead",
        ));
    }
    if limits.default_burst == 0 {
        return Err(check.error(
            format!("{at}.rate_limits.default_burst"),
            ("default_burst", "0", 0),
            "a burst of 0 admits no call",
            "use at least 1",
        ));
    }
    for (id, limit) in &limits.per_server {
        if limit.calls_per_minute == 0 || limit.burst == Some(0) {
            return Err(check.error(
                format!("{at}.rate_limits.per_server.{id}"),
                (id.as_str(), "", 0),
                "calls_per_minute and burst must be at least 1",
                "raise them, or deny the server instead",
            ));
        }
        if !ids.contains(id.as_str()) {
            tracing::warn!(
                "{file}: rate_limits.per_server.{id}: no server with that id is declared"
            );
        }
    }

    for (key, url) in [
        (
            "proxy.providers.anthropic",
            &config.proxy.providers.anthropic,
        ),
        ("proxy.providers.openai", &config.proxy.providers.openai),
        ("proxy.providers.gemini", &config.proxy.providers.gemini),
    ] {
        if super::servers::url_host_port(url).is_empty() {
            let leaf = key.rsplit('.').next().unwrap_or(key);
            return Err(check.error(
                key.to_string(),
                (leaf, url.as_str(), 0),
                format!("{url:?} is not an http:// or https:// URL with a host"),
                "write the provider's base URL, e.g. https://api.anthropic.com",
            ));
        }
    }
    for (i, entry) in config.proxy.pass_through.iter().enumerate() {
        if let Err(e) = super::PassThrough::parse(entry.provider, &entry.route) {
            return Err(check.error(
                format!("proxy.pass_through[{i}].route"),
                ("route", entry.route.as_str(), 0),
                e.to_string(),
                "write a method (or *) and a path whose segments may be * (one) or a last ** (any rest), e.g. \"GET /v1/files/*/content\"",
            ));
        }
    }
    if !config.proxy.pass_through.is_empty() {
        let routes: Vec<String> = config
            .proxy
            .pass_through
            .iter()
            .map(|e| format!("{} {}", e.provider.as_str(), e.route))
            .collect();
        tracing::warn!(
            "{file}: proxy.pass_through relays {} uninspected: a tool call in their answers reaches the agent unjudged (each request is recorded); the only guard left on them is the kernel's netmon.pin_llm_egress, which keeps sessions from going around the proxy{}",
            routes.join(", "),
            if config.netmon.pin_llm_egress {
                ""
            } else {
                " (off in this configuration)"
            }
        );
    }
    if config
        .store
        .path
        .as_ref()
        .is_some_and(|p| p.as_os_str().is_empty())
    {
        return Err(check.error(
            "store.path".to_string(),
            ("path", "", 0),
            "empty path",
            "remove the key to use the default location, or name a file",
        ));
    }
    if config.netmon.resolve_interval_secs == 0 {
        return Err(check.error(
            "netmon.resolve_interval_secs".to_string(),
            ("resolve_interval_secs", "0", 0),
            "0 seconds",
            "use at least 1 (60 is the default)",
        ));
    }
    if !(1..=600_000).contains(&config.correlator.window_ms) {
        return Err(check.error(
            "correlator.window_ms".to_string(),
            ("window_ms", &config.correlator.window_ms.to_string(), 0),
            "must be between 1 and 600000 ms",
            "2000 (the default) joins the layers' events of one call",
        ));
    }
    if !(4096..=1 << 30).contains(&config.interceptor.max_stream_buffer_bytes) {
        return Err(check.error(
            "interceptor.max_stream_buffer_bytes".to_string(),
            (
                "max_stream_buffer_bytes",
                &config.interceptor.max_stream_buffer_bytes.to_string(),
                0,
            ),
            "must be between 4096 and 1073741824",
            "8388608 (8 MiB, the default) holds any realistic tool call",
        ));
    }
    let per_client = config.proxy.max_connections_per_client;
    if !(1..=4096).contains(&per_client) {
        return Err(check.error(
            "proxy.max_connections_per_client".to_string(),
            ("max_connections_per_client", &per_client.to_string(), 0),
            "must be between 1 and 4096 (the proxy's connections in all)",
            "512 (the default) is far more than any agent opens",
        ));
    }
    let budget = config.proxy.memory_budget_bytes;
    if budget < config.interceptor.max_stream_buffer_bytes {
        return Err(check.error(
            "proxy.memory_budget_bytes".to_string(),
            ("memory_budget_bytes", &budget.to_string(), 0),
            "is below interceptor.max_stream_buffer_bytes: one response could never hold what it may",
            "268435456 (256 MiB, the default), or at least interceptor.max_stream_buffer_bytes",
        ));
    }
    if let Some(otlp) = &config.telemetry.otlp {
        validate_otlp(&check, otlp)?;
    }
    if let Some(bundle) = &config.policy.bundle {
        validate_bundle(&check, bundle)?;
    }
    Ok(())
}
