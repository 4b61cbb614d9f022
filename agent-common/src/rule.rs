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

/// `server_index` of the rules that refuse a session the host itself: its loopback, unspecified
/// and interface addresses, on every port no other rule names. A socket the session made itself
/// stays reachable ([`session_tag`]).
pub const HOST_LOCAL_INDEX: u32 = u32::MAX - 1;
/// `server_index` of the rules that refuse a session the networks around the host: private,
/// unique-local and link-local ranges, broadcast and multicast.
pub const LOCAL_NET_INDEX: u32 = u32::MAX - 2;
/// `server_index` of the rule that refuses a session every destination not listed
/// (`netmon.egress.mode: allowlist`).
pub const UNLISTED_INDEX: u32 = u32::MAX - 3;

/// `server_index` of a session's refused Unix socket connects and datagrams: to a name not
/// listed ([`crate::unix`]).
pub const UNIX_INDEX: u32 = u32::MAX - 4;

/// Whether a `server_index` is one of the session boundary's own rules (not a server's); its
/// PASS exceptions carve out of all of them alike.
pub const fn is_boundary(server_index: u32) -> bool {
    server_index >= UNIX_INDEX && server_index < EGRESS_INDEX
}

/// Key of `RESERVED_PORTS`: a port no session may bind (toolwall's own listeners', a declared
/// server's on this host), on any address and protocol. Host byte order.
pub type ReservedPort = u16;

/// Map name of the ports sessions may not bind (port → the `server_index` it belongs to).
pub const RESERVED_PORTS_MAP: &str = "RESERVED_PORTS";
/// Capacity of [`RESERVED_PORTS_MAP`].
pub const MAX_RESERVED_PORTS: u32 = 1024;

/// The mark `sock_create` gives every socket a session makes, as its priority: the own-port
/// exception lets a session reach a socket of the host only when that socket carries the
/// session's tag. Only CAP_NET_ADMIN sets a priority above 6, and no agent has it; the low four
/// bits are 0 (best effort for every queueing discipline), the upper sixteen a fixed pattern no
/// queueing discipline handle is likely to share. Sessions share a tag one time in 4096.
pub const fn session_tag(cgroup_id: u64) -> u32 {
    let mixed = (cgroup_id as u32).wrapping_mul(0x9E37_79B1) >> 20;
    0x7E77_0000 | (mixed << 4)
}
