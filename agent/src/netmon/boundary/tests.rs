//! The boundary as the kernel's lookup sees it: laid out with a server table, asked what it
//! does with each kind of destination.

use std::net::IpAddr;

use agent_common::rule::{
    ACTION_DENY, ACTION_FLAG, ACTION_PASS, HOST_LOCAL_INDEX, LOCAL_NET_INDEX, UNLISTED_INDEX,
};

use super::{BoundaryMode, merged_reserved, refusals, reserved_ports};
use crate::netmon::{
    routes::LocalTable,
    rules::{MapContents, Rule, RuleAction},
};

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
    // As the kernel's local table lists them: loopback's /8 has a "broadcast" too, and a
    // prefix routed to the host is the host.
    let table = LocalTable {
        local: vec![
            (ip("127.0.0.0"), 8),
            (ip("198.18.77.0"), 24),
            (ip("2001:db8:77::"), 64),
        ],
        broadcast: ["198.51.100.255", "127.255.255.255", "203.0.113.77"]
            .map(ip)
            .to_vec(),
    };
    rules.extend(refusals(mode, &table));
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
        ("203.0.113.77", 9999, net),
        ("198.18.77.5", 80, host),
        ("::ffff:198.18.77.5", 80, host),
        ("2001:db8:77::5", 80, host),
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
        // Let through at the address they were declared at, in both its forms ...
        for addr in ["127.0.0.1", "::ffff:127.0.0.1"] {
            assert_eq!(outcome(&map, addr, 3001), Some((0, ACTION_FLAG)), "{addr}");
            assert_eq!(outcome(&map, addr, 8787), Some((2, ACTION_PASS)), "{addr}");
        }
        // ... not at the host's other addresses, where another service may hold the port.
        for addr in ["::1", "198.51.100.7", "0.0.0.0", "127.0.0.2"] {
            assert_eq!(
                outcome(&map, addr, 3001),
                Some((HOST_LOCAL_INDEX, ACTION_DENY)),
                "{addr}"
            );
            assert_eq!(
                outcome(&map, addr, 8787),
                Some((HOST_LOCAL_INDEX, ACTION_DENY)),
                "{addr}"
            );
        }
        // A denied server is denied on every local address.
        for addr in ["127.0.0.1", "::1", "198.51.100.7", "0.0.0.0", "127.0.0.2"] {
            assert_eq!(outcome(&map, addr, 3002), Some((1, ACTION_DENY)), "{addr}");
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
    let mut rules = refusals(BoundaryMode::LocalDeny, &LocalTable::default());
    // `netmon.egress.allow: ["127.0.0.1"]`: the whole host, every port.
    rules.push(Rule::exact(ip("127.0.0.1"), 0, 7, RuleAction::Pass));
    rules.push(Rule::exact(ip("127.0.0.1"), 3002, 1, RuleAction::Deny));
    let map = MapContents::from_rules(&rules, &locals);
    assert_eq!(outcome(&map, "127.0.0.1", 22), Some((7, ACTION_PASS)));
    assert_eq!(
        outcome(&map, "::1", 22),
        Some((HOST_LOCAL_INDEX, ACTION_DENY)),
        "an allow entry opens the address it names"
    );
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
    let table = LocalTable {
        local: vec![(ip("198.18.77.0"), 24)],
        broadcast: vec![ip("10.0.0.255")],
    };
    assert!(refusals(BoundaryMode::Off, &table).is_empty());
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
    // Allow entries (listeners: a session may not take their ports), one of them a loopback
    // range without 127.0.0.1 in it, one a range off this host.
    let range = |addr: &str, prefix: u8, port: u16, index: u32| Rule {
        addr: ip(addr),
        prefix,
        port,
        server_index: index,
        action: RuleAction::Pass,
    };
    rules.push(Rule::exact(ip("127.0.0.1"), 5432, 6, RuleAction::Pass));
    rules.push(range("127.0.0.8", 29, 28091, 6));
    rules.push(range("::ffff:127.0.0.8", 125, 28092, 6));
    rules.push(range("10.0.0.0", 8, 28093, 6));
    rules.push(range("198.51.100.0", 24, 28094, 6));
    // A resolver on this host: a destination, not a listener.
    rules.push(Rule::exact(ip("127.0.0.53"), 53, 7, RuleAction::Pass));
    rules.extend(refusals(BoundaryMode::Allowlist, &LocalTable::default()));
    let ports = reserved_ports(&rules, &locals, |index| index < 7);
    assert_eq!(
        ports.into_iter().collect::<Vec<_>>(),
        vec![
            (3001, 0),
            (3002, 1),
            (5432, 6),
            (8787, 2),
            (18081, 3),
            (28091, 6),
            (28092, 6),
            (28094, 6)
        ]
    );
}

