//! Per-key summaries of matched connections, so a flood cannot push the events that matter out
//! of the ring: each (session cgroup, server, verdict, hook, protocol) may send
//! [`BURST`] events per CPU per [`WINDOW_NS`] through the ring; what is over that, or does not
//! fit the ring, is counted in its key's `SUMMARY` entry instead (count, first and last time,
//! the last connection's details), and the daemon turns each new count into one event.

/// Events one key may send through the ring per CPU per window; the rest are summarised.
pub const BURST: u64 = 64;
/// The window of [`BURST`], nanoseconds of `bpf_ktime_get_ns`.
pub const WINDOW_NS: u64 = 1_000_000_000;

/// Key of the per-CPU `SUMMARY` hash map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SummaryKey {
    /// cgroup v2 id of the connecting task (the session's cgroup).
    pub cgroup_id: u64,
    /// Index of the matched server in the daemon's server table.
    pub server_index: u32,
    /// `VERDICT_FLAGGED` or `VERDICT_DENIED` (agent-common/src/connect.rs).
    pub verdict: u8,
    /// `HOOK_CONNECT` or `HOOK_SENDMSG`.
    pub hook: u8,
    /// IP protocol: 6 TCP, 17 UDP.
    pub protocol: u8,
    /// Explicit padding so both sides hash the same bytes.
    pub _pad: u8,
}

/// One CPU's share of a key's summary. Only the programs write it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SummaryValue {
    /// Start of this CPU's current [`BURST`] window.
    pub window_start_ns: u64,
    /// Events of the key in that window on this CPU.
    pub in_window: u64,
    /// Connections summarised on this CPU since the entry was made (never reset).
    pub summarised: u64,
    /// When this CPU first summarised one (`bpf_ktime_get_ns`).
    pub first_ns: u64,
    /// When it last did.
    pub last_ns: u64,
    /// The last summarised connection's destination (IPv6 or IPv4-mapped, network order).
    pub addr: [u8; 16],
    /// Its port, host byte order.
    pub port: u16,
    /// Its socket family (`FAMILY_INET` or `FAMILY_INET6`).
    pub family: u16,
    /// Its process id.
    pub pid: u32,
    /// Its real uid.
    pub uid: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// Its task `comm`.
    pub comm: [u8; crate::connect::COMM_LEN],
}

/// What the daemon has turned into events of a key (summed over CPUs), kept in the pinned
/// `SUMMARY_SEEN` map so a daemon that adopts the maps does not report a count twice. Only
/// user space writes it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SummarySeen {
    /// Summarised connections already reported.
    pub reported: u64,
    /// The latest `last_ns` reported.
    pub last_ns: u64,
}

/// Map name of the per-CPU summary hash map.
pub const SUMMARY_MAP: &str = "SUMMARY";
/// Map name of the reported-counts hash map.
pub const SUMMARY_SEEN_MAP: &str = "SUMMARY_SEEN";
/// Capacity of both maps: keys beyond it fall back to the ring (and its drop counter).
pub const MAX_SUMMARIES: u32 = 8192;

const _: () = assert!(core::mem::size_of::<SummaryKey>() == 16);
const _: () = assert!(core::mem::align_of::<SummaryKey>() == 8);
const _: () = assert!(core::mem::size_of::<SummaryValue>() == 88);
const _: () = assert!(core::mem::align_of::<SummaryValue>() == 8);
const _: () = assert!(core::mem::size_of::<SummarySeen>() == 16);
