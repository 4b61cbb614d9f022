//! The session boundary: the rules that refuse a session the host and the networks around it
//! (or, in allowlist mode, everything), and the ports no session may bind.
//!
//! The refusals are ordinary DENY rules of their own `server_index`es (`HOST_LOCAL_INDEX`,
//! `LOCAL_NET_INDEX`, `UNLISTED_INDEX`), laid under every other rule: the kernel's lookup takes
//! an exact address before a range and a port before "any port", so a declared server the
//! policy allows (a FLAG rule), toolwall's own endpoints, the resolvers and the owner's
//! `netmon.egress.allow` (PASS rules) are exceptions to them by construction, and a server the
//! policy denies stays denied. A socket the session made itself is the one exception the kernel
//! makes on its own, and only on the host's own addresses: the socket that would take the
//! connect is looked up, and must carry the session's tag (`sock_create`).

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use agent_common::rule::{HOST_LOCAL_INDEX, LOCAL_NET_INDEX, UNLISTED_INDEX, is_boundary};

use super::{
    routes::LocalTable,
    rules::{Rule, RuleAction, is_local, mask},
};

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

/// The boundary's refusals for `mode`, on every port. `table` is the kernel's local routing
/// table ([`super::routes::local_table`]): its local prefixes are the host too, its broadcast
/// addresses the network around it. The host rule is one address: laying it out widens it to
/// loopback, the unspecified addresses and every interface address
/// ([`super::rules::widen_local`]), kept current as they change.
pub(crate) fn refusals(mode: BoundaryMode, table: &LocalTable) -> Vec<Rule> {
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
        table
            .local
            .iter()
            .map(|&(addr, prefix)| deny(addr, prefix, HOST_LOCAL_INDEX)),
    );
    out.extend(
        LOCAL_NETS
            .iter()
            .map(|&(addr, prefix)| deny(addr, prefix, LOCAL_NET_INDEX)),
    );
    // Loopback's own "broadcast" (127.255.255.255 of 127.0.0.1/8) is the host: a rule on it
    // would be widened over the host rule's addresses.
    out.extend(
        table
            .broadcast
            .iter()
            .filter(|b| !is_local(**b, &[]))
            .map(|&b| deny(b, if b.is_ipv4() { 32 } else { 128 }, LOCAL_NET_INDEX)),
    );
    if mode == BoundaryMode::Allowlist {
        // `::/0` covers the IPv4-mapped space too.
        out.push(deny(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0, UNLISTED_INDEX));
    }
    out
}

/// The endpoint id of `netmon.egress.allow` entries: host services a session may reach, whose
/// ports it may not bind.
pub(crate) const ALLOW_ENDPOINT: &str = "netmon.egress.allow";

/// The ports no session may bind: every port a rule of a listener (`is_listener`: a declared
/// server, toolwall's own API and proxy) names on this host (a single local address, or a range
/// holding one), with the `server_index` to report. A session holding one of them while its
/// owner restarts would receive what was meant for it (a proxy's requests with their keys, a
/// server's calls).
pub(crate) fn reserved_ports(
    rules: &[Rule],
    locals: &[IpAddr],
    is_listener: impl Fn(u32) -> bool,
) -> BTreeMap<u16, u32> {
    let mut out = BTreeMap::new();
    for rule in rules {
        if rule.port == 0 || is_boundary(rule.server_index) || !is_listener(rule.server_index) {
            continue;
        }
        if holds_local(rule, locals) {
            out.entry(rule.port).or_insert(rule.server_index);
        }
    }
    out
}

