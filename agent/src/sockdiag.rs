//! Which cgroup and user opened the other end of a loopback TCP connection, asked of the
//! kernel (`NETLINK_SOCK_DIAG`: `INET_DIAG_CGROUP_ID`, and the socket's owner in every answer).
//!
//! A secret in a URL says what a client knows, not where it runs: a session's LLM base URL
//! (`llm/proxy/sessions.rs`) sits in its agent's environment, which every process of the
//! agent's user can read, inside the session or not. The cgroup a socket was made in is set
//! by the kernel and is what the kernel layer (`netmon/`) already trusts for sessions.

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, SocketAddr};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const INET_DIAG_CGROUP_ID: u16 = 21;
/// `idiag_cookie` that matches any socket.
const NO_COOKIE: u32 = !0;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SockId {
    sport: [u8; 2],
    dport: [u8; 2],
    src: [u8; 16],
    dst: [u8; 16],
    interface: u32,
    cookie: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Request {
    header: libc::nlmsghdr,
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

const _: () = assert!(size_of::<SockId>() == 48);
const _: () = assert!(size_of::<Request>() == 16 + 56);
/// `struct inet_diag_msg`: what precedes the attributes of an answer.
const DIAG_MSG: usize = 72;

/// What the kernel says of the client end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClientSocket {
    /// The user that made the socket.
    pub(crate) uid: u32,
    /// Its cgroup (v2) id; `None` on a kernel that does not say (no
    /// `CONFIG_SOCK_CGROUP_DATA`).
    pub(crate) cgroup: Option<u64>,
}

/// The cgroup (v2) id of the socket at `client` connected to `server` — the client end of a
/// connection this process accepted at `server`. Errors when the kernel knows no such socket
/// or does not say (no `CONFIG_SOCK_CGROUP_DATA`).
#[cfg(test)]
pub(crate) fn client_cgroup(server: SocketAddr, client: SocketAddr) -> io::Result<u64> {
    client_socket(server, client)?.cgroup.ok_or_else(|| {
        not_said("no cgroup id in the answer (a kernel without CONFIG_SOCK_CGROUP_DATA)")
    })
}

/// The owner and cgroup of the socket at `client` connected to `server` (see
/// [`client_cgroup`]). Errors when the kernel knows no such socket.
pub(crate) fn client_socket(server: SocketAddr, client: SocketAddr) -> io::Result<ClientSocket> {
    let (family, src, dst) = match (client.ip(), server.ip()) {
        (IpAddr::V4(c), IpAddr::V4(s)) => {
            let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
            src[..4].copy_from_slice(&c.octets());
            dst[..4].copy_from_slice(&s.octets());
            (libc::AF_INET, src, dst)
        }
        (IpAddr::V6(c), IpAddr::V6(s)) => (libc::AF_INET6, c.octets(), s.octets()),
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the two ends of one connection are of different address families",
            ));
        }
    };
    let request = Request {
        header: libc::nlmsghdr {
            nlmsg_len: size_of::<Request>() as u32,
            nlmsg_type: SOCK_DIAG_BY_FAMILY,
            nlmsg_flags: libc::NLM_F_REQUEST as u16,
            nlmsg_seq: 1,
            nlmsg_pid: 0,
        },
        family: family as u8,
        protocol: libc::IPPROTO_TCP as u8,
        ext: 0,
        pad: 0,
        states: !0,
        id: SockId {
            sport: client.port().to_be_bytes(),
            dport: server.port().to_be_bytes(),
            src,
            dst,
            interface: 0,
            cookie: [NO_COOKIE, NO_COOKIE],
        },
    };
    let fd = send_request(&request)?;
    // One answer: the socket's message (with its attributes), or an error.
    let mut answer = [0u8; 8192];
    let got = receive(&fd, &mut answer)?;
    parse_answer(&answer[..got])
}

/// One datagram of answers into `buf`; its length.
fn receive(fd: &std::os::fd::OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the buffer is writable for its whole length.
    let got = unsafe {
        libc::recv(
            std::os::fd::AsRawFd::as_raw_fd(fd),
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
        )
    };
    usize::try_from(got).map_err(|_| io::Error::last_os_error())
}

