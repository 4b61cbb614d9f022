//! Which addresses the kernel layer watches and what it does with a connection to each: the
//! network MCP servers, the LLM providers, the daemon's own API and other DNS resolvers.
//! Computed at start and again for each bundle revision.

use crate::{
    config::{Config, OtherResolvers, ServerType},
    netmon::{RuleAction, service::WatchedEndpoint},
    policy::Policy,
};

/// Which addresses the kernel watches: every network MCP server (DENY when the server is
/// denied by policy or must be reached through `toolwall mcp-proxy`, else FLAG), and with
/// `netmon.pin_llm_egress` the LLM providers' API hosts (DENY: the session must use the proxy).
/// The daemon's own loopback API, denied to sessions: a process inside one talks to the daemon
/// through the socket, which knows where it runs; on TCP it could present the web token (a root
/// agent can read it) and read every session's records or answer its own calls that wait for a
/// person.
pub(super) fn api_endpoints(api: std::net::SocketAddr) -> Vec<WatchedEndpoint> {
    let hosts = match api.ip() {
        ip if ip.is_unspecified() => vec!["0.0.0.0/0".to_owned(), "::/0".to_owned()],
        ip => vec![ip.to_string()],
    };
    hosts
        .into_iter()
        .map(|host| WatchedEndpoint {
            id: "toolwall:api".into(),
            kind: "api".into(),
            host,
            port: api.port(),
            action: RuleAction::Deny,
            except: Vec::new(),
        })
        .collect()
}

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
            ("anthropic", &config.proxy.providers.anthropic),
            ("openai", &config.proxy.providers.openai),
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
    let other = match dns.other_resolvers {
        OtherResolvers::Off => return out,
        OtherResolvers::Flag => RuleAction::Flag,
        OtherResolvers::Deny => RuleAction::Deny,
    };
    let allowed = if dns.resolvers.is_empty() {
        crate::netmon::local::system_resolvers()
    } else {
        dns.resolvers.clone()
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

fn split_host_port(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
}
