//! The boundary as the kernel's lookup sees it: laid out with a server table, asked what it
//! does with each kind of destination.

use std::net::IpAddr;

use agent_common::rule::{
    ACTION_DENY, ACTION_FLAG, ACTION_PASS, HOST_LOCAL_INDEX, LOCAL_NET_INDEX, UNLISTED_INDEX,
};

use super::{BoundaryMode, refusals, reserved_ports};
use crate::netmon::rules::{MapContents, Rule, RuleAction};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

/// A host with one LAN address on a public /24, and the rules of: a declared server the policy
/// allows (FLAG, index 0), one it denies (DENY, index 1), the LLM proxy (PASS, index 2) and an
/// owner's allow entry for a database on the LAN (PASS, index 3).
fn laid_out(mode: BoundaryMode) -> MapContents {
    let locals = [ip("127.0.0.1"), ip("::1"), ip("198.51.100.7")];
    let mut rules = vec![
        Rule::exact(ip("127.0.0.1"), 3001, 0, RuleAction::Flag),
        Rule::exact(ip("127.0.0.1"), 3002, 1, RuleAction::Deny),
        Rule::exact(ip("127.0.0.1"), 8787, 2, RuleAction::Pass),
        Rule {
            addr: ip("10.1.0.0"),
            prefix: 16,
            port: 5432,
            server_index: 3,
            action: RuleAction::Pass,
        },
    ];
    // As the host lists them: loopback's /8 has a "broadcast" too.
    let broadcasts = ["198.51.100.255", "127.255.255.255"].map(|b| b.parse().expect("ip"));
    rules.extend(refusals(mode, &broadcasts));
    MapContents::from_rules(&rules, &locals)
}

fn outcome(map: &MapContents, addr: &str, port: u16) -> Option<(u32, u8)> {
    map.lookup(ip(addr), port)
        .map(|rule| (rule.server_index, rule.action))
}

#[test]
fn the_host_and_the_networks_around_it_are_refused_in_every_form() {
    let map = laid_out(BoundaryMode::LocalDeny);
    let host = Some((HOST_LOCAL_INDEX, ACTION_DENY));
    let net = Some((LOCAL_NET_INDEX, ACTION_DENY));
    for (addr, port, want) in [
        ("127.0.0.1", 22, host),
        ("127.9.9.9", 631, host),
        ("::1", 6379, host),
        ("::ffff:127.0.0.1", 6379, host),
        ("0.0.0.0", 80, host),
        ("::", 80, host),
        // The host's LAN address: the host, not the network.
        ("198.51.100.7", 22, host),
        ("::ffff:198.51.100.7", 22, host),
        ("10.0.0.1", 80, net),
        ("172.20.1.1", 2375, net),
        ("192.168.1.1", 80, net),
        ("100.100.100.100", 53, net),
        ("169.254.169.254", 80, net),
        ("fd00::2", 80, net),
        ("fe80::1", 22, net),
        ("255.255.255.255", 9999, net),
        ("198.51.100.255", 9999, net),
        ("224.0.0.1", 9999, net),
        ("239.255.255.250", 1900, net),
        ("ff02::1", 9999, net),
        ("0.1.2.3", 80, net),
    ] {
        assert_eq!(outcome(&map, addr, port), want, "{addr}:{port}");
    }
    // The internet beyond stays open in this mode: no rule, the programs let it through.
    assert_eq!(outcome(&map, "93.184.216.34", 443), None);
    assert_eq!(outcome(&map, "2606:4700::1111", 443), None);
    assert_eq!(
        outcome(&map, "198.51.100.8", 443),
        None,
        "a neighbour on a public subnet"
    );
}

