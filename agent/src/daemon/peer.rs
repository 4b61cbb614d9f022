//! Who is on the other end of the API socket, where it runs, and how much of the daemon it may
//! hold (so that no local user reads another's session events, and nothing inside a session
//! writes what the audit records of it).
//!
//! The socket is open to every local user (agents run as other users and their shims ask here
//! for their servers), so what a peer may do rests on where it runs: on the host, in a session,
//! or in the cgroup of a stdio server the daemon runs for a session (`daemon/stdio.rs`). A peer
//! whose place cannot be proven — its process exited and left the connection to a child, or
//! its pid was taken by another process — is not on the host.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// Where a socket peer runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// Outside every toolwall cgroup.
    Host,
    /// Inside the session of that name.
    Session(String),
    /// Inside the cgroup of a stdio server the daemon runs for the session of that name.
    Server { session: String },
    /// Unknown: counts as inside a session that cannot be named.
    Unknown,
}

/// A peer of the Unix socket, as the kernel describes it at `accept`.
#[derive(Debug)]
pub(super) struct SocketPeer {
    pub pid: Option<i32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// SO_PEERPIDFD: proves the pid still names the process that connected.
    pidfd: Option<OwnedFd>,
}

impl SocketPeer {
    pub(super) fn of(stream: &tokio::net::UnixStream) -> Self {
        let cred = stream.peer_cred().ok();
        SocketPeer {
            pid: cred.and_then(|c| c.pid()),
            uid: cred.map(|c| c.uid()),
            gid: cred.map(|c| c.gid()),
            pidfd: peer_pidfd(stream.as_raw_fd()),
        }
    }

    /// Where the peer runs; `server_sessions` maps the cgroups of daemon-run servers to their
    /// sessions.
    pub(super) fn place(&self, server_sessions: impl Fn(&str) -> Option<String>) -> Place {
        let (Some(pid), Some(pidfd)) = (self.pid, &self.pidfd) else {
            return Place::Unknown;
        };
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            return Place::Unknown;
        };
        // Read first, then ask whether the connecting process is still alive: if it is, the
        // pid was its own when the file was read (a pid is not reused while its process lives).
        if !alive(pidfd) {
            return Place::Unknown;
        }
        match crate::cgroup::session_in(&text) {
            None => Place::Host,
            Some(name) => match server_sessions(&name) {
                Some(session) => Place::Server { session },
                None => Place::Session(name),
            },
        }
    }
}

fn peer_pidfd(socket: i32) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_PEERPIDFD writes one int into `fd`; `len` says how much room it has.
    let rc = unsafe {
        libc::getsockopt(
            socket,
            libc::SOL_SOCKET,
            libc::SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &mut len,
        )
    };
    // SAFETY: on success the kernel handed us a new descriptor we own.
    (rc == 0 && fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

fn alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: signal 0 only checks that the process exists; the pidfd is ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    rc == 0
}

/// Caps on what one session's processes (or, where no session can be named, one user's) may
/// hold of the daemon at once (a slow or endless stream of connections from an agent
/// must not take the daemon's descriptors; a root agent can take on any uid, not another
/// session).
pub(super) struct Quotas {
    held: Mutex<HashMap<(Kind, Holder), usize>>,
}

/// Who a quota is counted for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Holder {
    Session(String),
    Uid(u32),
}

impl Holder {
    /// The holder a peer counts as, from where it runs.
    pub(super) fn of(place: &Place, uid: Option<u32>) -> Self {
        match place {
            Place::Session(session) | Place::Server { session } => Holder::Session(session.clone()),
            Place::Host | Place::Unknown => Holder::Uid(uid.unwrap_or(u32::MAX)),
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Session(s) => write!(f, "session {s:?}"),
            Holder::Uid(uid) => write!(f, "uid {uid}"),
        }
    }
}

/// What a quota counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    /// Open socket connections.
    Connection,
    /// Stdio servers running (each holds a thread, a cgroup and its pipes).
    Server,
}

impl Kind {
    /// The most one holder may have at once.
    pub(super) const fn limit(self) -> usize {
        match self {
            Kind::Connection => 64,
            Kind::Server => 32,
        }
    }
}

/// One unit of a quota, given back when dropped.
pub(super) struct Held {
    quotas: Arc<Quotas>,
    key: (Kind, Holder),
}

impl Quotas {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Quotas {
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Takes one unit for `holder`, or `None` when it holds its limit already.
    pub(super) fn take(self: &Arc<Self>, kind: Kind, holder: Holder) -> Option<Held> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry((kind, holder.clone())).or_default();
        if *count >= kind.limit() {
            return None;
        }
        *count += 1;
        Some(Held {
            quotas: self.clone(),
            key: (kind, holder),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.quotas.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_live_peer_is_placed_by_its_cgroup_and_a_gone_one_is_not_on_the_host() {
        let path = std::env::temp_dir().join(format!("toolwall-peer-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let _client = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let peer = SocketPeer::of(&server);
        let expected = match crate::cgroup::session_of("self") {
            None => Place::Host,
            Some(name) => Place::Session(name),
        };
        assert_eq!(peer.place(|_| None), expected);
        if let Some(name) = crate::cgroup::session_of("self") {
            assert_eq!(
                peer.place(|n| (n == name).then(|| "parent".to_owned())),
                Place::Server {
                    session: "parent".into()
                }
            );
        }
        let gone = SocketPeer {
            pid: Some(i32::MAX),
            uid: Some(0),
            gid: Some(0),
            pidfd: None,
        };
        assert_eq!(gone.place(|_| None), Place::Unknown);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_quota_stops_at_its_limit_and_frees_what_is_dropped() {
        let quotas = Quotas::new();
        let s = || Holder::Session("s".into());
        let held: Vec<_> = (0..Kind::Server.limit())
            .map(|_| quotas.take(Kind::Server, s()).expect("under the limit"))
            .collect();
        assert!(quotas.take(Kind::Server, s()).is_none());
        assert!(
            quotas.take(Kind::Server, Holder::Uid(7)).is_some(),
            "another holder"
        );
        assert!(quotas.take(Kind::Connection, s()).is_some(), "another kind");
        drop(held);
        assert!(quotas.take(Kind::Server, s()).is_some());
    }
}
