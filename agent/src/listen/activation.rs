//! Listening sockets handed in by systemd (socket activation: `toolwall.socket` for the daemon,
//! a socket unit of the user's for `toolwall mcp-proxy`): systemd holds the TCP ports while the
//! process restarts, so there is never a moment when a port is free for another process to
//! bind (an agent's session is refused that bind by the kernel anyway; another local process is
//! not). A passed socket is used for the setting whose address it is bound to; one that no
//! setting names, or that is not a listening TCP socket, stops the process with what to fix,
//! rather than being ignored or guessed at (`tests/tests/activation.rs`).

use std::{
    net::{SocketAddr, TcpListener},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use anyhow::Context;

/// The sockets systemd passed, not yet taken by a setting.
#[derive(Debug)]
pub(crate) struct Activated {
    listeners: Vec<(SocketAddr, TcpListener)>,
    /// The settings a passed socket may stand for, for the errors (`proxy.listen or
    /// api.listen`).
    settings: &'static str,
}

impl Activated {
    /// Takes the descriptors systemd passed this process (`LISTEN_PID`, `LISTEN_FDS`), and
    /// unsets those variables so that no process the daemon starts sees them: call it before
    /// any thread starts. `settings` names the addresses a socket may be passed for.
    pub(crate) fn from_env(settings: &'static str) -> anyhow::Result<Activated> {
        let for_someone = std::env::var_os("LISTEN_FDS").is_some();
        let fds: Vec<_> = sd_notify::listen_fds()
            .context("read the sockets systemd passed (LISTEN_FDS)")?
            .collect();
        if for_someone && fds.is_empty() {
            tracing::warn!(
                "LISTEN_FDS is set but LISTEN_PID does not name this process: the sockets it counts are not this process's, and are not used"
            );
        }
        let mut listeners = Vec::new();
        for fd in fds {
            // SAFETY: systemd passed this descriptor to this process (LISTEN_PID), and nothing
            // else in it owns the descriptor.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            anyhow::ensure!(
                is_tcp_listener(&owned),
                "descriptor {fd} that systemd passed is not a listening TCP socket; the socket unit may hold only ListenStream= addresses of {settings}"
            );
            let listener = TcpListener::from(owned);
            let addr = listener
                .local_addr()
                .with_context(|| format!("the address of descriptor {fd} systemd passed"))?;
            listener
                .set_nonblocking(true)
                .with_context(|| format!("make the socket on {addr} non-blocking"))?;
            listeners.push((addr, listener));
        }
        Ok(Activated {
            listeners,
            settings,
        })
    }

    /// The passed listener bound to exactly `addr` (the address of `setting`), if any. A
    /// passed socket on the same port at another address is an error that names both: this
    /// process could not bind `addr` beside it, and would otherwise report itself as the
    /// port's holder.
    pub(crate) fn take(
        &mut self,
        addr: SocketAddr,
        setting: &str,
    ) -> anyhow::Result<Option<TcpListener>> {
        if let Some(at) = self.listeners.iter().position(|(a, _)| *a == addr) {
            tracing::info!(%addr, "listening on the socket systemd holds");
            return Ok(Some(self.listeners.swap_remove(at).1));
        }
        if let Some((passed, _)) = self
            .listeners
            .iter()
            .find(|(a, _)| a.port() == addr.port() && addr.port() != 0)
        {
            anyhow::bail!(
                "systemd passed a socket on {passed}, but {setting} is {addr}; make the socket unit's ListenStream= and {setting} the same address"
            );
        }
        Ok(None)
    }

    /// Fails naming each passed socket no setting took: the socket unit and the configuration
    /// disagree, and a port systemd holds would go unserved.
    pub(crate) fn finish(self) -> anyhow::Result<()> {
        let left: Vec<String> = self
            .listeners
            .iter()
            .map(|(addr, _)| addr.to_string())
            .collect();
        anyhow::ensure!(
            left.is_empty(),
            "systemd passed sockets on {} that are not the address of {}; make the socket unit's ListenStream= lines and the configuration name the same addresses",
            left.join(", "),
            self.settings
        );
        Ok(())
    }
}

/// Whether `fd` is a stream socket of the IPv4 or IPv6 family that listens.
fn is_tcp_listener(fd: &OwnedFd) -> bool {
    let option = |name: libc::c_int| -> Option<libc::c_int> {
        let mut value: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `value`.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                name,
                (&raw mut value).cast(),
                &mut len,
            )
        };
        (rc == 0).then_some(value)
    };
    option(libc::SO_TYPE) == Some(libc::SOCK_STREAM)
        && matches!(
            option(libc::SO_DOMAIN),
            Some(libc::AF_INET | libc::AF_INET6)
        )
        && option(libc::SO_ACCEPTCONN) == Some(1)
}
