//! A daemon-run stdio server's declared `egress:`: its cgroup (listed in `EGRESS_SCOPE`) reaches
//! only the destinations `EGRESS_ALLOW` holds for it. Connects and sends are decided in
//! `verdict` (`main.rs`) with [`limited_scope`] and [`egress_allowed`]; every other IP packet,
//! ICMP and raw sockets included, by the `cgroup_skb` guards here.

use agent_common::{
    counters,
    rule::{EgressKey, EGRESS_FIXED_BITS, MAX_EGRESS_LEVEL, MAX_EGRESS_SCOPES, MAX_RULES},
};
use aya_ebpf::{
    helpers::bpf_skb_ancestor_cgroup_id,
    macros::{cgroup_skb, map},
    maps::{lpm_trie::Key, HashMap, LpmTrie},
    programs::SkBuffContext,
};

use crate::{bump, ALLOW, REFUSE};

/// Cgroups of daemon-run stdio servers whose egress is limited to their declaration's.
#[map(name = "EGRESS_SCOPE")]
static EGRESS_SCOPE: HashMap<u64, u32> = HashMap::pinned(MAX_EGRESS_SCOPES, 0);

/// What each limited cgroup may reach (`EgressKey`: its cgroup, a port or 0 for any, an
/// address prefix).
#[map(name = "EGRESS_ALLOW")]
static EGRESS_ALLOW: LpmTrie<EgressKey, u8> = LpmTrie::pinned(MAX_RULES, 1);

/// The egress-limited cgroup among the caller's ancestors (`ancestor(level)` of levels 1 and
/// deeper: the root never is), or 0.
#[inline(always)]
pub(crate) fn limited_scope(ancestor: impl Fn(i32) -> u64) -> u64 {
    let mut level = 1;
    while level <= MAX_EGRESS_LEVEL {
        let id = ancestor(level);
        if id == 0 {
            return 0;
        }
        // SAFETY: map values are plain Copy data; only presence is read.
        if unsafe { EGRESS_SCOPE.get(&id) }.is_some() {
            return id;
        }
        level += 1;
    }
    0
}

/// `cgroup_skb/egress` on a limited cgroup: every IP packet its sockets send — ICMP and raw
/// ones included, which no connect program sees — goes only where its declaration allows.
#[cgroup_skb(egress)]
pub fn egress_guard(ctx: SkBuffContext) -> i32 {
    guard(&ctx, true)
}

/// `cgroup_skb/ingress` on a limited cgroup: only packets from where it may connect reach its
/// sockets (a listening socket is no way around the limit).
#[cgroup_skb(ingress)]
pub fn ingress_guard(ctx: SkBuffContext) -> i32 {
    guard(&ctx, false)
}

#[inline(always)]
fn guard(ctx: &SkBuffContext, outgoing: bool) -> i32 {
    let skb = ctx.skb.skb;
    let scope = limited_scope(|level| {
        // SAFETY: valid in cgroup_skb programs; `skb` is the program's context.
        unsafe { bpf_skb_ancestor_cgroup_id(skb, level) }
    });
    if scope == 0 {
        return ALLOW;
    }
    let allowed = match peer_of(ctx, outgoing) {
        Some((addr, port)) => egress_allowed(scope, addr, port),
        None => false,
    };
    if allowed {
        ALLOW
    } else {
        bump(counters::EGRESS_DROPS);
        REFUSE
    }
}

/// The far end of a packet (destination when `outgoing`, else source) and its TCP/UDP port
/// (0 when the packet has none: ICMP, a later fragment, an IPv6 extension header — then only
/// an any-port rule matches). `None`: not an IP packet this program can read.
#[inline(always)]
fn peer_of(ctx: &SkBuffContext, outgoing: bool) -> Option<([u8; 16], u16)> {
    let first: u8 = ctx.load(0).ok()?;
    let mut addr = [0u8; 16];
    let (l4, proto, fragment) = match first >> 4 {
        4 => {
            let at = if outgoing { 16 } else { 12 };
            let ip4: [u8; 4] = ctx.load(at).ok()?;
            addr[10] = 0xff;
            addr[11] = 0xff;
            addr[12..16].copy_from_slice(&ip4);
            let proto: u8 = ctx.load(9).ok()?;
            let frag: [u8; 2] = ctx.load(6).ok()?;
            let offset = u16::from_be_bytes(frag) & 0x1fff;
            (usize::from(first & 0x0f) * 4, proto, offset != 0)
        }
        6 => {
            addr = ctx.load(if outgoing { 24 } else { 8 }).ok()?;
            let next: u8 = ctx.load(6).ok()?;
            (40, next, false)
        }
        _ => return None,
    };
    let port = if !fragment && (proto == 6 || proto == 17) {
        let ports: [u8; 4] = ctx.load(l4).ok()?;
        if outgoing {
            u16::from_be_bytes([ports[2], ports[3]])
        } else {
            u16::from_be_bytes([ports[0], ports[1]])
        }
    } else {
        0
    };
    Some((addr, port))
}

/// Whether a limited cgroup's declaration lets it reach the destination: (port, then any
/// port) under the longest matching prefix.
#[inline(always)]
pub(crate) fn egress_allowed(cgroup_id: u64, addr: [u8; 16], port: u16) -> bool {
    let full = EGRESS_FIXED_BITS + 128;
    let cgroup = cgroup_id.to_be_bytes();
    EGRESS_ALLOW
        .get(&Key::new(
            full,
            EgressKey {
                cgroup,
                port: port.to_be_bytes(),
                addr,
            },
        ))
        .is_some()
        || EGRESS_ALLOW
            .get(&Key::new(
                full,
                EgressKey {
                    cgroup,
                    port: [0; 2],
                    addr,
                },
            ))
            .is_some()
}
