//! The watched endpoints, and the rules their addresses make.

use std::{collections::HashMap, net::IpAddr, time::Duration};

use crate::netmon::{Rule, RuleAction};

/// An endpoint the kernel watches: a network MCP server, or an LLM provider's API host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WatchedEndpoint {
    /// Server id (or `llm:anthropic` / `llm:openai` for provider hosts).
    pub id: String,
    /// `http`, `sse`, `llm`, `dns` or `api` (the daemon's own loopback API).
    pub kind: String,
    /// Host name or IP literal from the URL, or a range (`ADDR/PREFIX`).
    pub host: String,
    /// Port from the URL (its scheme's default when the URL has none).
    pub port: u16,
    /// Flag (record) or deny (EPERM) connections from sessions.
    pub action: RuleAction,
    /// Addresses carved out of a range (the allowed resolvers inside DNS to anywhere): let
    /// through unrecorded on `port`, unless another DENY covers them.
    pub except: Vec<IpAddr>,
}

/// What a host name resolved to the last time it resolved, so that a name that stops
/// resolving keeps its rules (rather than losing them, DENY included), and when
/// the earliest of those answers expires (their DNS TTL), so that a changed address is picked up
/// then rather than at the next interval.
#[derive(Debug, Default)]
pub(crate) struct LastKnown {
    addresses: HashMap<String, Vec<IpAddr>>,
    /// The earliest TTL expiry of the last pass's names, when DNS said.
    expires: Option<std::time::Instant>,
    /// Asks DNS for the TTLs (getaddrinfo, which finds the addresses as the agent's libc does,
    /// does not report them); built on first use, `None` when the system configuration cannot
    /// be read.
    ttl: Option<Option<hickory_resolver::TokioResolver>>,
}

impl LastKnown {
    /// When the earliest answer of the last pass expires.
    pub(crate) fn expires(&self) -> Option<std::time::Instant> {
        self.expires
    }

    /// The TTL expiry of `host`'s DNS answer, if DNS has one.
    async fn ttl_of(&mut self, host: &str) -> Option<std::time::Instant> {
        let resolver = self.ttl.get_or_insert_with(|| {
            match hickory_resolver::Resolver::builder_tokio().and_then(|b| b.build()) {
                Ok(resolver) => Some(resolver),
                Err(error) => {
                    tracing::warn!(%error, "cannot read the system's DNS configuration; names are re-resolved every resolve interval only, not on their TTL");
                    None
                }
            }
        });
        // Bounded: a name getaddrinfo found elsewhere (nss-myhostname, mDNS) may leave DNS
        // waiting; the interval still re-resolves it.
        let lookup =
            tokio::time::timeout(Duration::from_secs(2), resolver.as_ref()?.lookup_ip(host))
                .await
                .ok()?
                .ok()?;
        Some(lookup.valid_until())
    }
}

