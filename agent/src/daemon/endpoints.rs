//! Which addresses the kernel layer watches and what it does with a connection to each: the
//! network MCP servers, the LLM providers, the daemon's own API and other DNS resolvers, and
//! what the session boundary lets through. Computed at start and again for each bundle
//! revision.

use crate::{
    config::{AllowEntry, Config, EgressMode, OtherResolvers, ServerType, parse_allow},
    netmon::{
        RuleAction,
        boundary::{ALLOW_ENDPOINT, BoundaryMode},
        service::WatchedEndpoint,
    },
    policy::Policy,
};

/// What the session boundary refuses, from `netmon.egress.mode`.
pub(super) fn boundary_mode(config: &Config) -> BoundaryMode {
    match config.netmon.egress.mode {
        EgressMode::LocalDeny => BoundaryMode::LocalDeny,
        EgressMode::Allowlist => BoundaryMode::Allowlist,
        EgressMode::Open => BoundaryMode::Off,
    }
}

/// Where the daemon itself listens, as bound (a configured port 0 is known only then).
#[derive(Clone, Copy, Debug)]
pub(super) struct OwnEndpoints {
    /// The loopback API (`api.listen`).
    pub api: std::net::SocketAddr,
    /// The LLM proxy (`proxy.listen`), when it runs.
    pub proxy: Option<std::net::SocketAddr>,
}

/// The daemon's own listeners. Its loopback API is denied to sessions: a process inside one
/// talks to the daemon through the socket, which knows where it runs; on TCP it could present
/// the web token (a root agent can read it) and read every session's records or answer its own
/// calls that wait for a person. The LLM proxy is let through the session boundary. Both ports
/// are reserved: no session may bind them (`netmon::boundary::reserved_ports`).
pub(super) fn own_endpoints(own: OwnEndpoints) -> Vec<WatchedEndpoint> {
    let hosts = match own.api.ip() {
        ip if ip.is_unspecified() => vec!["0.0.0.0/0".to_owned(), "::/0".to_owned()],
        ip => vec![ip.to_string()],
    };
    let api = hosts.into_iter().map(|host| WatchedEndpoint {
        id: "toolwall:api".into(),
        kind: "api".into(),
        host,
        port: own.api.port(),
        action: RuleAction::Deny,
        except: Vec::new(),
    });
    let proxy = own.proxy.map(|proxy| WatchedEndpoint {
        id: "toolwall:llm-proxy".into(),
        kind: "toolwall".into(),
        // A proxy on the unspecified address is reached on any local one; a rule on one local
        // address is widened to all of them.
        host: if proxy.ip().is_unspecified() {
            std::net::Ipv4Addr::LOCALHOST.to_string()
        } else {
            proxy.ip().to_string()
        },
        port: proxy.port(),
        action: RuleAction::Pass,
        except: Vec::new(),
    });
    api.chain(proxy).collect()
}

/// Google's Code Assist API: Gemini CLI's model endpoint when it signs in with Google.
const CODE_ASSIST: &str = "https://cloudcode-pa.googleapis.com";

/// Which addresses the kernel watches: every network MCP server (DENY when the server is
/// denied by policy or must be reached through `toolwall mcp-proxy`, else FLAG), and with
/// `netmon.pin_llm_egress` the LLM providers' API hosts (DENY: the session must use the proxy).
pub(crate) fn watched_endpoints(config: &Config, policy: &Policy) -> Vec<WatchedEndpoint> {
    let mut out = Vec::new();
    for server in &config.sandbox.mcp.servers {
        if server.server_type == ServerType::Stdio {
            continue;
        }
        let Some((host, port)) = split_host_port(&server.addr()) else {
            continue;
        };
        let deny =
            policy.server_block_reason(&server.id).is_some() || config.must_use_proxy(server);
        out.push(WatchedEndpoint {
            id: server.id.clone(),
            kind: server.server_type.as_str().to_owned(),
            host,
            port,
            action: if deny {
                RuleAction::Deny
            } else {
                RuleAction::Flag
            },
            except: Vec::new(),
        });
    }
    if config.netmon.pin_llm_egress {
        for (name, url) in [
            ("anthropic", config.proxy.providers.anthropic.as_str()),
            ("openai", config.proxy.providers.openai.as_str()),
            ("gemini", config.proxy.providers.gemini.as_str()),
            // Gemini CLI signed in with Google talks to Code Assist, which no dialect reads.
            ("gemini-code-assist", CODE_ASSIST),
        ] {
            if let Some((host, port)) = split_host_port(&crate::config::url_host_port(url)) {
                out.push(WatchedEndpoint {
                    id: format!("llm:{name}"),
                    kind: "llm".into(),
                    host,
                    port,
                    action: RuleAction::Deny,
                    except: Vec::new(),
                });
            }
        }
    }
    let dns = &config.netmon.dns;
    let allowed = if dns.resolvers.is_empty() {
        crate::netmon::local::system_resolvers()
    } else {
        dns.resolvers.clone()
    };
    out.extend(boundary_exceptions(config, &allowed));
    let other = match dns.other_resolvers {
        OtherResolvers::Off => return out,
        OtherResolvers::Flag => RuleAction::Flag,
        OtherResolvers::Deny => RuleAction::Deny,
    };
    if allowed.is_empty() {
        tracing::warn!(
            action = ?other,
            "netmon.dns: no resolver is allowed (none in netmon.dns.resolvers, none in /etc/resolv.conf); all DNS from sessions is treated as going to another resolver"
        );
    }
    out.push(WatchedEndpoint {
        id: "dns:other-resolver".into(),
        kind: "dns".into(),
        host: "::/0".into(),
        port: 53,
        action: other,
        except: allowed,
    });
    out
}