#[test]
fn servers_toolwall_and_allow_entries_are_exceptions_and_a_denied_server_stays_denied() {
    for mode in [BoundaryMode::LocalDeny, BoundaryMode::Allowlist] {
        let map = laid_out(mode);
        // The allowed server, on every local address it answers on.
        for addr in ["127.0.0.1", "::1", "198.51.100.7", "0.0.0.0"] {
            assert_eq!(outcome(&map, addr, 3001), Some((0, ACTION_FLAG)), "{addr}");
            assert_eq!(outcome(&map, addr, 3002), Some((1, ACTION_DENY)), "{addr}");
            assert_eq!(outcome(&map, addr, 8787), Some((2, ACTION_PASS)), "{addr}");
        }
        assert_eq!(outcome(&map, "10.1.2.3", 5432), Some((3, ACTION_PASS)));
        assert_eq!(
            outcome(&map, "10.1.2.3", 5433),
            Some((LOCAL_NET_INDEX, ACTION_DENY)),
            "an allow entry opens its port only"
        );
    }
}

#[test]
fn an_allow_entry_on_the_same_key_as_the_boundary_wins_but_never_over_a_server_deny() {
    let locals = [ip("127.0.0.1")];
    let mut rules = refusals(BoundaryMode::LocalDeny, &[]);
    // `netmon.egress.allow: ["127.0.0.1"]`: the whole host, every port.
    rules.push(Rule::exact(ip("127.0.0.1"), 0, 7, RuleAction::Pass));
    rules.push(Rule::exact(ip("127.0.0.1"), 3002, 1, RuleAction::Deny));
    let map = MapContents::from_rules(&rules, &locals);
    assert_eq!(outcome(&map, "127.0.0.1", 22), Some((7, ACTION_PASS)));
    assert_eq!(outcome(&map, "::1", 22), Some((7, ACTION_PASS)));
    assert_eq!(outcome(&map, "127.0.0.1", 3002), Some((1, ACTION_DENY)));
}

#[test]
fn allowlist_mode_refuses_everything_unlisted_and_off_refuses_nothing() {
    let map = laid_out(BoundaryMode::Allowlist);
    assert_eq!(
        outcome(&map, "93.184.216.34", 443),
        Some((UNLISTED_INDEX, ACTION_DENY))
    );
    assert_eq!(
        outcome(&map, "2606:4700::1111", 443),
        Some((UNLISTED_INDEX, ACTION_DENY))
    );
    assert_eq!(
        outcome(&map, "127.0.0.1", 22),
        Some((HOST_LOCAL_INDEX, ACTION_DENY)),
        "the host keeps its own index: a port the session bound stays reachable"
    );
    assert!(refusals(BoundaryMode::Off, &["10.0.0.255".parse().expect("v4")]).is_empty());
    let off = laid_out(BoundaryMode::Off);
    assert_eq!(outcome(&off, "127.0.0.1", 22), None);
    assert_eq!(outcome(&off, "10.0.0.1", 80), None);
}

#[test]
fn reserved_ports_are_those_of_rules_on_this_host() {
    let locals = [ip("127.0.0.1"), ip("198.51.100.7")];
    let mut rules = vec![
        // Servers and toolwall's own listeners on this host, however written.
        Rule::exact(ip("127.0.0.1"), 3001, 0, RuleAction::Flag),
        Rule::exact(ip("198.51.100.7"), 3002, 1, RuleAction::Deny),
        Rule::exact(ip("::1"), 8787, 2, RuleAction::Pass),
        Rule {
            addr: ip("0.0.0.0"),
            prefix: 0,
            port: 18081,
            server_index: 3,
            action: RuleAction::Deny,
        },
        // Elsewhere: a remote server, a provider pin, DNS to anywhere but the resolvers' port.
        Rule::exact(ip("93.184.216.34"), 443, 4, RuleAction::Deny),
        Rule::exact(ip("10.0.0.9"), 8080, 5, RuleAction::Flag),
    ];
    rules.extend(refusals(BoundaryMode::Allowlist, &[]));
    let ports = reserved_ports(&rules, &locals);
    assert_eq!(
        ports.into_iter().collect::<Vec<_>>(),
        vec![(3001, 0), (3002, 1), (8787, 2), (18081, 3)]
    );
}