/// Opens a sock_diag socket and sends `request` on it.
fn send_request(request: &Request) -> io::Result<std::os::fd::OwnedFd> {
    // SAFETY: a plain socket(2) call; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // SAFETY: `request` is a live, fully initialised value of the size given.
    let sent = unsafe {
        libc::send(
            raw,
            (request as *const Request).cast(),
            size_of::<Request>(),
            0,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A listening socket on a port, as the kernel lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Listener {
    /// The user that made it.
    pub(crate) uid: u32,
    /// Its inode (`socket:[N]` among a process's descriptors).
    pub(crate) inode: u32,
}

/// Where `struct inet_diag_msg` has `idiag_inode`.
const DIAG_INODE: usize = 68;
/// `TCP_LISTEN` in the kernel's TCP states.
const TCP_LISTEN: u32 = 10;

/// Every TCP socket listening on `port`, on any address of either family: who holds a port
/// this daemon could not bind, to name in its error.
pub(crate) fn tcp_listeners(port: u16) -> io::Result<Vec<Listener>> {
    let mut out = Vec::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        let request = Request {
            header: libc::nlmsghdr {
                nlmsg_len: size_of::<Request>() as u32,
                nlmsg_type: SOCK_DIAG_BY_FAMILY,
                nlmsg_flags: (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16,
                nlmsg_seq: 1,
                nlmsg_pid: 0,
            },
            family: family as u8,
            protocol: libc::IPPROTO_TCP as u8,
            ext: 0,
            pad: 0,
            states: 1 << TCP_LISTEN,
            id: SockId {
                cookie: [NO_COOKIE, NO_COOKIE],
                ..SockId::default()
            },
        };
        let fd = send_request(&request)?;
        let mut buf = vec![0u8; 32 * 1024];
        'dump: loop {
            let got = receive(&fd, &mut buf)?;
            let mut rest = &buf[..got];
            if rest.is_empty() {
                break;
            }
            while rest.len() >= 16 {
                let len = u32_at(rest, 0).ok_or_else(|| not_said("a short answer"))? as usize;
                let kind = u16_at(rest, 4).ok_or_else(|| not_said("a short answer"))?;
                if len < 16 || len > rest.len() {
                    return Err(not_said("a cut answer"));
                }
                match kind {
                    k if k == libc::NLMSG_DONE as u16 => break 'dump,
                    k if k == libc::NLMSG_ERROR as u16 => {
                        return Err(parse_answer(&rest[..len])
                            .err()
                            .unwrap_or_else(|| not_said("an error answer that names no error")));
                    }
                    SOCK_DIAG_BY_FAMILY => {
                        let message = &rest[..len];
                        let sport = message
                            .get(16 + 4..16 + 6)
                            .ok_or_else(|| not_said("a short answer"))?;
                        if u16::from_be_bytes([sport[0], sport[1]]) == port {
                            out.push(Listener {
                                uid: u32_at(message, 16 + DIAG_UID)
                                    .ok_or_else(|| not_said("a short answer"))?,
                                inode: u32_at(message, 16 + DIAG_INODE)
                                    .ok_or_else(|| not_said("a short answer"))?,
                            });
                        }
                    }
                    _ => {}
                }
                rest = &rest[((len + 3) & !3).min(rest.len())..];
            }
        }
    }
    Ok(out)
}

/// A process holding a listening socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The socket's owner.
    pub(crate) uid: u32,
    /// The processes with it among their descriptors: pid, command, cgroup (v2 path); empty
    /// when none is visible from here.
    pub(crate) processes: Vec<(u32, String, String)>,
}

/// Who holds TCP `port` (every listener on it and, from `/proc/*/fd`, its processes): to name
/// in the error of a daemon that could not bind it.
pub(crate) fn port_holders(port: u16) -> io::Result<Vec<Holder>> {
    let listeners = tcp_listeners(port)?;
    let mut out: Vec<Holder> = listeners
        .iter()
        .map(|l| Holder {
            uid: l.uid,
            processes: Vec::new(),
        })
        .collect();
    if out.is_empty() {
        return Ok(out);
    }
    for process in procfs::process::all_processes()
        .map_err(io::Error::other)?
        .flatten()
    {
        let Ok(fds) = process.fd() else {
            continue;
        };
        let held = fds.flatten().find_map(|fd| match fd.target {
            procfs::process::FDTarget::Socket(inode) => {
                listeners.iter().position(|l| u64::from(l.inode) == inode)
            }
            _ => None,
        });
        let Some(at) = held else {
            continue;
        };
        let comm = process.stat().map(|s| s.comm).unwrap_or_default();
        let cgroup = process
            .cgroups()
            .ok()
            .and_then(|c| c.0.into_iter().find(|g| g.hierarchy == 0))
            .map_or_else(|| "?".to_owned(), |g| g.pathname);
        let pid = u32::try_from(process.pid).unwrap_or_default();
        out[at].processes.push((pid, comm, cgroup));
    }
    Ok(out)
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn not_said(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("sock_diag: {what}"))
}

/// Where `struct inet_diag_msg` has `idiag_uid`.
const DIAG_UID: usize = 64;

/// The owner and cgroup id in one netlink answer to [`client_socket`]'s request.
fn parse_answer(b: &[u8]) -> io::Result<ClientSocket> {
    let len = u32_at(b, 0).ok_or_else(|| not_said("a short answer"))? as usize;
    let kind = u16_at(b, 4).ok_or_else(|| not_said("a short answer"))?;
    let message = b.get(..len).ok_or_else(|| not_said("a cut answer"))?;
    if kind == libc::NLMSG_ERROR as u16 {
        let errno = u32_at(message, 16).ok_or_else(|| not_said("a short error"))? as i32;
        return Err(match errno {
            0 => not_said("an empty answer"),
            e => io::Error::from_raw_os_error(-e),
        });
    }
    if kind != SOCK_DIAG_BY_FAMILY {
        return Err(not_said("an answer of another kind"));
    }
    let uid = u32_at(message, 16 + DIAG_UID).ok_or_else(|| not_said("a short answer"))?;
    let mut found = ClientSocket { uid, cgroup: None };
    // Attributes (`struct nlattr`: u16 length, u16 type, value; each 4-aligned).
    let mut at = 16 + DIAG_MSG;
    while at + 4 <= message.len() {
        let attr_len = u16_at(message, at).ok_or_else(|| not_said("a cut attribute"))? as usize;
        let attr_type = u16_at(message, at + 2).ok_or_else(|| not_said("a cut attribute"))?;
        if attr_len < 4 {
            return Err(not_said("a malformed attribute"));
        }
        if attr_type & 0x3fff == INET_DIAG_CGROUP_ID {
            let value = message
                .get(at + 4..at + 12)
                .ok_or_else(|| not_said("a cut cgroup id"))?;
            found.cgroup = Some(u64::from_ne_bytes(
                value.try_into().map_err(|_| not_said("a cut cgroup id"))?,
            ));
            return Ok(found);
        }
        at += (attr_len + 3) & !3;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// This process's cgroup v2 id: the inode of its directory in the v2 hierarchy.
    fn own_cgroup() -> Option<u64> {
        let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
        ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .iter()
            .find_map(|root| {
                let dir = std::path::Path::new(root).join(path.trim_start_matches('/'));
                let m = std::fs::metadata(&dir).ok()?;
                // The v2 root of a hybrid host is `unified`; a v1 directory has other ids.
                (m.ino() > 1 || path == "/").then_some(m.ino())
            })
    }

    #[test]
    fn the_client_end_of_a_loopback_connection_is_in_this_process_cgroup() {
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = std::net::TcpListener::bind(bind) else {
                continue; // no IPv6 loopback here
            };
            let server = listener.local_addr().unwrap();
            let _client = std::net::TcpStream::connect(server).unwrap();
            let (_accepted, peer) = listener.accept().unwrap();
            let id = client_cgroup(server, peer).unwrap();
            assert_eq!(Some(id), own_cgroup(), "{bind}");
            // SAFETY: geteuid has no preconditions.
            let uid = unsafe { libc::geteuid() };
            assert_eq!(client_socket(server, peer).unwrap().uid, uid, "{bind}");
            // A port nobody connected from is no socket.
            let nobody = SocketAddr::new(peer.ip(), peer.port().wrapping_add(1));
            assert!(client_cgroup(server, nobody).is_err(), "{bind}");
        }
    }

    #[test]
    fn the_holder_of_a_listening_port_is_this_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let holders = port_holders(port).unwrap();
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(holders.len(), 1, "{holders:?}");
        assert_eq!(holders[0].uid, uid);
        assert!(
            holders[0]
                .processes
                .iter()
                .any(|(pid, _, _)| *pid == std::process::id()),
            "{holders:?}"
        );
        drop(listener);
        assert!(
            port_holders(port).unwrap().is_empty(),
            "a closed port has no holder"
        );
    }

    #[test]
    fn answers_are_read_within_their_bounds() {
        for cut in [&[][..], &[1, 0, 0, 0][..], &[200, 0, 0, 0, 20, 0, 0, 0][..]] {
            assert!(parse_answer(cut).is_err());
        }
        // An answer whose attributes say nothing of the cgroup: its owner only.
        let mut message = vec![0u8; 16 + DIAG_MSG + 8];
        let len = message.len() as u32;
        message[..4].copy_from_slice(&len.to_ne_bytes());
        message[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        message[16 + DIAG_UID..16 + DIAG_UID + 4].copy_from_slice(&1000u32.to_ne_bytes());
        message[16 + DIAG_MSG..16 + DIAG_MSG + 2].copy_from_slice(&8u16.to_ne_bytes());
        assert_eq!(
            parse_answer(&message).unwrap(),
            ClientSocket {
                uid: 1000,
                cgroup: None
            }
        );
        // The same with a zero-length attribute: refused, not looped on.
        message[16 + DIAG_MSG..16 + DIAG_MSG + 2].copy_from_slice(&0u16.to_ne_bytes());
        assert!(parse_answer(&message).is_err());
    }
}
