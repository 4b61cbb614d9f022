//! Keys and values of the endpoint rule maps.
//!
//! Both `connect4` and `connect6` look addresses up in one key space: IPv4 addresses are stored
//! in their IPv4-mapped IPv6 form (`::ffff:a.b.c.d`), so one rule covers an address whatever
//! socket family a process uses to reach it.

/// Let the connection through and emit an event.
pub const ACTION_FLAG: u8 = 1;
/// Refuse the connection with EPERM and emit an event.
pub const ACTION_DENY: u8 = 2;
/// Let the connection through unrecorded: an exception carved out of a wider rule (an allowed
/// DNS resolver inside `netmon.dns.other_resolvers`). Never laid over a DENY
/// (agent/src/netmon/rules.rs).
pub const ACTION_PASS: u8 = 3;

/// Key of the exact-match `ENDPOINTS` hash map.
///
/// `port` is in host byte order; a rule with port 0 matches any port (the programs look up the
/// exact port first, then port 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EndpointKey {
    /// IPv6 address, or IPv4-mapped IPv6 for IPv4, network byte order.
    pub addr: [u8; 16],
    /// Destination port in host byte order, 0 = any.
    pub port: u16,
    /// Explicit padding so both sides hash the same bytes.
    pub _pad: [u8; 2],
}

/// Data of a `CIDR_RULES` LPM-trie key (the trie adds the prefix length in front).
///
/// The port comes first and is always matched in full (a rule's prefix length is
/// `16 + address prefix`), so several servers in one range on different ports each keep their
/// own rule; port 0 is "any port", found by a second lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CidrKey {
    /// Destination port, network byte order (0 = any).
    pub port: [u8; 2],
    /// IPv6 or IPv4-mapped address, network byte order.
    pub addr: [u8; 16],
}

/// Bits of [`CidrKey`] before the address: a trie prefix length is this plus the address prefix.
pub const CIDR_PORT_BITS: u32 = 16;

/// Value of both rule maps: what to do and for which registered server.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointRule {
    /// Index of the server in the daemon's server table (stable for the daemon's life).
    pub server_index: u32,
    /// [`ACTION_FLAG`], [`ACTION_DENY`] or [`ACTION_PASS`].
    pub action: u8,
    /// Explicit padding.
    pub _pad: [u8; 3],
}

/// Map name of the exact-match rule map.
pub const ENDPOINTS_MAP: &str = "ENDPOINTS";
/// Map name of the CIDR rule LPM trie.
pub const CIDR_MAP: &str = "CIDR_RULES";
/// Capacity of each rule map.
pub const MAX_RULES: u32 = 4096;

const _: () = assert!(core::mem::size_of::<EndpointKey>() == 20);
const _: () = assert!(core::mem::align_of::<EndpointKey>() == 2);
const _: () = assert!(core::mem::size_of::<CidrKey>() == 18);
const _: () = assert!(core::mem::size_of::<EndpointRule>() == 8);
const _: () = assert!(core::mem::align_of::<EndpointRule>() == 4);

/// Data of an `EGRESS_ALLOW` LPM-trie key: one destination a daemon-run stdio server's cgroup
/// may reach (its declaration's `egress:`). The cgroup and port are always matched in full
/// (prefix length `EGRESS_FIXED_BITS + address prefix`); port 0 is "any port", found by a
/// second lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EgressKey {
    /// The cgroup id, big-endian (the trie matches bytes from the front).
    pub cgroup: [u8; 8],
    /// Destination port, network byte order (0 = any).
    pub port: [u8; 2],
    /// IPv6 or IPv4-mapped address, network byte order.
    pub addr: [u8; 16],
}

/// Bits of [`EgressKey`] before the address.
pub const EGRESS_FIXED_BITS: u32 = 64 + 16;

/// `server_index` of an event for a connection refused because the server's declaration does
/// not allow it (the server is the cgroup's, not a rule's).
pub const EGRESS_INDEX: u32 = u32::MAX;

/// Map name of the cgroups whose egress is limited (cgroup id → 1).
pub const EGRESS_SCOPE_MAP: &str = "EGRESS_SCOPE";
/// Map name of what those cgroups may reach.
pub const EGRESS_ALLOW_MAP: &str = "EGRESS_ALLOW";
/// Capacity of the scope map: cgroups with limited egress at once.
pub const MAX_EGRESS_SCOPES: u32 = 1024;
/// Deepest cgroup level searched for a limited ancestor (a process may make cgroups below
/// its own; they stay limited).
pub const MAX_EGRESS_LEVEL: i32 = 16;

const _: () = assert!(core::mem::size_of::<EgressKey>() == 26);
const _: () = assert!(core::mem::align_of::<EgressKey>() == 1);
