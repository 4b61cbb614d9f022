//! toolwall's kernel side: the programs on an agent's session cgroup.
//!
//! Every `connect()` (TCP or UDP) and every datagram sent with an address (`sendto`/`sendmsg` on
//! an unconnected UDP socket, which never passes `connect()`) from a task in the cgroup is looked
//! up in the rule maps, which the daemon keeps in sync with the MCP server registry and the
//! session boundary (`agent/src/netmon/boundary.rs`). A DENY rule makes the call fail with
//! EPERM; a FLAG rule lets it through; both send a [`ConnectEvent`] to user space. A destination
//! that matches nothing only bumps a per-CPU counter. IPv4 destinations are looked up in their
//! IPv4-mapped IPv6 form, so a rule covers an address whichever socket family reaches it.
//!
//! Every `bind()` that got its port (`post_bind4`/`post_bind6`, so a port the kernel picked is
//! seen too) is refused when the port is one of toolwall's own listeners or a declared server's
//! on this host (`RESERVED_PORTS`): a session cannot squat them while their owner restarts.
//! Every socket a session makes is marked as its own (`sock_create` sets its priority to the
//! session's tag, a value only CAP_NET_ADMIN could set), so a TCP connect to the host is let
//! through when the listener that would take it — looked up by address and port at that moment —
//! is one of the session's: the agent reaches its own dev server and nothing else of the host.
//!
//! Every Unix socket `connect()` and every datagram sent to a Unix socket address
//! (`cgroup/connect_unix`, `cgroup/sendmsg_unix`: `unix.rs`) is decided by the name it goes to,
//! pathname and abstract alike: a name the daemon listed (`UNIX_LISTED`: its API socket,
//! `exec.allow_unix`) is reached, any other — the user's tmux server, a forwarder, a bus — is
//! refused with EPERM and recorded.
//!
//! Every map is pinned by name (the daemon loads with a pin directory on bpffs), so the programs
//! and their rules outlive a daemon that dies, and the next daemon reads the same maps
//! (`agent/src/netmon/pins.rs`).
#![no_std]
#![no_main]

mod egress;
mod unix;