/// Whether a rule's address or range takes in one of this host's addresses: any of loopback
/// (all of `127.0.0.0/8`, `::1`), the unspecified addresses, or an interface address. A range
/// that holds a loopback address other than `127.0.0.1` (`127.0.0.8/29`) holds the host.
fn holds_local(rule: &Rule, locals: &[IpAddr]) -> bool {
    let single = rule.prefix == if rule.addr.is_ipv4() { 32 } else { 128 };
    if single {
        return is_local(rule.addr, locals);
    }
    let (net, bits) = mapped(rule.addr, rule.prefix);
    let host: [(IpAddr, u8); 4] = [
        (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8),
        (IpAddr::V4(Ipv4Addr::UNSPECIFIED), 32),
        (IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
        (IpAddr::V6(Ipv6Addr::UNSPECIFIED), 128),
    ];
    let interfaces = locals
        .iter()
        .map(|&addr| (addr, if addr.is_ipv4() { 32 } else { 128 }));
    // Two prefixes overlap when they agree on the shorter one's bits.
    host.into_iter().chain(interfaces).any(|(addr, prefix)| {
        let (other, other_bits) = mapped(addr, prefix);
        let common = bits.min(other_bits);
        mask(net, common) == mask(other, common)
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

/// The kernel's `net.ipv4.ip_local_reserved_ports` (IPv6 too): ports a `listen()`, `connect()`
/// or `sendto()` without `bind()` is never given. The bind hooks see only explicit binds, so
/// without this a session calling `listen()` in a loop lands on a reserved port that is free
/// (a declared server that is down, toolwall's own while the daemon restarts).
const RESERVED_SYSCTL: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";

/// Adds the `ports` that lie in the kernel's ephemeral range (the only ones it could hand out)
/// to its reserved ports, and takes back those this daemon added before that are no longer
/// wanted (`added` remembers them); the host's own entries are kept. With no `ports`, gives back
/// all this daemon added (a clean stop: the ephemeral range is not left to shrink).
pub(crate) fn reserve_from_autobind(
    ports: &BTreeMap<u16, u32>,
    added: &mut std::collections::BTreeSet<u16>,
) -> std::io::Result<()> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")?;
    let mut bounds = range.split_whitespace().map(str::parse::<u16>);
    let (Some(Ok(low)), Some(Ok(high))) = (bounds.next(), bounds.next()) else {
        return Err(std::io::Error::other(
            "ip_local_port_range is not two ports",
        ));
    };
    let ports: Vec<u16> = ports
        .keys()
        .copied()
        .filter(|p| (low..=high).contains(p))
        .collect();
    // In one read: the kernel's handler of this file does not continue a read where an
    // earlier one stopped (read_to_string's first 32-byte probe got only the list's start).
    let mut buf = vec![0u8; 1 << 20];
    let got = std::io::Read::read(&mut std::fs::File::open(RESERVED_SYSCTL)?, &mut buf)?;
    let current = String::from_utf8_lossy(&buf[..got]).into_owned();
    let (text, now_added) = merged_reserved(&current, ports.into_iter(), added);
    if text != current.trim() {
        std::fs::write(RESERVED_SYSCTL, &text)?;
    }
    *added = now_added;
    Ok(())
}

/// The sysctl's new text: what it lists, less what this daemon added and no longer wants,
/// plus `wanted`; and the ports this daemon has added after that.
fn merged_reserved(
    current: &str,
    wanted: impl Iterator<Item = u16>,
    added: &std::collections::BTreeSet<u16>,
) -> (String, std::collections::BTreeSet<u16>) {
    let mut listed = std::collections::BTreeSet::new();
    for part in current.trim().split(',').filter(|p| !p.is_empty()) {
        let (low, high) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(low), Ok(high)) = (low.trim().parse::<u16>(), high.trim().parse::<u16>()) {
            listed.extend(low..=high);
        }
    }
    let wanted: std::collections::BTreeSet<u16> = wanted.filter(|&p| p != 0).collect();
    let host_own: std::collections::BTreeSet<u16> = listed
        .iter()
        .copied()
        .filter(|p| !added.contains(p) || wanted.contains(p))
        .collect();
    let now_added: std::collections::BTreeSet<u16> = wanted
        .iter()
        .copied()
        .filter(|p| !listed.contains(p) || added.contains(p))
        .collect();
    let all: std::collections::BTreeSet<u16> = host_own.union(&wanted).copied().collect();
    // As ranges, the sysctl's own form.
    let mut parts: Vec<String> = Vec::new();
    let mut run: Option<(u16, u16)> = None;
    for port in all {
        run = match run {
            Some((low, high)) if high.checked_add(1) == Some(port) => Some((low, port)),
            Some((low, high)) => {
                parts.push(range_text(low, high));
                Some((port, port))
            }
            None => Some((port, port)),
        };
    }
    if let Some((low, high)) = run {
        parts.push(range_text(low, high));
    }
    (parts.join(","), now_added)
}

fn range_text(low: u16, high: u16) -> String {
    if low == high {
        low.to_string()
    } else {
        format!("{low}-{high}")
    }
}
