//! The session boundary: the rules that refuse a session the host and the networks around it
//! (or, in allowlist mode, everything), and the ports no session may bind.
//!
//! The refusals are ordinary DENY rules of their own `server_index`es (`HOST_LOCAL_INDEX`,
//! `LOCAL_NET_INDEX`, `UNLISTED_INDEX`), laid under every other rule: the kernel's lookup takes
//! an exact address before a range and a port before "any port", so a declared server the
//! policy allows (a FLAG rule), toolwall's own endpoints, the resolvers and the owner's
//! `netmon.egress.allow` (PASS rules) are exceptions to them by construction, and a server the
//! policy denies stays denied. A port the session bound itself is the one exception the kernel
//! makes on its own (`SESSION_PORTS`), and only on the host's own addresses.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use agent_common::rule::{HOST_LOCAL_INDEX, LOCAL_NET_INDEX, UNLISTED_INDEX, is_boundary};

use super::rules::{Rule, RuleAction, is_local, mask};

/// What the boundary refuses (from `netmon.egress.mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BoundaryMode {
    /// Nothing: only the servers', providers' and DNS rules apply.
    Off,
    /// The host itself and the networks around it.
    LocalDeny,
    /// Every destination no other rule lets through.
    Allowlist,
}

/// The ranges around the host: private (RFC 1918), shared (RFC 6598, carrier-grade NAT and
/// overlay networks), link-local, unique-local, the limited broadcast and multicast. The
/// host's own addresses come from [`super::local`].
const LOCAL_NETS: [(IpAddr, u8); 11] = [
    (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)), 8),
    (IpAddr::V4(Ipv4Addr::new(172, 16, 0, 0)), 12),
    (IpAddr::V4(Ipv4Addr::new(192, 168, 0, 0)), 16),
    (IpAddr::V4(Ipv4Addr::new(100, 64, 0, 0)), 10),
    (IpAddr::V4(Ipv4Addr::new(169, 254, 0, 0)), 16),
    (IpAddr::V4(Ipv4Addr::new(224, 0, 0, 0)), 4),
    (IpAddr::V4(Ipv4Addr::BROADCAST), 32),
    (IpAddr::V6(Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0)), 7),
    (IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)), 10),
    (IpAddr::V6(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0)), 8),
    // 0.0.0.0/8 other than 0.0.0.0 itself (which the host rule covers): "this network".
    (IpAddr::V4(Ipv4Addr::UNSPECIFIED), 8),
];

/// The boundary's refusals for `mode`, on every port. `broadcasts` are the directed broadcast
/// addresses of the host's IPv4 subnets ([`super::local::subnet_broadcasts`]). The host rule is
/// one address: laying it out widens it to loopback, the unspecified addresses and every
/// interface address ([`super::rules::widen_local`]), kept current as they change.
pub(crate) fn refusals(mode: BoundaryMode, broadcasts: &[Ipv4Addr]) -> Vec<Rule> {
    if mode == BoundaryMode::Off {
        return Vec::new();
    }
    let deny = |addr: IpAddr, prefix: u8, server_index: u32| Rule {
        addr,
        prefix,
        port: 0,
        server_index,
        action: RuleAction::Deny,
    };
    let mut out = vec![deny(IpAddr::V4(Ipv4Addr::LOCALHOST), 32, HOST_LOCAL_INDEX)];
    out.extend(
        LOCAL_NETS
            .iter()
            .map(|&(addr, prefix)| deny(addr, prefix, LOCAL_NET_INDEX)),
    );
    // Loopback's own "broadcast" (127.255.255.255 of 127.0.0.1/8) is the host: a rule on it
    // would be widened over the host rule's addresses.
    out.extend(
        broadcasts
            .iter()
            .filter(|b| !b.is_loopback())
            .map(|&b| deny(IpAddr::V4(b), 32, LOCAL_NET_INDEX)),
    );
    if mode == BoundaryMode::Allowlist {
        // `::/0` covers the IPv4-mapped space too.
        out.push(deny(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0, UNLISTED_INDEX));
    }
    out
}

/// The ports no session may bind: every port a rule of a server, of toolwall itself or of a
/// resolver names on this host (a single local address, or a range holding one), with the
/// `server_index` to report. A session holding one of them while its owner restarts would
/// receive what was meant for it (a proxy's requests with their keys, a server's calls).
pub(crate) fn reserved_ports(rules: &[Rule], locals: &[IpAddr]) -> BTreeMap<u16, u32> {
    let mut out = BTreeMap::new();
    for rule in rules {
        if rule.port == 0 || is_boundary(rule.server_index) {
            continue;
        }
        if holds_local(rule, locals) {
            out.entry(rule.port).or_insert(rule.server_index);
        }
    }
    out
}

/// Whether a rule's address or range takes in one of this host's addresses.
fn holds_local(rule: &Rule, locals: &[IpAddr]) -> bool {
    let single = rule.prefix == if rule.addr.is_ipv4() { 32 } else { 128 };
    if single {
        return is_local(rule.addr, locals);
    }
    let (net, bits) = mapped(rule.addr, rule.prefix);
    let fixed = [
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ];
    fixed.iter().chain(locals).any(|&addr| {
        let (addr, _) = mapped(addr, if addr.is_ipv4() { 32 } else { 128 });
        mask(addr, bits) == mask(net, bits)
    })
}

fn mapped(addr: IpAddr, prefix: u8) -> (Ipv6Addr, u32) {
    match addr {
        IpAddr::V4(v4) => (v4.to_ipv6_mapped(), 96 + u32::from(prefix.min(32))),
        IpAddr::V6(v6) => (v6, u32::from(prefix.min(128))),
    }
}

#[cfg(test)]
mod tests;