/// Resolves each endpoint's host to all its addresses and lays out the rules.
///
/// A name that does not resolve keeps the addresses it last resolved to; one that never
/// resolved is, when it is DENY, denied on its port on every address (`::/0`, which covers the
/// mapped IPv4 space too) until it does. Either way it is reported.
pub(crate) async fn resolve_rules(
    endpoints: &[WatchedEndpoint],
    known: &mut LastKnown,
) -> Vec<Rule> {
    let mut rules = Vec::new();
    known.expires = None;
    for (index, endpoint) in endpoints.iter().enumerate() {
        let index = index as u32;
        // A range (`::/0` for DNS to any resolver).
        if let Some((addr, prefix)) = endpoint.host.split_once('/')
            && let (Ok(addr), Ok(prefix)) = (addr.parse::<IpAddr>(), prefix.parse::<u8>())
        {
            rules.push(Rule {
                addr,
                prefix,
                port: endpoint.port,
                server_index: index,
                action: endpoint.action,
            });
            rules.extend(
                endpoint
                    .except
                    .iter()
                    .map(|&a| Rule::exact(a, endpoint.port, index, RuleAction::Pass)),
            );
            continue;
        }
        let addrs: Vec<IpAddr> = match endpoint.host.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => {
                match tokio::net::lookup_host((endpoint.host.as_str(), endpoint.port)).await {
                    Ok(found) => {
                        let mut found: Vec<IpAddr> = found.map(|sa| sa.ip()).collect();
                        found.sort();
                        found.dedup();
                        known.addresses.insert(endpoint.host.clone(), found.clone());
                        if let Some(expiry) = known.ttl_of(&endpoint.host).await {
                            known.expires = Some(known.expires.map_or(expiry, |e| e.min(expiry)));
                        }
                        found
                    }
                    Err(error) => match known.addresses.get(&endpoint.host) {
                        Some(last) => {
                            tracing::warn!(server = %endpoint.id, host = %endpoint.host, %error, addresses = ?last, "cannot resolve; its rule stays on the addresses it last resolved to");
                            last.clone()
                        }
                        None if endpoint.action == RuleAction::Deny => {
                            tracing::error!(server = %endpoint.id, host = %endpoint.host, port = endpoint.port, %error, "cannot resolve and never did; port denied on every address until it resolves");
                            rules.push(Rule {
                                addr: IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                                prefix: 0,
                                port: endpoint.port,
                                server_index: index,
                                action: RuleAction::Deny,
                            });
                            continue;
                        }
                        None => {
                            tracing::warn!(server = %endpoint.id, host = %endpoint.host, %error, "cannot resolve and never did; connections to it are not flagged until it resolves");
                            continue;
                        }
                    },
                }
            }
        };
        for addr in addrs {
            rules.push(Rule::exact(addr, endpoint.port, index, endpoint.action));
        }
    }
    rules.sort_by_key(|r| (r.addr, r.prefix, r.port, r.action));
    rules.dedup();
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_names_to_every_address_and_keeps_literals() {
        let endpoints = vec![
            WatchedEndpoint {
                id: "a".into(),
                kind: "http".into(),
                host: "localhost".into(),
                port: 3001,
                action: RuleAction::Deny,
                except: Vec::new(),
            },
            WatchedEndpoint {
                id: "b".into(),
                kind: "sse".into(),
                host: "[::1]".into(),
                port: 3002,
                action: RuleAction::Flag,
                except: Vec::new(),
            },
            WatchedEndpoint {
                id: "c".into(),
                kind: "http".into(),
                host: "no-such-host.invalid".into(),
                port: 1,
                action: RuleAction::Deny,
                except: Vec::new(),
            },
        ];
        let mut known = LastKnown::default();
        let rules = resolve_rules(&endpoints, &mut known).await;
        let a: Vec<_> = rules
            .iter()
            .filter(|r| r.server_index == 0)
            .map(|r| r.addr)
            .collect();
        assert!(
            a.contains(&"127.0.0.1".parse().unwrap()),
            "localhost → 127.0.0.1: {a:?}"
        );
        assert!(rules.iter().any(|r| r.server_index == 1
            && r.addr == "::1".parse::<IpAddr>().unwrap()
            && r.port == 3002));
        let never = rules
            .iter()
            .filter(|r| r.server_index == 2)
            .collect::<Vec<_>>();
        assert_eq!(
            never.len(),
            1,
            "a DENY name that never resolved: its port denied everywhere"
        );
        assert_eq!((never[0].prefix, never[0].port), (0, 1));
        assert!(never[0].addr.is_unspecified());
    }

    #[tokio::test]
    async fn a_name_that_stops_resolving_keeps_its_last_addresses() {
        let mut known = LastKnown::default();
        known
            .addresses
            .insert("gone.invalid".into(), vec!["192.0.2.9".parse().unwrap()]);
        let endpoint = |action| WatchedEndpoint {
            id: "a".into(),
            kind: "http".into(),
            host: "gone.invalid".into(),
            port: 80,
            action,
            except: Vec::new(),
        };
        for action in [RuleAction::Deny, RuleAction::Flag] {
            let rules = resolve_rules(&[endpoint(action)], &mut known).await;
            assert_eq!(
                rules,
                vec![Rule::exact("192.0.2.9".parse().unwrap(), 80, 0, action)]
            );
        }
        let mut fresh = LastKnown::default();
        assert!(
            resolve_rules(&[endpoint(RuleAction::Flag)], &mut fresh)
                .await
                .is_empty(),
            "a FLAG name that never resolved has nothing to flag"
        );
    }
}