use agent_common::{
    connect::{
        ConnectEvent, COMM_LEN, FAMILY_INET, FAMILY_INET6, HOOK_BIND, HOOK_CONNECT, HOOK_SENDMSG,
        RING_BYTES, VERDICT_DENIED, VERDICT_FLAGGED,
    },
    counters,
    rule::{
        is_boundary, session_tag, CidrKey, EndpointKey, EndpointRule, ReservedPort, ACTION_DENY,
        ACTION_PASS, CIDR_PORT_BITS, EGRESS_INDEX, HOST_LOCAL_INDEX, MAX_RESERVED_PORTS, MAX_RULES,
    },
    summary::{SummaryKey, SummaryValue, BURST, MAX_SUMMARIES, WINDOW_NS},
};
use aya_ebpf::{
    bindings::bpf_sock_tuple,
    helpers::{
        bpf_get_current_ancestor_cgroup_id, bpf_get_current_cgroup_id, bpf_get_current_comm,
        bpf_get_current_pid_tgid, bpf_get_current_uid_gid, bpf_get_socket_cookie, bpf_ktime_get_ns,
        bpf_sk_lookup_tcp, bpf_sk_release,
    },
    macros::{cgroup_sock, cgroup_sock_addr, map},
    maps::{lpm_trie::Key, HashMap, LpmTrie, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{SockAddrContext, SockContext},
};
use aya_log_ebpf::debug;
use egress::{egress_allowed, limited_scope};

/// `connect()` proceeds.
const ALLOW: i32 = 1;
/// `connect()` fails with EPERM.
const REFUSE: i32 = 0;

#[map(name = "ENDPOINTS")]
static ENDPOINTS: HashMap<EndpointKey, EndpointRule> = HashMap::pinned(MAX_RULES, 0);

// BPF_F_NO_PREALLOC (1) is mandatory for LPM tries.
#[map(name = "CIDR_RULES")]
static CIDR_RULES: LpmTrie<CidrKey, EndpointRule> = LpmTrie::pinned(MAX_RULES, 1);

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::pinned(counters::COUNT, 0);

#[map(name = "EVENTS")]
static EVENTS: RingBuf = RingBuf::pinned(RING_BYTES, 0);

#[map(name = "SUMMARY")]
static SUMMARY: PerCpuHashMap<SummaryKey, SummaryValue> = PerCpuHashMap::pinned(MAX_SUMMARIES, 0);

/// Written by user space only (what it reported of `SUMMARY`); declared here so it is created
/// and pinned with the others.
#[map(name = "SUMMARY_SEEN")]
static SUMMARY_SEEN: HashMap<SummaryKey, agent_common::summary::SummarySeen> =
    HashMap::pinned(MAX_SUMMARIES, 0);

/// Ports no session may bind, on any address (port → the `server_index` they belong to).
#[map(name = "RESERVED_PORTS")]
static RESERVED_PORTS: HashMap<ReservedPort, u32> = HashMap::pinned(MAX_RESERVED_PORTS, 0);

#[cgroup_sock_addr(connect4)]
pub fn connect4(ctx: SockAddrContext) -> i32 {
    verdict(&ctx, ipv4_dest(&ctx), FAMILY_INET, HOOK_CONNECT)
}

#[cgroup_sock_addr(connect6)]
pub fn connect6(ctx: SockAddrContext) -> i32 {
    verdict(&ctx, ipv6_dest(&ctx), FAMILY_INET6, HOOK_CONNECT)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn sendmsg4(ctx: SockAddrContext) -> i32 {
    verdict(&ctx, ipv4_dest(&ctx), FAMILY_INET, HOOK_SENDMSG)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn sendmsg6(ctx: SockAddrContext) -> i32 {
    verdict(&ctx, ipv6_dest(&ctx), FAMILY_INET6, HOOK_SENDMSG)
}

#[cgroup_sock(post_bind4)]
pub fn post_bind4(ctx: SockContext) -> i32 {
    // SAFETY: src_ip4 is a 4-byte field of the bpf_sock the kernel hands post_bind4.
    let ip4 = unsafe { core::ptr::read_volatile(&(*ctx.sock).src_ip4) };
    bound(&ctx, mapped(ip4), FAMILY_INET)
}

#[cgroup_sock(post_bind6)]
pub fn post_bind6(ctx: SockContext) -> i32 {
    let mut addr = [0u8; 16];
    // SAFETY: src_ip6 is four 4-byte fields, read one word at a time as for user_ip6.
    unsafe {
        let sk = ctx.sock;
        addr[0..4].copy_from_slice(&core::ptr::read_volatile(&(*sk).src_ip6[0]).to_ne_bytes());
        addr[4..8].copy_from_slice(&core::ptr::read_volatile(&(*sk).src_ip6[1]).to_ne_bytes());
        addr[8..12].copy_from_slice(&core::ptr::read_volatile(&(*sk).src_ip6[2]).to_ne_bytes());
        addr[12..16].copy_from_slice(&core::ptr::read_volatile(&(*sk).src_ip6[3]).to_ne_bytes());
    }
    bound(&ctx, addr, FAMILY_INET6)
}

/// A port is bound: refused when it is reserved.
#[inline(always)]
fn bound(ctx: &SockContext, addr: [u8; 16], family: u16) -> i32 {
    bump(counters::BINDS);
    let sk = ctx.sock;
    // SAFETY: src_port (host byte order) and protocol are 4-byte fields of the bpf_sock.
    let (port, protocol) = unsafe {
        (
            core::ptr::read_volatile(&(*sk).src_port) as u16,
            core::ptr::read_volatile(&(*sk).protocol) as u8,
        )
    };
    // SAFETY: map values are plain Copy data, copied out at once.
    if let Some(&server_index) = unsafe { RESERVED_PORTS.get(&port) } {
        bump(counters::DENIED);
        let rule = EndpointRule {
            server_index,
            action: ACTION_DENY,
            _pad: [0; 3],
        };
        record(
            sk.cast(),
            protocol,
            &rule,
            addr,
            port,
            family,
            HOOK_BIND,
            true,
        );
        return REFUSE;
    }
    ALLOW
}

/// Marks every socket a session makes as the session's: its priority becomes the session's
/// tag (an unprivileged process may set only 0 to 6; the tag's low bits are 0, so queueing
/// disciplines treat it as best effort).
#[cgroup_sock(sock_create)]
pub fn sock_create(ctx: SockContext) -> i32 {
    // SAFETY: valid in cgroup_sock programs; priority is writable at sock_create.
    unsafe {
        let tag = session_tag(bpf_get_current_cgroup_id());
        core::ptr::write_volatile(&mut (*ctx.sock).priority, tag);
    }
    ALLOW
}

/// An IPv4 address (network byte order, as the kernel stores it) in its IPv4-mapped form.
#[inline(always)]
fn mapped(ip4: u32) -> [u8; 16] {
    let mut addr = [0u8; 16];
    addr[10] = 0xff;
    addr[11] = 0xff;
    addr[12..16].copy_from_slice(&ip4.to_ne_bytes());
    addr
}

/// The IPv4 destination in its IPv4-mapped form.
#[inline(always)]
fn ipv4_dest(ctx: &SockAddrContext) -> [u8; 16] {
    // SAFETY: the kernel hands these programs a valid bpf_sock_addr; user_ip4 is a 4-byte field.
    let ip4 = unsafe { core::ptr::read_volatile(&(*ctx.sock_addr).user_ip4) };
    mapped(ip4)
}

#[inline(always)]
fn ipv6_dest(ctx: &SockAddrContext) -> [u8; 16] {
    let mut addr = [0u8; 16];
    // SAFETY: user_ip6 is four 4-byte ctx fields; the verifier only allows word-sized loads, so
    // each word is read on its own (volatile keeps the compiler from merging them).
    unsafe {
        let sa = ctx.sock_addr;
        addr[0..4].copy_from_slice(&core::ptr::read_volatile(&(*sa).user_ip6[0]).to_ne_bytes());
        addr[4..8].copy_from_slice(&core::ptr::read_volatile(&(*sa).user_ip6[1]).to_ne_bytes());
        addr[8..12].copy_from_slice(&core::ptr::read_volatile(&(*sa).user_ip6[2]).to_ne_bytes());
        addr[12..16].copy_from_slice(&core::ptr::read_volatile(&(*sa).user_ip6[3]).to_ne_bytes());
    }
    addr
}

/// Looks the destination up and decides; shared by all four programs so they cannot drift apart.
#[inline(always)]
fn verdict(ctx: &SockAddrContext, addr: [u8; 16], family: u16, hook: u8) -> i32 {
    bump(if hook == HOOK_CONNECT {
        counters::CONNECTS
    } else {
        counters::SENDMSGS
    });
    // SAFETY: user_port is a 4-byte ctx field holding the port in network order.
    let raw_port = unsafe { core::ptr::read_volatile(&(*ctx.sock_addr).user_port) };
    let port = u16::from_be(raw_port as u16);

    // A limited cgroup, or one a process made below it.
    let scope = limited_scope(|level| {
        // SAFETY: valid in cgroup_sock_addr programs.
        unsafe { bpf_get_current_ancestor_cgroup_id(level) }
    });
    if scope != 0 && !egress_allowed(scope, addr, port) {
        bump(counters::DENIED);
        let rule = EndpointRule {
            server_index: EGRESS_INDEX,
            action: ACTION_DENY,
            _pad: [0; 3],
        };
        record(
            sock_addr(ctx),
            protocol(ctx),
            &rule,
            addr,
            port,
            family,
            hook,
            true,
        );
        return REFUSE;
    }

    let Some(rule) = lookup(addr, port) else {
        bump(counters::UNMATCHED);
        return ALLOW;
    };
    // A daemon-run server's own `egress:` list, checked above, is its boundary.
    if rule.action == ACTION_PASS || (scope != 0 && is_boundary(rule.server_index)) {
        bump(counters::UNMATCHED);
        return ALLOW;
    }
    // TCP only: a connected UDP socket is checked once, at connect(), and its later datagrams
    // go to whatever holds the port then; a UDP port is shared under SO_REUSEADDR.
    if rule.server_index == HOST_LOCAL_INDEX && protocol(ctx) == 6 && own_port(ctx, addr, port) {
        bump(counters::OWN_PORT);
        return ALLOW;
    }
    let deny = rule.action == ACTION_DENY;
    bump(if deny {
        counters::DENIED
    } else {
        counters::FLAGGED
    });
    record(
        sock_addr(ctx),
        protocol(ctx),
        &rule,
        addr,
        port,
        family,
        hook,
        deny,
    );
    if deny {
        debug!(ctx, "toolwall: port {} denied (hook {})", port, hook);
    }
    // A verdict carried through a stack slot across helper calls loses its [0, 1] range for the
    // verifier (a black-boxed bool even becomes `r0 ^= 1`); comparing an opaque integer forces
    // a real branch to the two constants.
    let verdict: u32 = if deny { 2 } else { 1 };
    if core::hint::black_box(verdict) == 2 {
        REFUSE
    } else {
        ALLOW
    }
}

/// Whether the listener that would take this TCP connect now (looked up by address and port)
/// was made by the caller's session ([`sock_create`]).
#[inline(always)]
fn own_port(ctx: &SockAddrContext, addr: [u8; 16], port: u16) -> bool {
    // SAFETY: valid in cgroup_sock_addr programs.
    let tag = session_tag(unsafe { bpf_get_current_cgroup_id() });
    // SAFETY: an all-zero tuple is valid; the fields set below are plain integers.
    let mut tuple: bpf_sock_tuple = unsafe { core::mem::zeroed() };
    let v4 = addr[..10].iter().all(|&b| b == 0) && addr[10] == 0xff && addr[11] == 0xff;
    let size = if v4 {
        tuple.__bindgen_anon_1.ipv4.daddr =
            u32::from_ne_bytes([addr[12], addr[13], addr[14], addr[15]]);
        tuple.__bindgen_anon_1.ipv4.dport = port.to_be();
        12
    } else {
        let word = |i: usize| u32::from_ne_bytes([addr[i], addr[i + 1], addr[i + 2], addr[i + 3]]);
        tuple.__bindgen_anon_1.ipv6.daddr = [word(0), word(4), word(8), word(12)];
        tuple.__bindgen_anon_1.ipv6.dport = port.to_be();
        36
    };
    // BPF_F_CURRENT_NETNS: the caller's network namespace.
    let netns = u64::MAX;
    // SAFETY: the helpers get the program's context and a tuple of the size given; a socket
    // they return is released on the one path that follows.
    unsafe {
        let sk = bpf_sk_lookup_tcp(sock_addr(ctx), &mut tuple, size, netns, 0);
        if sk.is_null() {
            return false;
        }
        let priority = core::ptr::read_volatile(&(*sk).priority);
        bpf_sk_release(sk.cast());
        priority == tag
    }
}

/// A sock_addr program's context, as the socket helpers take it.
#[inline(always)]
fn sock_addr(ctx: &SockAddrContext) -> *mut core::ffi::c_void {
    ctx.sock_addr.cast()
}

/// The socket's IP protocol (6 TCP, 17 UDP).
#[inline(always)]
fn protocol(ctx: &SockAddrContext) -> u8 {
    // SAFETY: protocol is a 4-byte field of the bpf_sock_addr.
    unsafe { core::ptr::read_volatile(&(*ctx.sock_addr).protocol) as u8 }
}

/// Exact (address, port), then (address, any port), then the longest CIDR prefix.
#[inline(always)]
fn lookup(addr: [u8; 16], port: u16) -> Option<EndpointRule> {
    let mut key = EndpointKey {
        addr,
        port,
        _pad: [0; 2],
    };
    // SAFETY: map values are plain Copy data; the reference does not outlive this call.
    if let Some(rule) = unsafe { ENDPOINTS.get(&key) } {
        return Some(*rule);
    }
    key.port = 0;
    if let Some(rule) = unsafe { ENDPOINTS.get(&key) } {
        return Some(*rule);
    }
    let full = CIDR_PORT_BITS + 128;
    if let Some(rule) = CIDR_RULES.get(&Key::new(
        full,
        CidrKey {
            port: port.to_be_bytes(),
            addr,
        },
    )) {
        return Some(*rule);
    }
    CIDR_RULES
        .get(&Key::new(full, CidrKey { port: [0; 2], addr }))
        .copied()
}

/// Sends a connect, sendmsg or bind event (see [`summarised`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn record(
    ctx: *mut core::ffi::c_void,
    protocol: u8,
    rule: &EndpointRule,
    addr: [u8; 16],
    port: u16,
    family: u16,
    hook: u8,
    deny: bool,
) {
    // SAFETY: both helpers are valid in cgroup_sock_addr and cgroup_sock programs.
    let (now, cgroup_id) = unsafe { (bpf_ktime_get_ns(), bpf_get_current_cgroup_id()) };
    let verdict = if deny {
        VERDICT_DENIED
    } else {
        VERDICT_FLAGGED
    };
    let key = SummaryKey {
        cgroup_id,
        server_index: rule.server_index,
        verdict,
        hook,
        protocol,
        _pad: 0,
    };
    summarised(&key, now, addr, port, family, || {
        emit(
            ctx, protocol, rule, addr, port, family, hook, verdict, now, cgroup_id,
        )
    });
}

/// Sends the event through `send`, or counts it in its key's summary (last seen at `addr`,
/// `port`, `family`) when the key is over its burst or the ring is full
/// (agent-common/src/summary.rs). Only a key the summary map has no room for can lose an
/// event, and that is counted (`RING_DROPS`).
#[inline(always)]
fn summarised(
    key: &SummaryKey,
    now: u64,
    addr: [u8; 16],
    port: u16,
    family: u16,
    send: impl Fn() -> bool,
) {
    let slot = match SUMMARY.get_ptr_mut(key) {
        Some(slot) => slot,
        None => {
            // A per-CPU entry: inserting from a program sets this CPU's share; another CPU
            // may have made the entry first, which is fine.
            let _ = SUMMARY.insert(key, &blank_summary(now), 0);
            match SUMMARY.get_ptr_mut(key) {
                Some(slot) => slot,
                None => {
                    if !send() {
                        bump(counters::RING_DROPS);
                    }
                    return;
                }
            }
        }
    };
    // SAFETY: this CPU's share of the entry; no other writer while the program runs on it.
    let summary = unsafe { &mut *slot };
    if now.wrapping_sub(summary.window_start_ns) >= WINDOW_NS {
        summary.window_start_ns = now;
        summary.in_window = 0;
    }
    summary.in_window += 1;
    if summary.in_window <= BURST && send() {
        return;
    }
    if summary.summarised == 0 {
        summary.first_ns = now;
    }
    summary.summarised += 1;
    summary.last_ns = now;
    summary.addr = addr;
    summary.port = port;
    summary.family = family;
    summary.pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    summary.uid = bpf_get_current_uid_gid() as u32;
    summary.comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
    bump(counters::SUMMARISED);
}

#[inline(always)]
fn blank_summary(now: u64) -> SummaryValue {
    SummaryValue {
        window_start_ns: now,
        in_window: 0,
        summarised: 0,
        first_ns: 0,
        last_ns: 0,
        addr: [0; 16],
        port: 0,
        family: 0,
        pid: 0,
        uid: 0,
        _pad: 0,
        comm: [0; COMM_LEN],
    }
}

/// Sends one event through the ring; false when it does not fit.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn emit(
    ctx: *mut core::ffi::c_void,
    protocol: u8,
    rule: &EndpointRule,
    addr: [u8; 16],
    port: u16,
    family: u16,
    hook: u8,
    verdict: u8,
    now: u64,
    cgroup_id: u64,
) -> bool {
    let Some(mut entry) = EVENTS.reserve::<ConnectEvent>(0) else {
        return false;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
    // SAFETY: valid in cgroup_sock_addr and cgroup_sock programs; `ctx` is the program's.
    let cookie = unsafe { bpf_get_socket_cookie(ctx) };
    entry.write(ConnectEvent {
        ktime_ns: now,
        cookie,
        cgroup_id,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        uid: bpf_get_current_uid_gid() as u32,
        server_index: rule.server_index,
        addr,
        port,
        family,
        protocol,
        verdict,
        hook,
        _pad: [BUILD_VARIANT, 0, 0, 0, 0],
        comm,
    });
    entry.submit(0);
    true
}

/// 0, or 1 in the build `tests/tests/session_upgrade.rs` upgrades from (`--cfg
/// toolwall_variant`, agent/build.rs): a difference in a constant, so that build's object, and
/// its pins' directory, is another.
const BUILD_VARIANT: u8 = if cfg!(toolwall_variant) { 1 } else { 0 };

#[inline(always)]
fn bump(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
        unsafe { *slot += 1 };
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