#[test]
fn a_wide_rule_on_one_port_does_not_open_the_host_or_the_networks_on_that_port() {
    let locals = [ip("127.0.0.1"), ip("198.51.100.7")];
    for mode in [BoundaryMode::LocalDeny, BoundaryMode::Allowlist] {
        let mut rules = refusals(mode, &LocalTable::default());
        // `netmon.dns.other_resolvers: flag`: DNS to anywhere is recorded; the resolver is
        // let through.
        rules.push(Rule {
            addr: ip("::"),
            prefix: 0,
            port: 53,
            server_index: 0,
            action: RuleAction::Flag,
        });
        rules.push(Rule::exact(ip("127.0.0.53"), 53, 1, RuleAction::Pass));
        // `netmon.egress.allow: ["0.0.0.0/0:443"]`.
        rules.push(Rule {
            addr: ip("0.0.0.0"),
            prefix: 0,
            port: 443,
            server_index: 2,
            action: RuleAction::Pass,
        });
        let map = MapContents::from_rules(&rules, &locals);
        let host = Some((HOST_LOCAL_INDEX, ACTION_DENY));
        let net = Some((LOCAL_NET_INDEX, ACTION_DENY));
        for (addr, port, want) in [
            ("127.0.0.53", 53, Some((1, ACTION_PASS))),
            ("127.0.0.2", 53, host),
            ("::ffff:127.0.0.2", 53, host),
            ("10.77.0.2", 53, net),
            ("224.0.0.251", 53, net),
            ("9.9.9.9", 53, Some((0, ACTION_FLAG))),
            ("127.0.0.2", 443, host),
            ("127.200.1.1", 443, host),
            ("10.0.0.1", 443, net),
            ("93.184.216.34", 443, Some((2, ACTION_PASS))),
        ] {
            assert_eq!(outcome(&map, addr, port), want, "{mode:?} {addr}:{port}");
        }
    }
}

#[test]
fn reserved_ports_join_the_hosts_own_and_leave_them_as_they_were() {
    let none = std::collections::BTreeSet::new();
    let (text, added) =
        merged_reserved("8080,9000-9002\n", [18080, 18081, 3001].into_iter(), &none);
    assert_eq!(text, "3001,8080,9000-9002,18080-18081");
    assert_eq!(
        added.into_iter().collect::<Vec<_>>(),
        vec![3001, 18080, 18081]
    );
    // The server at 3001 is no longer declared: its port is given back, the host's kept; a
    // port the host listed itself is never taken back.
    let had: std::collections::BTreeSet<u16> = [3001, 18080, 18081].into_iter().collect();
    let (text, added) = merged_reserved(&text, [18080, 18081, 8080].into_iter(), &had);
    assert_eq!(text, "8080,9000-9002,18080-18081");
    assert_eq!(added.into_iter().collect::<Vec<_>>(), vec![18080, 18081]);
    let (text, _) = merged_reserved("", std::iter::empty(), &none);
    assert_eq!(text, "");
}
