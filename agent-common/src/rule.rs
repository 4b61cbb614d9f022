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
/// and interface addresses, on every port no other rule names. A port the session itself bound
/// (in `SESSION_PORTS`) stays reachable.
pub const HOST_LOCAL_INDEX: u32 = u32::MAX - 1;
/// `server_index` of the rules that refuse a session the networks around the host: private,
/// unique-local and link-local ranges, broadcast and multicast.
pub const LOCAL_NET_INDEX: u32 = u32::MAX - 2;
/// `server_index` of the rule that refuses a session every destination not listed
/// (`netmon.egress.mode: allowlist`).
pub const UNLISTED_INDEX: u32 = u32::MAX - 3;

/// Whether a `server_index` is one of the session boundary's own rules (not a server's); its
/// PASS exceptions carve out of all of them alike.
pub const fn is_boundary(server_index: u32) -> bool {
    server_index >= UNLISTED_INDEX && server_index < EGRESS_INDEX
}

/// Key of `RESERVED_PORTS`: a port no session may bind (toolwall's own listeners', a declared
/// server's on this host), on any address and protocol. Host byte order.
pub type ReservedPort = u16;

/// Map name of the ports sessions may not bind (port → the `server_index` it belongs to).
pub const RESERVED_PORTS_MAP: &str = "RESERVED_PORTS";
/// Capacity of [`RESERVED_PORTS_MAP`].
pub const MAX_RESERVED_PORTS: u32 = 1024;

/// Key of `SESSION_PORTS`: a port a session's socket bound, so the session may still reach
/// it on the host's own addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionPort {
    /// The binding task's cgroup id (the session's, or one below it).
    pub cgroup_id: u64,
    /// The bound port, host byte order.
    pub port: u16,
    /// Explicit padding so both sides hash the same bytes.
    pub _pad: [u8; 6],
}

/// Map name of the ports sessions hold (key → the socket cookie holding it).
pub const SESSION_PORTS_MAP: &str = "SESSION_PORTS";
/// Map name of the reverse index (socket cookie → key), read when a socket is released.
pub const PORT_HOLDERS_MAP: &str = "PORT_HOLDERS";
/// Capacity of both: ports held by sessions at once.
pub const MAX_SESSION_PORTS: u32 = 8192;

const _: () = assert!(core::mem::size_of::<SessionPort>() == 16);
