//! Endpoint rules as user space states them, and how they become map entries.
//!
//! One key space for all programs: IPv4 addresses are stored IPv4-mapped (`::ffff:a.b.c.d`).
//! A rule on a local address — a loopback one, an unspecified one (`0.0.0.0`, `::`) or any
//! address of any interface of the host — is widened to every local address (127.0.0.0/8, `::1`,
//! the unspecified ones, each interface address, and their mapped forms), because a server
//! listening on `0.0.0.0` or `[::]` answers on all of them and Linux routes a connect to
//! `0.0.0.0` or `::` to the local host (a rule on one address alone is passed by connecting
//! to another). The interface addresses come from
//! [`super::local`], kept current as they change.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use agent_common::rule::{
    ACTION_DENY, ACTION_FLAG, ACTION_PASS, CIDR_PORT_BITS, CidrKey, EndpointKey, EndpointRule,
    is_boundary,
};

/// What the kernel does on a match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuleAction {
    /// Let it through, emit an event.
    Flag,
    /// Refuse with EPERM, emit an event.
    Deny,
    /// Let it through unrecorded: an exception inside a wider FLAG rule (an allowed DNS
    /// resolver); never laid over a DENY.
    Pass,
}

impl RuleAction {
    fn wire(self) -> u8 {
        match self {
            RuleAction::Flag => ACTION_FLAG,
            RuleAction::Deny => ACTION_DENY,
            RuleAction::Pass => ACTION_PASS,
        }
    }
}

/// One endpoint rule: an address or range, a port (0 = any), whose server, what to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    /// The address (an IPv4 one is stored mapped).
    pub addr: IpAddr,
    /// Prefix length in the address's own family (32 / 128 for a single address).
    pub prefix: u8,
    /// Destination port, 0 = any.
    pub port: u16,
    /// Index into the daemon's server table (reported back in events).
    pub server_index: u32,
    /// Flag or deny.
    pub action: RuleAction,
}

impl Rule {
    /// A rule on one address.
    pub fn exact(addr: IpAddr, port: u16, server_index: u32, action: RuleAction) -> Self {
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        Rule {
            addr,
            prefix,
            port,
            server_index,
            action,
        }
    }

    /// The address in the shared key space and the prefix length over it.
    fn mapped(&self) -> (Ipv6Addr, u32) {
        match self.addr {
            IpAddr::V4(v4) => (v4.to_ipv6_mapped(), 96 + u32::from(self.prefix.min(32))),
            IpAddr::V6(v6) => (v6, u32::from(self.prefix.min(128))),
        }
    }
}

/// Whether an address is one of the host's loopback addresses, in any form.
pub(crate) fn is_loopback(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Whether a connect to `addr` reaches this host: loopback, unspecified, or one of `locals`
/// (the interface addresses), in any form.
pub(crate) fn is_local(addr: IpAddr, locals: &[IpAddr]) -> bool {
    let plain = match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    };
    is_loopback(plain) || plain.is_unspecified() || locals.contains(&plain)
}

