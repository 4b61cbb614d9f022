//! Reading the kernel's connect, sendmsg, bind and Unix socket events from the ring buffer.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use agent_common::{
    connect::{COMM_LEN, ConnectEvent, FAMILY_UNIX, VERDICT_DENIED},
    rule::UNIX_INDEX,
    unix::UnixEvent,
};
use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

/// A connect event decoded into user-space terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connect {
    /// The raw event.
    pub raw: ConnectEvent,
    /// Destination; an IPv4-mapped address is shown as IPv4.
    pub dest: Dest,
    /// Whether the kernel refused the connect.
    pub denied: bool,
    /// The task's comm.
    pub comm: String,
}

/// Where a connection went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dest {
    /// An IP address and port.
    Ip(SocketAddr),
    /// A Unix socket name as [`unix_name`] shows it.
    Unix(String),
}

impl std::fmt::Display for Dest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dest::Ip(addr) => addr.fmt(f),
            Dest::Unix(name) => f.write_str(name),
        }
    }
}

/// A Unix socket name for the record, in a form no other kind of name can take: an absolute
/// pathname as it is, a relative one after `./`, an abstract name as `@` and the rest; bytes
/// that are not printable ASCII escaped (`\0`, `\xNN`). So a relative path named `@listed`
/// or `(unreadable address)` cannot pass for the abstract name or the sentinel. An empty name
/// is an address the program could not read.
pub(crate) fn unix_name(bytes: &[u8]) -> String {
    match bytes.split_first() {
        None => "(unreadable address)".to_owned(),
        Some((0, rest)) => format!("@{}", rest.escape_ascii()),
        Some((b'/', _)) => bytes.escape_ascii().to_string(),
        Some(_) => format!("./{}", bytes.escape_ascii()),
    }
}

/// Decodes one ring-buffer record; `None` if it is not a whole event (never expected).
pub(crate) fn decode(bytes: &[u8]) -> Option<Connect> {
    if bytes.len() == size_of::<UnixEvent>() {
        return Some(decode_unix(bytes));
    }
    if bytes.len() < size_of::<ConnectEvent>() {
        return None;
    }
    // SAFETY: the length was checked; ConnectEvent is plain old data valid for any bytes, and
    // read_unaligned does not need the ring's alignment.
    let raw: ConnectEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let ip = dest_ip(&raw.addr);
    let comm_len = raw.comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    Some(Connect {
        dest: Dest::Ip(SocketAddr::new(ip, raw.port)),
        denied: raw.verdict == VERDICT_DENIED,
        comm: String::from_utf8_lossy(&raw.comm[..comm_len]).into_owned(),
        raw,
    })
}

/// [`decode`] of a record exactly as long as one of this build's events: for another build's
/// ring, whose events may be laid out otherwise.
pub(crate) fn decode_exact(bytes: &[u8]) -> Option<Connect> {
    [size_of::<UnixEvent>(), size_of::<ConnectEvent>()]
        .contains(&bytes.len())
        .then(|| decode(bytes))
        .flatten()
}

/// A Unix socket refusal, in a connect event's terms (family [`FAMILY_UNIX`], no address).
fn decode_unix(bytes: &[u8]) -> Connect {
    // SAFETY: the caller checked the length; UnixEvent is plain old data valid for any bytes.
    let raw: UnixEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let comm_len = raw.comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    Connect {
        dest: Dest::Unix(unix_name(raw.name.bytes())),
        denied: raw.verdict == VERDICT_DENIED,
        comm: String::from_utf8_lossy(&raw.comm[..comm_len]).into_owned(),
        raw: ConnectEvent {
            ktime_ns: raw.ktime_ns,
            cookie: raw.cookie,
            cgroup_id: raw.cgroup_id,
            pid: raw.pid,
            tid: raw.tid,
            uid: raw.uid,
            server_index: UNIX_INDEX,
            addr: [0; 16],
            port: 0,
            family: FAMILY_UNIX,
            protocol: 0,
            verdict: raw.verdict,
            hook: raw.hook,
            _pad: [0; 5],
            comm: raw.comm,
        },
    }
}

