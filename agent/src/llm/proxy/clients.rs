//! Client connections counted per client, so one client cannot take the proxy's global
//! connection cap from the others. A client is the user and cgroup that made the connecting
//! socket, as the kernel says (`sockdiag.rs`): each agent session has a cgroup of its own, and
//! another user's processes are another client. A connection whose client the kernel does not
//! name is counted under one "unknown" client: never unlimited.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// Who a connection comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum ClientKey {
    /// The socket's owner and cgroup (`None` where the kernel does not say).
    Known { uid: u32, cgroup: Option<u64> },
    /// The kernel did not say.
    Unknown,
}

impl ClientKey {
    /// The client at the other end of a connection accepted at `local` from `peer`, and the
    /// cgroup the session rules read (or why it is not known).
    pub(super) fn of(
        local: std::io::Result<SocketAddr>,
        peer: SocketAddr,
    ) -> (ClientKey, Result<u64, String>) {
        let socket = local
            .and_then(|local| crate::sockdiag::client_socket(local, peer))
            .map_err(|e| e.to_string());
        match socket {
            Ok(s) => (
                ClientKey::Known {
                    uid: s.uid,
                    cgroup: s.cgroup,
                },
                s.cgroup.ok_or_else(|| {
                    "the kernel does not say a socket's cgroup (no CONFIG_SOCK_CGROUP_DATA)".into()
                }),
            ),
            Err(why) => {
                tracing::debug!(%peer, "cannot tell which client a connection comes from: {why}");
                (ClientKey::Unknown, Err(why))
            }
        }
    }
}

#[derive(Default)]
struct Count {
    open: usize,
    /// What the client's exchanges hold of the memory budget (`budget.rs`).
    bytes: super::budget::ClientBytes,
    /// Its last connection was refused (a warning was logged for this burst).
    refusing: bool,
}

/// Open connections by client, each at most `limit`.
pub(super) struct Clients {
    limit: usize,
    open: Mutex<HashMap<ClientKey, Count>>,
}

/// One admitted connection; its client's count goes down when dropped.
pub(super) struct Admitted {
    clients: Arc<Clients>,
    key: ClientKey,
    bytes: super::budget::ClientBytes,
}

impl Admitted {
    /// What the client holds of the memory budget, shared by all its connections.
    pub(super) fn bytes(&self) -> super::budget::ClientBytes {
        self.bytes.clone()
    }
}

impl Clients {
    pub(super) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Clients {
            limit,
            open: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ClientKey, Count>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a new connection of `key`'s, or refuses it (`None`: close it) when that client
    /// has `limit` open; the first refusal of a burst is logged.
    pub(super) fn admit(self: &Arc<Self>, key: ClientKey) -> Option<Admitted> {
        let mut open = self.lock();
        let count = open.entry(key).or_default();
        if count.open >= self.limit {
            if !count.refusing {
                count.refusing = true;
                tracing::warn!(
                    client = ?key,
                    "LLM proxy: this client has {} connections open (proxy.max_connections_per_client); refusing its new ones until some close",
                    self.limit
                );
            }
            return None;
        }
        count.open += 1;
        count.refusing = false;
        Some(Admitted {
            clients: self.clone(),
            key,
            bytes: count.bytes.clone(),
        })
    }

    #[cfg(test)]
    fn open(&self, key: ClientKey) -> usize {
        self.lock().get(&key).map_or(0, |c| c.open)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.clients.lock();
        if let Some(count) = open.get_mut(&self.key) {
            count.open = count.open.saturating_sub(1);
            if count.open == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ClientKey = ClientKey::Known {
        uid: 1000,
        cgroup: Some(7),
    };
    const B: ClientKey = ClientKey::Known {
        uid: 1000,
        cgroup: Some(8),
    };

    #[test]
    fn a_client_at_its_cap_is_refused_and_others_are_not() {
        let clients = Clients::new(2);
        let a1 = clients.admit(A).expect("first");
        let _a2 = clients.admit(A).expect("second");
        assert!(clients.admit(A).is_none(), "past the cap");
        assert!(clients.admit(A).is_none(), "still");
        let _b = clients.admit(B).expect("another client is not affected");
        let _u = clients
            .admit(ClientKey::Unknown)
            .expect("unknown counts too");
        drop(a1);
        assert_eq!(clients.open(A), 1);
        let _a3 = clients.admit(A).expect("room again once one closed");
    }

    #[test]
    fn unknown_clients_share_one_cap() {
        let clients = Clients::new(1);
        let _u = clients.admit(ClientKey::Unknown).expect("first");
        assert!(clients.admit(ClientKey::Unknown).is_none());
    }

    #[test]
    fn a_client_with_nothing_open_is_forgotten() {
        let clients = Clients::new(4);
        drop(clients.admit(A));
        assert!(clients.lock().is_empty());
    }

    #[test]
    fn a_loopback_client_is_named_by_its_user_and_cgroup() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let server = listener.local_addr().expect("addr");
        let _client = std::net::TcpStream::connect(server).expect("connect");
        let (accepted, peer) = listener.accept().expect("accept");
        let (key, _) = ClientKey::of(accepted.local_addr(), peer);
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        assert!(
            matches!(key, ClientKey::Known { uid: u, .. } if u == uid),
            "{key:?}"
        );
        // A connection the kernel does not know: unknown, not unlimited.
        let gone = SocketAddr::new(peer.ip(), peer.port().wrapping_add(1));
        assert_eq!(ClientKey::of(Ok(server), gone).0, ClientKey::Unknown);
    }
}