/// Widens single-address rules on a local address to every local address; other rules pass
/// unchanged. Under the session boundary only refusals are widened: a server or toolwall
/// endpoint let through is let through on the address it was declared at (the boundary refuses
/// the host's other addresses, where another service may listen on the same port).
pub(crate) fn widen_local(rules: &[Rule], locals: &[IpAddr]) -> Vec<Rule> {
    let boundary = rules.iter().any(|r| is_boundary(r.server_index));
    let mut out = Vec::with_capacity(rules.len());
    for rule in rules {
        let single = rule.prefix == if rule.addr.is_ipv4() { 32 } else { 128 };
        let widens = rule.action == RuleAction::Deny || !boundary;
        if !(single && widens && is_local(rule.addr, locals)) {
            out.push(*rule);
            continue;
        }
        let fixed = [
            (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8),
            (IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
            (IpAddr::V4(Ipv4Addr::UNSPECIFIED), 32),
            (IpAddr::V6(Ipv6Addr::UNSPECIFIED), 128),
        ];
        let interfaces = locals
            .iter()
            .map(|&a| (a, if a.is_ipv4() { 32 } else { 128 }));
        for (addr, prefix) in fixed.into_iter().chain(interfaces) {
            out.push(Rule {
                addr,
                prefix,
                ..*rule
            });
        }
    }
    out
}

/// The kernel looks a destination's port up before "any port", in ranges as in single
/// addresses, so a wide rule on one port (DNS to anywhere, `0.0.0.0/0:443` allowed) would beat
/// the boundary's any-port refusal of a narrower range (`127.0.0.0/8`, `10.0.0.0/8`) on that
/// port. Each such range gets its refusal again on each of those ports; what is narrower still
/// (an exception on the port) keeps winning by its longer prefix.
fn close_port_gaps(mut rules: Vec<Rule>) -> Vec<Rule> {
    let ranges: Vec<Rule> = rules
        .iter()
        .filter(|r| is_boundary(r.server_index) && r.port == 0)
        .copied()
        .collect();
    let mut extra = Vec::new();
    for wide in rules
        .iter()
        .filter(|r| !is_boundary(r.server_index) && r.port != 0)
    {
        let (wide_addr, wide_bits) = wide.mapped();
        for range in &ranges {
            let (addr, bits) = range.mapped();
            if wide_bits < bits && mask(addr, wide_bits) == mask(wide_addr, wide_bits) {
                extra.push(Rule {
                    port: wide.port,
                    ..*range
                });
            }
        }
    }
    rules.extend(extra);
    rules
}

/// The contents both maps should have for a rule set.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct MapContents {
    /// Single addresses, in the exact-match hash map.
    pub exact: HashMap<EndpointKey, EndpointRule>,
    /// Ranges, in the LPM trie: (prefix length in bits, key) → rule.
    pub cidr: HashMap<(u32, CidrKey), EndpointRule>,
}

impl MapContents {
    /// Lays rules out as map entries (after widening local addresses to `locals`, the host's
    /// interface addresses). Two rules on one key: DENY wins over FLAG over PASS, so adding a
    /// server can never weaken another's deny; the session boundary's DENY is the floor under
    /// all of them (`super::boundary`). A PASS is an exception to the rule of its own
    /// `server_index` and to the boundary; one that another server's DENY of any width covers
    /// is dropped (an exact PASS would otherwise shadow a wider DENY in the kernel's lookup).
    pub(crate) fn from_rules(rules: &[Rule], locals: &[IpAddr]) -> Self {
        let mut out = MapContents::default();
        let widened = close_port_gaps(widen_local(rules, locals));
        let (passes, others): (Vec<Rule>, Vec<Rule>) = widened
            .into_iter()
            .partition(|r| r.action == RuleAction::Pass);
        out.lay_out(others);
        // A PASS is carved out of the rule of its own server_index; any other DENY wins. The
        // other servers' DENYs are laid out once per carving server (in practice one: DNS).
        let mut others_denies: HashMap<u32, MapContents> = HashMap::new();
        let passes: Vec<Rule> = passes
            .into_iter()
            .filter(|pass| {
                others_denies
                    .entry(pass.server_index)
                    .or_insert_with(|| {
                        let denies: Vec<Rule> = rules
                            .iter()
                            .filter(|r| {
                                r.action == RuleAction::Deny
                                    && r.server_index != pass.server_index
                                    && !is_boundary(r.server_index)
                            })
                            .copied()
                            .collect();
                        let mut map = MapContents::default();
                        map.lay_out(widen_local(&denies, locals));
                        map
                    })
                    .lookup(pass.addr, pass.port)
                    .is_none()
            })
            .collect();
        out.lay_out(passes);
        out
    }

    fn lay_out(&mut self, rules: Vec<Rule>) {
        let out = self;
        for rule in rules {
            let (addr, bits) = rule.mapped();
            let value = EndpointRule {
                server_index: rule.server_index,
                action: rule.action.wire(),
                _pad: [0; 3],
            };
            let strength = |rule: &EndpointRule| match rule.action {
                ACTION_DENY if is_boundary(rule.server_index) => 0,
                ACTION_DENY => 3,
                ACTION_FLAG => 2,
                _ => 1,
            };
            let keep_stronger = |old: &mut EndpointRule| {
                if strength(&value) >= strength(old) {
                    *old = value;
                }
            };
            if bits == 128 {
                let key = EndpointKey {
                    addr: addr.octets(),
                    port: rule.port,
                    _pad: [0; 2],
                };
                out.exact
                    .entry(key)
                    .and_modify(keep_stronger)
                    .or_insert(value);
            } else {
                let masked = mask(addr, bits);
                let key = CidrKey {
                    port: rule.port.to_be_bytes(),
                    addr: masked.octets(),
                };
                out.cidr
                    .entry((CIDR_PORT_BITS + bits, key))
                    .and_modify(keep_stronger)
                    .or_insert(value);
            }
        }
    }