/// A destination as the kernel stores it (IPv6, or IPv4-mapped) as what it reaches: an AF_INET6
/// socket to ::ffff:a.b.c.d talks IPv4.
pub(crate) fn dest_ip(addr: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*addr);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// Waits for events and hands each to `on_event` until `stop` resolves; then hands over what
/// is still in the ring and returns, so stopping never loses a delivered event. `drained` is
/// called after each pass that emptied the ring (closed sessions are forgotten by it).
pub(crate) async fn read_events(
    ring: RingBuf<MapData>,
    mut on_event: impl FnMut(Connect),
    mut drained: impl FnMut(),
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    // SAFETY: the RingBuf owns its map fd, which stays open and the same for as long as the
    // AsyncFd (which owns the RingBuf) lives.
    let mut fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            guard = fd.readable_mut() => {
                let mut guard = guard?;
                drain(guard.get_inner_mut(), &mut on_event);
                guard.clear_ready();
                drained();
            }
            _ = &mut stop => {
                drain(fd.get_mut(), &mut on_event);
                return Ok(());
            }
        }
    }
}

/// Hands every event now in the ring to `on_event` without waiting.
pub fn drain(ring: &mut RingBuf<MapData>, on_event: &mut impl FnMut(Connect)) {
    while let Some(item) = ring.next() {
        match decode(&item) {
            Some(connect) => on_event(connect),
            None => tracing::error!(len = item.len(), "short record in the connect event ring"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_common::connect::{FAMILY_INET, FAMILY_INET6, VERDICT_FLAGGED};

    fn raw(addr: Ipv6Addr, family: u16, verdict: u8) -> ConnectEvent {
        let mut comm = [0u8; COMM_LEN];
        comm[..4].copy_from_slice(b"curl");
        ConnectEvent {
            ktime_ns: 1,
            cookie: 2,
            cgroup_id: 3,
            pid: 100,
            tid: 101,
            uid: 0,
            server_index: 0,
            addr: addr.octets(),
            port: 8080,
            family,
            protocol: 6,
            verdict,
            hook: agent_common::connect::HOOK_CONNECT,
            _pad: [0; 5],
            comm,
        }
    }

    fn bytes(ev: &ConnectEvent) -> Vec<u8> {
        // SAFETY: ConnectEvent is repr(C) plain data with explicit padding.
        unsafe {
            std::slice::from_raw_parts(
                (ev as *const ConnectEvent).cast::<u8>(),
                size_of::<ConnectEvent>(),
            )
        }
        .to_vec()
    }

    #[test]
    fn decodes_mapped_ipv4_as_ipv4_and_keeps_ids() {
        let ev = raw(
            std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped(),
            FAMILY_INET6,
            VERDICT_DENIED,
        );
        let c = decode(&bytes(&ev)).unwrap();
        assert_eq!(c.dest, Dest::Ip("127.0.0.1:8080".parse().unwrap()));
        assert!(c.denied);
        assert_eq!(c.comm, "curl");
        assert_eq!((c.raw.pid, c.raw.tid), (100, 101));
    }

    #[test]
    fn decodes_ipv6_and_rejects_short_records() {
        let ev = raw(Ipv6Addr::LOCALHOST, FAMILY_INET6, VERDICT_FLAGGED);
        let c = decode(&bytes(&ev)).unwrap();
        assert_eq!(c.dest, Dest::Ip("[::1]:8080".parse().unwrap()));
        assert!(!c.denied);
        assert!(decode(&bytes(&raw(Ipv6Addr::LOCALHOST, FAMILY_INET, 1))[..10]).is_none());
    }

    #[test]
    fn decodes_a_unix_refusal_with_its_name_escaped() {
        let mut comm = [0u8; COMM_LEN];
        comm[..4].copy_from_slice(b"tmux");
        let ev = UnixEvent {
            ktime_ns: 1,
            cookie: 2,
            cgroup_id: 3,
            pid: 100,
            tid: 101,
            uid: 65534,
            hook: agent_common::connect::HOOK_UNIX_CONNECT,
            verdict: VERDICT_DENIED,
            _pad: [0; 2],
            comm,
            name: agent_common::unix::UnixName::of(b"\0fwd\n\x1b[31m").unwrap(),
        };
        // SAFETY: UnixEvent is repr(C) plain data with explicit padding.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&ev as *const UnixEvent).cast::<u8>(),
                size_of::<UnixEvent>(),
            )
        };
        let c = decode(bytes).unwrap();
        assert_eq!(c.dest.to_string(), "@fwd\\n\\x1b[31m");
        assert!(c.denied);
        assert_eq!(c.raw.family, FAMILY_UNIX);
        assert_eq!(c.raw.server_index, UNIX_INDEX);
        assert_eq!(unix_name(b"/tmp/tmux-0/default"), "/tmp/tmux-0/default");
        assert_eq!(unix_name(b""), "(unreadable address)");
        assert_eq!(unix_name(b"@listed"), "./@listed");
        assert_eq!(unix_name(b"(unreadable address)"), "./(unreadable address)");
    }
}