/// What a session reaches through its boundary besides the declared servers the policy allows
/// (their FLAG rules are exceptions already) and the LLM proxy ([`own_endpoints`]): the allowed
/// resolvers on port 53 and `netmon.egress.allow`, as PASS rules. None when the boundary is off.
fn boundary_exceptions(config: &Config, resolvers: &[std::net::IpAddr]) -> Vec<WatchedEndpoint> {
    if boundary_mode(config) == BoundaryMode::Off {
        return Vec::new();
    }
    let pass = |id: &str, host: String, port: u16| WatchedEndpoint {
        id: id.to_owned(),
        kind: "boundary".into(),
        host,
        port,
        action: RuleAction::Pass,
        except: Vec::new(),
    };
    let mut out: Vec<WatchedEndpoint> = resolvers
        .iter()
        .map(|r| pass("toolwall:resolver", r.to_string(), 53))
        .collect();
    for entry in &config.netmon.egress.allow {
        // Validated at load; an entry that does not parse opens nothing.
        match parse_allow(entry) {
            Ok(AllowEntry::Net(rule)) => out.push(pass(
                ALLOW_ENDPOINT,
                format!("{}/{}", rule.addr, rule.prefix),
                rule.port,
            )),
            Ok(AllowEntry::Name { host, port }) => out.push(pass(ALLOW_ENDPOINT, host, port)),
            Err(why) => tracing::error!(%why, "netmon.egress.allow: entry skipped"),
        }
    }
    out
}

fn split_host_port(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
}

/// One line on the session boundary for the daemon's start report.
pub(super) fn boundary_summary(config: &Config) -> String {
    let allowed = config.netmon.egress.allow.len();
    match config.netmon.egress.mode {
        EgressMode::LocalDeny => format!(
            "local_deny (this host and the networks around it refused; {allowed} netmon.egress.allow entries)"
        ),
        EgressMode::Allowlist => format!(
            "allowlist (every destination not allowed refused; {allowed} netmon.egress.allow entries)"
        ),
        EgressMode::Open => {
            "open (netmon.egress.mode: open; sessions reach this host's services)".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With `pin_llm_egress`, the sessions' way around the proxy is shut for every provider,
    /// and for Code Assist, which Gemini CLI signed in with Google uses and no dialect reads.
    #[test]
    fn pinned_egress_denies_every_providers_host() {
        let mut config = Config::default();
        config.netmon.pin_llm_egress = true;
        let registry = crate::registry::Registry::in_memory().expect("registry");
        let policy = Policy::new(&config, std::sync::Arc::new(registry), &[]).expect("policy");
        let pinned: Vec<(String, String, u16)> = watched_endpoints(&config, &policy)
            .into_iter()
            .filter(|e| e.kind == "llm" && e.action == RuleAction::Deny)
            .map(|e| (e.id, e.host, e.port))
            .collect();
        assert_eq!(
            pinned,
            [
                ("llm:anthropic", "api.anthropic.com"),
                ("llm:openai", "api.openai.com"),
                ("llm:gemini", "generativelanguage.googleapis.com"),
                ("llm:gemini-code-assist", "cloudcode-pa.googleapis.com"),
            ]
            .map(|(id, host)| (id.to_owned(), host.to_owned(), 443))
        );
        config.netmon.pin_llm_egress = false;
        assert!(
            watched_endpoints(&config, &policy)
                .iter()
                .all(|e| e.kind != "llm")
        );
    }
}