    /// What the kernel would decide for a destination (the same lookup order as the programs);
    /// used by tests and by `toolwall` to explain a rule set.
    pub(crate) fn lookup(&self, addr: IpAddr, port: u16) -> Option<EndpointRule> {
        let v6 = match addr {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        for p in [port, 0] {
            if let Some(rule) = self.exact.get(&EndpointKey {
                addr: v6.octets(),
                port: p,
                _pad: [0; 2],
            }) {
                return Some(*rule);
            }
        }
        for p in [port, 0] {
            let best = self
                .cidr
                .iter()
                .filter(|((bits, key), _)| {
                    key.port == p.to_be_bytes()
                        && mask(v6, bits - CIDR_PORT_BITS).octets() == key.addr
                })
                .max_by_key(|((bits, _), _)| *bits);
            if let Some((_, rule)) = best {
                return Some(*rule);
            }
        }
        None
    }
}

pub(super) fn mask(addr: Ipv6Addr, bits: u32) -> Ipv6Addr {
    let v = u128::from(addr);
    let m = if bits == 0 {
        0
    } else {
        u128::MAX << (128 - bits.min(128))
    };
    Ipv6Addr::from(v & m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_rule_covers_every_loopback_form() {
        let maps = MapContents::from_rules(
            &[Rule::exact(ip("127.0.0.1"), 8080, 3, RuleAction::Deny)],
            &[],
        );
        for addr in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:127.9.9.9",
            "0.0.0.0",
            "::",
            "::ffff:0.0.0.0",
        ] {
            let rule = maps
                .lookup(ip(addr), 8080)
                .unwrap_or_else(|| panic!("{addr} not covered"));
            assert_eq!((rule.server_index, rule.action), (3, ACTION_DENY), "{addr}");
        }
        assert_eq!(
            maps.lookup(ip("127.0.0.1"), 8081),
            None,
            "other ports are not covered"
        );
        assert_eq!(maps.lookup(ip("10.0.0.1"), 8080), None);
    }

    #[test]
    fn a_rule_on_any_local_address_covers_every_local_address() {
        let locals = [
            ip("127.0.0.1"),
            ip("192.0.2.2"),
            ip("fd00::2"),
            ip("fe80::fc:ff:fe00:1"),
        ];
        for declared in [
            "127.0.0.1",
            "192.0.2.2",
            "::ffff:192.0.2.2",
            "fe80::fc:ff:fe00:1",
            "::",
        ] {
            let maps = MapContents::from_rules(
                &[Rule::exact(ip(declared), 8080, 3, RuleAction::Deny)],
                &locals,
            );
            for reached in [
                "127.0.0.1",
                "127.3.3.3",
                "::1",
                "0.0.0.0",
                "::",
                "192.0.2.2",
                "::ffff:192.0.2.2",
                "fd00::2",
                "fe80::fc:ff:fe00:1",
            ] {
                assert!(
                    maps.lookup(ip(reached), 8080).is_some(),
                    "declared {declared}, reached through {reached}"
                );
            }
            assert!(
                maps.lookup(ip("192.0.2.3"), 8080).is_none(),
                "a neighbour is not local"
            );
        }
        // A remote address stays a rule on itself alone.
        let remote = MapContents::from_rules(
            &[Rule::exact(ip("198.51.100.1"), 80, 1, RuleAction::Deny)],
            &locals,
        );
        assert!(remote.lookup(ip("127.0.0.1"), 80).is_none());
    }

    #[test]
    fn an_allowed_resolver_passes_inside_a_wider_flag_but_never_over_a_deny() {
        let any = |action| Rule {
            addr: ip("::"),
            prefix: 0,
            port: 53,
            server_index: 1,
            action,
        };
        let pass = Rule::exact(ip("192.0.2.53"), 53, 1, RuleAction::Pass);
        let action =
            |maps: &MapContents, addr: &str, port| maps.lookup(ip(addr), port).map(|r| r.action);
        let flagged = MapContents::from_rules(&[pass, any(RuleAction::Flag)], &[]);
        assert_eq!(action(&flagged, "192.0.2.53", 53), Some(ACTION_PASS));
        assert_eq!(
            action(&flagged, "::ffff:192.0.2.53", 53),
            Some(ACTION_PASS),
            "the mapped form too"
        );
        assert_eq!(action(&flagged, "198.51.100.9", 53), Some(ACTION_FLAG));
        assert_eq!(action(&flagged, "2001:db8::9", 53), Some(ACTION_FLAG));
        assert!(flagged.lookup(ip("198.51.100.9"), 5353).is_none());
        // Carved out of a DENY of its own rule: passes.
        let denied = MapContents::from_rules(&[pass, any(RuleAction::Deny)], &[]);
        assert_eq!(action(&denied, "192.0.2.53", 53), Some(ACTION_PASS));
        assert_eq!(action(&denied, "198.51.100.9", 53), Some(ACTION_DENY));
        // Another server's DENY that covers the resolver (say a denied server on port 53 whose
        // name never resolved: `::/0`) is not shadowed by the pass.
        let other_deny = Rule {
            server_index: 4,
            ..any(RuleAction::Deny)
        };
        let shadowed = MapContents::from_rules(&[pass, any(RuleAction::Flag), other_deny], &[]);
        assert_eq!(action(&shadowed, "192.0.2.53", 53), Some(ACTION_DENY));
        let exact_deny = Rule::exact(ip("192.0.2.53"), 53, 2, RuleAction::Deny);
        for rules in [[pass, exact_deny], [exact_deny, pass]] {
            assert_eq!(
                action(&MapContents::from_rules(&rules, &[]), "192.0.2.53", 53),
                Some(ACTION_DENY),
                "either order"
            );
        }
    }

    #[test]
    fn ipv4_rules_match_mapped_ipv6_destinations() {
        let maps = MapContents::from_rules(
            &[Rule::exact(ip("192.0.2.7"), 443, 1, RuleAction::Flag)],
            &[],
        );
        assert!(maps.lookup(ip("192.0.2.7"), 443).is_some());
        assert!(maps.lookup(ip("::ffff:192.0.2.7"), 443).is_some());
        assert!(maps.lookup(ip("192.0.2.8"), 443).is_none());
    }

    #[test]
    fn port_zero_means_any_port_and_exact_port_wins() {
        let maps = MapContents::from_rules(
            &[
                Rule::exact(ip("192.0.2.7"), 0, 1, RuleAction::Flag),
                Rule::exact(ip("192.0.2.7"), 22, 2, RuleAction::Deny),
            ],
            &[],
        );
        assert_eq!(maps.lookup(ip("192.0.2.7"), 9999).unwrap().server_index, 1);
        assert_eq!(maps.lookup(ip("192.0.2.7"), 22).unwrap().server_index, 2);
    }

    #[test]
    fn cidr_rules_match_inside_the_range_only_and_keep_ports_apart() {
        let rules = [
            Rule {
                addr: ip("198.51.100.0"),
                prefix: 24,
                port: 80,
                server_index: 1,
                action: RuleAction::Flag,
            },
            Rule {
                addr: ip("198.51.100.0"),
                prefix: 24,
                port: 81,
                server_index: 2,
                action: RuleAction::Deny,
            },
            Rule {
                addr: ip("2001:db8::"),
                prefix: 32,
                port: 0,
                server_index: 3,
                action: RuleAction::Deny,
            },
        ];
        let maps = MapContents::from_rules(&rules, &[]);
        assert_eq!(
            maps.lookup(ip("198.51.100.200"), 80).unwrap().server_index,
            1
        );
        assert_eq!(
            maps.lookup(ip("198.51.100.200"), 81).unwrap().server_index,
            2
        );
        assert_eq!(maps.lookup(ip("198.51.101.1"), 80), None);
        assert_eq!(
            maps.lookup(ip("2001:db8:1::5"), 12),
            Some(EndpointRule {
                server_index: 3,
                action: ACTION_DENY,
                _pad: [0; 3]
            })
        );
        assert_eq!(maps.lookup(ip("2001:db9::5"), 12), None);
    }

    #[test]
    fn deny_wins_when_two_rules_share_a_key() {
        for order in [
            [RuleAction::Deny, RuleAction::Flag],
            [RuleAction::Flag, RuleAction::Deny],
        ] {
            let rules: Vec<_> = order
                .iter()
                .enumerate()
                .map(|(i, a)| Rule::exact(ip("127.0.0.1"), 80, i as u32, *a))
                .collect();
            assert_eq!(
                MapContents::from_rules(&rules, &[])
                    .lookup(ip("127.0.0.1"), 80)
                    .unwrap()
                    .action,
                ACTION_DENY
            );
        }
    }
}
