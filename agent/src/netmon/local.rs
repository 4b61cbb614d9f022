//! The host's own addresses, and word of their changes.
//!
//! A server listening on `0.0.0.0` or `[::]` answers on every address of every interface, so a
//! rule on `127.0.0.1:P` must cover `192.0.2.2:P`, `[fd00::2]:P` and `[fe80::…%eth0]:P` too
//! (otherwise a session reaches a denied local server through another of the host's
//! addresses). The list is read with `getifaddrs(3)`; changes arrive as rtnetlink address and
//! route notifications (`RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR` and the route groups, for
//! [`super::routes`]), not by polling.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use tokio::io::{Interest, unix::AsyncFd};

/// The `nameserver`s of /etc/resolv.conf (scopes dropped, as for [`local_addresses`]); none
/// when the file is missing.
pub(crate) fn system_resolvers() -> Vec<IpAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    parse_resolv_conf(&text)
}

fn parse_resolv_conf(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver")).then_some(())?;
            let addr = words.next()?;
            addr.split('%').next()?.parse().ok()
        })
        .collect()
}

/// Every address configured on any interface of this network namespace, loopback included,
/// sorted. Link-local IPv6 addresses are listed without their scope: the kernel programs see a
/// destination's 16 bytes, not its interface.
pub(crate) fn local_addresses() -> io::Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    // SAFETY: each entry's address is a sockaddr of its family's size, or null.
    each_interface_address(|entry| out.extend(unsafe { sockaddr_ip(entry.ifa_addr) }))?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// Calls `visit` with each entry of `getifaddrs(3)`.
fn each_interface_address(mut visit: impl FnMut(&libc::ifaddrs)) -> io::Result<()> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: cursor walks the list getifaddrs returned, which stays valid until freed.
        let entry = unsafe { &*cursor };
        visit(entry);
        cursor = entry.ifa_next;
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(())
}

/// The IP address in a `sockaddr`, if it is an IPv4 or IPv6 one.
///
/// # Safety
/// `sa` is null or points to a sockaddr of the size its family implies.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: per the contract; each family's struct is read only when the family says so.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let v4 = &*(sa.cast::<libc::sockaddr_in>());
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))))
            }
            libc::AF_INET6 => {
                let v6 = &*(sa.cast::<libc::sockaddr_in6>());
                Some(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    }
}

/// An rtnetlink socket subscribed to address changes; readable when an address was added or
/// removed on any interface.
pub(crate) struct AddressChanges {
    fd: AsyncFd<OwnedFd>,
}

impl AddressChanges {
    /// Subscribes (needs no privilege).
    pub(crate) fn subscribe() -> io::Result<Self> {
        // SAFETY: plain socket(2); the descriptor is owned right away.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a zeroed sockaddr_nl is valid; we set family and groups.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        addr.nl_groups = (libc::RTMGRP_IPV4_IFADDR
            | libc::RTMGRP_IPV6_IFADDR
            | libc::RTMGRP_IPV4_ROUTE
            | libc::RTMGRP_IPV6_ROUTE) as u32;
        // SAFETY: bind with a sockaddr_nl of its own size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the AsyncFd owns the descriptor, which stays open and the same while it lives.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
        Ok(AddressChanges { fd })
    }

    /// Waits for the next change and discards every notification queued with it (the caller
    /// re-reads the whole list, so their content does not matter). An overrun (ENOBUFS) also
    /// counts as a change: something was missed, and re-reading covers it.
    pub(crate) async fn changed(&mut self) -> io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            let mut buf = [0u8; 8192];
            let mut got = false;
            loop {
                // SAFETY: recv into a buffer of the size given.
                let n = unsafe {
                    libc::recv(
                        guard.get_inner().as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if n > 0 {
                    got = true;
                    continue;
                }
                let error = io::Error::last_os_error();
                match error.raw_os_error() {
                    Some(libc::EAGAIN) => break,
                    Some(libc::ENOBUFS) => got = true,
                    Some(libc::EINTR) => {}
                    _ if n == 0 => break,
                    _ => return Err(error),
                }
            }
            guard.clear_ready();
            if got {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn resolv_conf_nameservers_are_read_with_their_scope_dropped() {
        let text = "# comment\nsearch example.org\nnameserver 192.0.2.53\nnameserver fe80::1%eth0\nnameserver\nnameserver not-an-ip\noptions ndots:1\n";
        assert_eq!(
            super::parse_resolv_conf(text),
            vec![
                "192.0.2.53".parse::<std::net::IpAddr>().expect("ip"),
                "fe80::1".parse().expect("ip")
            ]
        );
    }

    #[test]
    fn this_host_has_its_loopback_addresses() {
        let addrs = super::local_addresses().expect("getifaddrs");
        assert!(
            addrs.contains(&"127.0.0.1".parse().expect("ip")),
            "{addrs:?}"
        );
    }

    #[tokio::test]
    async fn subscribing_needs_no_privilege_and_waits_quietly() {
        let mut changes = super::AddressChanges::subscribe().expect("netlink");
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(50), changes.changed()).await;
        assert!(waited.is_err(), "no address changed in 50 ms");
    }
}
