//! Validation of the declared MCP servers (`sandbox.mcp.servers`): the longest run of checks,
//! one per server and per key its type does or does not take.

use std::collections::HashSet;

use super::Check;
use crate::config::{ConfigError, ServerDecl, ServerType};

/// `sandbox.mcp.servers`: each id plain and its own (told apart by more than case), and each
/// server's keys those of its type. Returns the declared ids.
pub(super) fn validate_servers<'a>(
    check: &Check<'_>,
    at: &str,
    servers: &'a [ServerDecl],
) -> Result<HashSet<&'a str>, ConfigError> {
    let mut ids = HashSet::new();
    let mut id_seen = std::collections::HashMap::<&str, usize>::new();
    for (i, server) in servers.iter().enumerate() {
        let key = format!("{at}.servers[{i}]");
        let nth = *id_seen
            .entry(server.id.as_str())
            .and_modify(|n| *n += 1)
            .or_insert(0);
        let line_of = ("id", server.id.as_str(), nth);
        if let Err(why) = crate::config::check_server_id(&server.id) {
            return Err(check.error(
                format!("{key}.id"),
                line_of,
                why.to_string(),
                "give the server a plain name such as `filesystem` (rules use globs; ids do not)",
            ));
        }
        if !ids.insert(server.id.as_str()) {
            return Err(check.error(
                format!("{key}.id"),
                line_of,
                format!("duplicate server id {:?}", server.id),
                "each server needs its own id; rename or remove one of them",
            ));
        }
        // Ids that differ only in case read as one server in every view.
        if let Some(other) = servers[..i]
            .iter()
            .find(|s| s.id.eq_ignore_ascii_case(&server.id))
        {
            return Err(check.error(
                format!("{key}.id"),
                line_of,
                format!(
                    "server id {:?} differs from {:?} only in case",
                    server.id, other.id
                ),
                "each server needs its own id, told apart by more than case; rename one of them",
            ));
        }
        match server.server_type {
            ServerType::Stdio => {
                if server
                    .command
                    .as_deref()
                    .is_none_or(|c| c.trim().is_empty())
                {
                    return Err(check.error(
                        format!("{key}.command"),
                        line_of,
                        format!("stdio server {:?} has no `command`", server.id),
                        "add `command:` (and `args:`) naming the program that runs the server",
                    ));
                }
                if let Err(why) = server.egress() {
                    return Err(check.error(
                        format!("{key}.egress"),
                        line_of,
                        format!("stdio server {:?}: {why}", server.id),
                        "list where the server may connect, e.g. `egress: [\"127.0.0.53:53\", \"140.82.112.0/20:443\"]`, or `egress: [any]`",
                    ));
                }
                if let Some(cwd) = &server.cwd
                    && !cwd.is_absolute()
                {
                    return Err(check.error(
                        format!("{key}.cwd"),
                        line_of,
                        format!(
                            "stdio server {:?}: cwd {} is not an absolute path",
                            server.id,
                            cwd.display()
                        ),
                        "write the full path of the directory the server runs in",
                    ));
                }
                for (field, present) in [
                    ("url", server.url.is_some()),
                    ("tls_fingerprint", server.tls_fingerprint.is_some()),
                    ("via_proxy", server.via_proxy.is_some()),
                ] {
                    if present {
                        return Err(check.error(
                            format!("{key}.{field}"),
                            line_of,
                            format!("`{field}` does not apply to stdio server {:?}", server.id),
                            "remove it, or set `type: http` / `type: sse` for a network server",
                        ));
                    }
                }
            }
            ServerType::Http | ServerType::Sse => {
                let url = server.url.as_deref().unwrap_or_default();
                if url.is_empty() {
                    return Err(check.error(
                        format!("{key}.url"),
                        line_of,
                        format!("{} server {:?} has no `url`", server.server_type, server.id),
                        "add `url: https://host:port/path` (the MCP endpoint)",
                    ));
                }
                if server.addr().is_empty() {
                    return Err(check.error(
                        format!("{key}.url"),
                        ("url", url, 0),
                        format!("{url:?} is not an http:// or https:// URL with a host"),
                        "write the full endpoint, e.g. `https://mcp.example.com/mcp`",
                    ));
                }
                for (field, present) in [
                    ("env", !server.env.is_empty()),
                    ("cwd", server.cwd.is_some()),
                    ("user", server.user.is_some()),
                    ("egress", !server.egress.is_empty()),
                ] {
                    if present {
                        return Err(check.error(
                            format!("{key}.{field}"),
                            line_of,
                            format!(
                                "`{field}` does not apply to {} server {:?}",
                                server.server_type, server.id
                            ),
                            "remove it: it describes a stdio server the daemon starts",
                        ));
                    }
                }
                if server.command.is_some() || !server.args.is_empty() {
                    return Err(check.error(
                        format!("{key}.command"),
                        line_of,
                        format!(
                            "`command`/`args` do not apply to {} server {:?}",
                            server.server_type, server.id
                        ),
                        "remove them, or set `type: stdio` for a server toolwall starts",
                    ));
                }
                if let Some(fp) = server.tls_fingerprint.as_deref()
                    && !valid_fingerprint(fp)
                {
                    return Err(check.error(
                        format!("{key}.tls_fingerprint"),
                        ("tls_fingerprint", fp, 0),
                        format!("{fp:?} is not `sha256:` followed by 64 hex digits"),
                        "write the certificate's SHA-256 as `sha256:<hex>` (colons allowed)",
                    ));
                }
            }
        }
    }
    Ok(ids)
}

/// `sha256:` + 64 hex digits, optionally in colon-separated pairs.
fn valid_fingerprint(fp: &str) -> bool {
    let lower = fp.to_ascii_lowercase();
    let Some(hex) = lower.strip_prefix("sha256:") else {
        return false;
    };
    let digits: String = hex.chars().filter(|c| *c != ':').collect();
    digits.len() == 64 && digits.bytes().all(|b| b.is_ascii_hexdigit())
}
