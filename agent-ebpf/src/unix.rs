//! `cgroup/connect_unix` and `cgroup/sendmsg_unix`: a session's Unix socket connects and
//! datagrams sent to an address, decided by the name they go to.
//!
//! Both are built as `cgroup_sock_addr` programs and loaded by the daemon with the Unix attach
//! types (`agent/src/netmon/loader/unix.rs`), which aya does not know; aya only parses them.
//! The kernel runs them before it looks the name up, pathname and abstract alike, so a
//! refused call never reaches the socket: the user's tmux server, a forwarder, a bus. A name
//! the daemon listed (`UNIX_LISTED`: its API socket, `exec.allow_unix`) is let through. A
//! `socketpair()` and a socket made outside the session (inherited, or passed in) are never
//! asked. Daemon-run stdio servers are decided alike: their `egress:` declarations name IP
//! destinations only.

use agent_common::{
    connect::{COMM_LEN, FAMILY_UNIX, HOOK_UNIX_CONNECT, HOOK_UNIX_SEND, VERDICT_DENIED},
    counters,
    rule::UNIX_INDEX,
    summary::SummaryKey,
    unix::{UnixEvent, UnixName, MAX_UNIX_LISTED, NAME_BYTES},
};
use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_current_uid_gid, bpf_get_socket_cookie, bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated,
    },
    macros::{cgroup_sock_addr, map},
    maps::{HashMap, PerCpuArray},
    programs::SockAddrContext,
};

use crate::{bump, summarised, ALLOW, EVENTS, REFUSE};

/// Unix socket names every session may reach.
#[map(name = "UNIX_LISTED")]
static UNIX_LISTED: HashMap<UnixName, u32> = HashMap::pinned(MAX_UNIX_LISTED, 0);

/// Per-CPU room for the name being read (too big for the 512-byte stack with the rest);
/// pinned like every map these programs use, which the daemon finds by their pins.
#[map(name = "UNIX_SCRATCH")]
static UNIX_SCRATCH: PerCpuArray<UnixName> = PerCpuArray::pinned(1, 0);

/// Offsets in `struct bpf_sock_addr_kern`, the kernel object behind a sock_addr program's
/// context (`include/linux/filter.h`): the address the caller passed and its length. The
/// context's public fields have no Unix name; a kernel that moved these would hand the
/// program a length outside 2..=110 or a family other than AF_UNIX, which is refused.
const KERN_UADDR: usize = 8;
const KERN_UADDRLEN: usize = 32;

