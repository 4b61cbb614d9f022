//! Indices into the per-CPU `COUNTERS` array map.
//!
//! The kernel side bumps one slot per outcome; user space sums the per-CPU values. Counters are
//! how "no event" outcomes stay observable (a connect that matched nothing) and how ring-buffer
//! overflow is reported instead of being lost silently.

/// Every `connect()` the programs saw (IPv4 and IPv6 together).
pub const CONNECTS: u32 = 0;
/// Connects and datagrams that matched no rule: allowed, no event.
pub const UNMATCHED: u32 = 1;
/// Connects that matched a FLAG rule.
pub const FLAGGED: u32 = 2;
/// Connects that matched a DENY rule (refused with EPERM).
pub const DENIED: u32 = 3;
/// Events that did not fit into the ring buffer.
pub const RING_DROPS: u32 = 4;
/// Every datagram sent with an address (`sendto`/`sendmsg`) the programs saw.
pub const SENDMSGS: u32 = 5;
/// Matched connections counted in a `SUMMARY` entry instead of sent as events (a key over its
/// burst, or a full ring): reported by the daemon as summary events, not lost.
pub const SUMMARISED: u32 = 6;
/// Packets of an egress-limited cgroup (a daemon-run stdio server's) dropped by
/// `cgroup_skb`: to or from a destination its declaration does not allow, sent on sockets the
/// connect programs never see (ICMP, raw) or received from a peer it was never allowed.
pub const EGRESS_DROPS: u32 = 7;
/// Every `bind()` of a session that got its port (`post_bind4`/`post_bind6`).
pub const BINDS: u32 = 8;
/// Connects and datagrams to one of the host's own addresses let through because the socket
/// that takes them is the session's own (an agent's own dev server).
pub const OWN_PORT: u32 = 9;
/// Every Unix socket `connect()` and datagram sent to an address of a session
/// (`connect_unix`, `sendmsg_unix`).
pub const UNIX_CONNECTS: u32 = 10;
/// Number of slots in the `COUNTERS` map.
pub const COUNT: u32 = 11;

/// Map name of the per-CPU counter array.
pub const MAP_NAME: &str = "COUNTERS";
