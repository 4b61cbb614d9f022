//! The kernel's `local` and `broadcast` routes, in every routing table: every destination this
//! host takes as its own. An interface address is one entry, but so is a whole prefix (`ip route
//! add local 198.18.0.0/24 dev lo`, in the local table or any other: every address in it reaches
//! the host's listeners), and the broadcast addresses the kernel delivers to the host (each
//! subnet's, whatever `broadcast` an address was given). Read with an `RTM_GETROUTE` dump over
//! rtnetlink.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

/// What the local table says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LocalTable {
    /// `local` routes: prefixes whose every address is this host.
    pub local: Vec<(IpAddr, u8)>,
    /// `broadcast` routes: addresses whose datagrams reach this host and its neighbours.
    pub broadcast: Vec<IpAddr>,
}

const RTN_LOCAL: u8 = 2;
const RTN_BROADCAST: u8 = 3;
const RTA_DST: u16 = 1;
/// `struct rtmsg`: family, dst_len, src_len, tos, table, protocol, scope, type, flags (u32).
const RTMSG_LEN: usize = 12;

/// Reads the local and broadcast routes of this network namespace (every table, both families).
pub(crate) fn local_table() -> io::Result<LocalTable> {
    // SAFETY: plain socket(2); the descriptor is owned right away.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut request = [0u8; 16 + RTMSG_LEN];
    let len = request.len() as u32;
    request[0..4].copy_from_slice(&len.to_ne_bytes());
    request[4..6].copy_from_slice(&libc::RTM_GETROUTE.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    request[6..8].copy_from_slice(&flags.to_ne_bytes());
    request[8..12].copy_from_slice(&1u32.to_ne_bytes());
    request[16] = libc::AF_UNSPEC as u8;
    // SAFETY: send of a buffer of the length given.
    if unsafe { libc::send(fd.as_raw_fd(), request.as_ptr().cast(), request.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut table = LocalTable::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: recv into a buffer of the length given.
        let got = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        if got == 0 || parse_messages(&buf[..got as usize], &mut table)? {
            break;
        }
    }
    table.local.sort();
    table.local.dedup();
    table.broadcast.sort();
    table.broadcast.dedup();
    Ok(table)
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("rtnetlink: {what}"))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Adds the local and broadcast routes of one batch of messages; true at the dump's end.
fn parse_messages(mut rest: &[u8], table: &mut LocalTable) -> io::Result<bool> {
    while rest.len() >= 16 {
        let len = u32_at(rest, 0).ok_or_else(|| bad("a short message"))? as usize;
        let kind = u16_at(rest, 4).ok_or_else(|| bad("a short message"))?;
        if len < 16 || len > rest.len() {
            return Err(bad("a cut message"));
        }
        let message = &rest[..len];
        match kind {
            k if k == libc::NLMSG_DONE as u16 => return Ok(true),
            k if k == libc::NLMSG_ERROR as u16 => {
                let errno = u32_at(message, 16).ok_or_else(|| bad("a short error"))? as i32;
                return Err(io::Error::from_raw_os_error(-errno));
            }
            k if k == libc::RTM_NEWROUTE => route(message, table)?,
            _ => {}
        }
        rest = &rest[((len + 3) & !3).min(rest.len())..];
    }
    Ok(false)
}

/// One route message: kept when it is a local or broadcast route (of whichever table: a rule
/// may send a destination to any of them).
fn route(message: &[u8], table: &mut LocalTable) -> io::Result<()> {
    let rtm = message
        .get(16..16 + RTMSG_LEN)
        .ok_or_else(|| bad("a short route"))?;
    let (family, dst_len, kind) = (rtm[0], rtm[1], rtm[7]);
    let mut dst: Option<IpAddr> = None;
    let mut at = 16 + RTMSG_LEN;
    while at + 4 <= message.len() {
        let attr_len = u16_at(message, at).ok_or_else(|| bad("a cut attribute"))? as usize;
        let attr_type = u16_at(message, at + 2).ok_or_else(|| bad("a cut attribute"))?;
        if attr_len < 4 || at + attr_len > message.len() {
            return Err(bad("a malformed attribute"));
        }
        let value = &message[at + 4..at + attr_len];
        if attr_type == RTA_DST {
            dst = match (i32::from(family), value.len()) {
                (libc::AF_INET, 4) => Some(IpAddr::V4(Ipv4Addr::new(
                    value[0], value[1], value[2], value[3],
                ))),
                (libc::AF_INET6, 16) => {
                    let octets: [u8; 16] = value.try_into().map_err(|_| bad("an address"))?;
                    Some(IpAddr::V6(Ipv6Addr::from(octets)))
                }
                _ => None,
            };
        }
        at += (attr_len + 3) & !3;
    }
    let Some(dst) = dst else {
        return Ok(());
    };
    match kind {
        RTN_LOCAL => table.local.push((dst, dst_len)),
        RTN_BROADCAST => table.broadcast.push(dst),
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_is_local_in_the_local_table() {
        let table = super::local_table().expect("rtnetlink dump");
        assert!(
            table.local.iter().any(|(a, bits)| *a
                == "127.0.0.0".parse::<std::net::IpAddr>().unwrap()
                && *bits == 8),
            "{table:?}"
        );
        assert!(
            table.local.contains(&("::1".parse().unwrap(), 128)),
            "{table:?}"
        );
    }
}