// Section names aya parses; the daemon loads them as connect_unix and sendmsg_unix.
#[cgroup_sock_addr(connect4)]
pub fn unix_connect(ctx: SockAddrContext) -> i32 {
    unix_verdict(&ctx, HOOK_UNIX_CONNECT)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn unix_sendmsg(ctx: SockAddrContext) -> i32 {
    unix_verdict(&ctx, HOOK_UNIX_SEND)
}

#[inline(always)]
fn unix_verdict(ctx: &SockAddrContext, hook: u8) -> i32 {
    bump(counters::UNIX_CONNECTS);
    let Some(name) = UNIX_SCRATCH.get_ptr_mut(0) else {
        return REFUSE;
    };
    // SAFETY: this CPU's scratch slot; nothing else uses it while the program runs here.
    let name = unsafe { &mut *name };
    let read = read_name(ctx, name);
    // SAFETY: map values are plain Copy data; only presence is read.
    if read && unsafe { UNIX_LISTED.get(&*name) }.is_some() {
        return ALLOW;
    }
    if !read {
        *name = UnixName::EMPTY;
    }
    bump(counters::DENIED);
    record(ctx, name, hook);
    REFUSE
}

/// Reads the caller's address into `name` in [`UnixName`]'s canonical form; false when it is
/// not a readable AF_UNIX address. The kernel's own copy of the address is read with one
/// helper call for the name, not byte by byte: a pathname up to its first NUL
/// (`bpf_probe_read_kernel_str`), an abstract name whole.
#[inline(always)]
fn read_name(ctx: &SockAddrContext, name: &mut UnixName) -> bool {
    // SAFETY: the context points at the kernel's bpf_sock_addr_kern; reading it through
    // bpf_probe_read_kernel cannot fault, and both fields are plain values.
    let (uaddr, uaddrlen) = unsafe {
        let kern = ctx.sock_addr as *const u8;
        let uaddr = bpf_probe_read_kernel(kern.add(KERN_UADDR).cast::<u64>());
        let len = bpf_probe_read_kernel(kern.add(KERN_UADDRLEN).cast::<u32>());
        match (uaddr, len) {
            (Ok(uaddr), Ok(len)) => (uaddr as *const u8, len),
            _ => return false,
        }
    };
    if !(2..=(2 + NAME_BYTES as u32)).contains(&uaddrlen) {
        return false;
    }
    // The family and the path's first byte (which tells an abstract name). The kernel's copy is
    // a whole sockaddr_storage, so the third byte is readable even when the caller passed two.
    // SAFETY: bpf_probe_read_kernel cannot fault.
    let Ok(head) = (unsafe { bpf_probe_read_kernel(uaddr.cast::<[u8; 3]>()) }) else {
        return false;
    };
    if u16::from_ne_bytes([head[0], head[1]]) != FAMILY_UNIX {
        return false;
    }
    *name = UnixName::EMPTY;
    // The verifier needs the size's bound on the register the helper gets: the compiler would
    // fold a mask after the range check above away, so the length is opaque to it here.
    let size = core::hint::black_box(uaddrlen - 2) & 0x7f;
    if size == 0 {
        return true;
    }
    if size > NAME_BYTES as u32 {
        return false;
    }
    // SAFETY: the path starts two bytes into the address.
    let path = unsafe { uaddr.add(2) };
    let dst = name.path.as_mut_ptr().cast();
    if head[2] == 0 {
        // SAFETY: at most sizeof(name.path) bytes into it; the helper cannot fault.
        if unsafe { generated::bpf_probe_read_kernel(dst, size, path.cast()) } != 0 {
            return false;
        }
        name.len = size;
        return true;
    }
    // SAFETY: at most `size` bytes into name.path, the last of them a NUL the helper writes;
    // it returns how many it wrote, that NUL included.
    let written = unsafe { generated::bpf_probe_read_kernel_str(dst, size, path.cast()) };
    if written <= 0 {
        return false;
    }
    let mut len = written as u32 - 1;
    if written as u32 == size {
        // The helper gave the last byte to its NUL: the caller's byte there is the name's own
        // when it is not a NUL (a pathname the caller did not terminate).
        let last = (size - 1) as usize;
        // SAFETY: bpf_probe_read_kernel cannot fault; `last` is inside the address.
        let Ok(byte) = (unsafe { bpf_probe_read_kernel(path.add(last)) }) else {
            return false;
        };
        if byte != 0 {
            if let Some(slot) = name.path.get_mut(last) {
                *slot = byte;
                len = size;
            }
        }
    }
    name.len = len;
    true
}

/// Sends the refusal, or counts it in its summary (which keeps the name's first sixteen bytes
/// and its length).
#[inline(always)]
fn record(ctx: &SockAddrContext, name: &UnixName, hook: u8) {
    // SAFETY: both helpers are valid in cgroup_sock_addr programs.
    let (now, cgroup_id) = unsafe { (bpf_ktime_get_ns(), bpf_get_current_cgroup_id()) };
    let key = SummaryKey {
        cgroup_id,
        server_index: UNIX_INDEX,
        verdict: VERDICT_DENIED,
        hook,
        protocol: 0,
        _pad: 0,
    };
    let mut prefix = [0u8; 16];
    prefix.copy_from_slice(&name.path[..16]);
    summarised(&key, now, prefix, name.len as u16, FAMILY_UNIX, || {
        emit(ctx, name, hook, now, cgroup_id)
    });
}

/// Sends one refusal through the ring; false when it does not fit.
#[inline(always)]
fn emit(ctx: &SockAddrContext, name: &UnixName, hook: u8, now: u64, cgroup_id: u64) -> bool {
    let Some(mut entry) = EVENTS.reserve::<UnixEvent>(0) else {
        return false;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: valid in cgroup_sock_addr programs with their context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) };
    entry.write(UnixEvent {
        ktime_ns: now,
        cookie,
        cgroup_id,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        uid: bpf_get_current_uid_gid() as u32,
        hook,
        verdict: VERDICT_DENIED,
        _pad: [0; 2],
        comm: bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]),
        name: *name,
    });
    entry.submit(0);
    true
}
