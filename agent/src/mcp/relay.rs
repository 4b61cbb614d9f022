//! `toolwall shim` inside a session: the daemon runs the server (so that nothing inside the
//! session writes what the audit records).
//!
//! A shim runs as the agent, inside the agent's session, so whatever it records the agent
//! could forge. Inside a session it therefore judges and records nothing: it asks the daemon
//! (its Unix socket, `POST /api/stdio`, upgraded) to start the server, hands the daemon its
//! stdin and stdout (SCM_RIGHTS), and waits for the server's exit status. The daemon starts the
//! server outside the session and filters and records the JSON-RPC between the agent's pipes
//! and the server's itself (`daemon/stdio.rs`): one process between agent and server, as with
//! a stand-alone shim, so the relay costs no more than the shim did.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::UnixStream;

/// The protocol name of the upgraded stream.
pub(crate) const UPGRADE_PROTOCOL: &str = "toolwall-stdio";
/// The route a shim asks on.
pub(crate) const ROUTE: &str = "/api/stdio";
/// Most bytes of a [`RunRequest`] (its environment included).
pub(crate) const MAX_REQUEST_BYTES: usize = 1 << 20;

/// What a shim asks the daemon to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunRequest {
    /// The server id (`--server-id`, or derived from the command).
    pub server_id: String,
    /// The command the shim was given (a declared server's own command is run instead).
    pub command: Vec<String>,
    /// The shim's environment: the agent's MCP configuration sets the server's there.
    pub env: Vec<(String, String)>,
    /// The shim's working directory.
    pub cwd: PathBuf,
    /// The shim's `--deny` patterns, judged on top of the daemon's policy.
    pub deny: Vec<String>,
    /// The shim's `--max-message-bytes`.
    pub max_message_bytes: usize,
}

/// Asks the daemon on `socket` to run the server and relays stdin/stdout to it until the
/// server's side ends. Exit 0 then; an error when the daemon refuses or cannot be reached.
pub(crate) async fn run(socket: &Path, request: &RunRequest) -> anyhow::Result<ExitCode> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| crate::client::no_daemon_hint(socket))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP handshake with the daemon")?;
    tokio::spawn(async move {
        if let Err(error) = conn.with_upgrades().await {
            tracing::debug!(%error, "relay connection to the daemon ended");
        }
    });
    let body = serde_json::to_vec(request).context("encoding the request to the daemon")?;
    let req = Request::builder()
        .method(Method::POST)
        .uri(ROUTE)
        .header(header::HOST, "toolwall")
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, UPGRADE_PROTOCOL)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .context("building the request to the daemon")?;
    let response = sender
        .send_request(req)
        .await
        .context("asking the daemon to start the MCP server")?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let why = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        anyhow::bail!(
            "the daemon did not start MCP server {:?} ({status}): {why}",
            request.server_id
        );
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .context("switching the daemon connection to the relay")?;
    let mut stream = match upgraded.downcast::<TokioIo<UnixStream>>() {
        Ok(parts) if parts.read_buf.is_empty() => parts.io.into_inner(),
        _ => anyhow::bail!("the daemon's relay did not start cleanly"),
    };
    // The daemon reads our stdin and writes our stdout from now on; we only wait.
    let fds = [std::io::stdin().as_raw_fd(), std::io::stdout().as_raw_fd()];
    stream
        .async_io(Interest::WRITABLE, || send_fds(stream.as_raw_fd(), &fds))
        .await
        .context("handing stdin and stdout to the daemon")?;
    let mut status = [0u8; 1];
    match stream.read(&mut status).await {
        Ok(1) => Ok(ExitCode::from(status[0])),
        Ok(_) => anyhow::bail!(
            "the daemon ended MCP server {:?} without an exit status (did it stop?)",
            request.server_id
        ),
        Err(error) => Err(error).context("waiting for the server's exit status"),
    }
}

/// Most descriptors a relay message carries (stdin and stdout).
const RELAY_FDS: usize = 2;

/// Sends `fds` over a Unix socket with one byte of payload.
fn send_fds(socket: RawFd, fds: &[RawFd]) -> std::io::Result<()> {
    let payload = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    let data_len = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE/CMSG_LEN are arithmetic on a length.
    let (space, len) = unsafe {
        (
            libc::CMSG_SPACE(data_len as u32) as usize,
            libc::CMSG_LEN(data_len as u32) as usize,
        )
    };
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the sendmsg call,
    // and the control buffer is 8-byte aligned and `space` bytes long.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = len as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(cmsg), data_len);
        if libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives the descriptors of one [`send_fds`] message (close-on-exec); refuses a message
/// that carries none, or more than [`RELAY_FDS`].
pub(crate) fn recv_fds(socket: RawFd) -> std::io::Result<Vec<OwnedFd>> {
    let mut payload = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr().cast(),
        iov_len: payload.len(),
    };
    // Room for more than we take, so extra descriptors are received (and closed), not left
    // truncated.
    let room = 8 * std::mem::size_of::<RawFd>();
    // SAFETY: arithmetic on a length.
    let space = unsafe { libc::CMSG_SPACE(room as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut fds = Vec::new();
    // SAFETY: as in `send_fds`; every descriptor the kernel put in the control message is
    // ours (close-on-exec) and owned exactly once below.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let n = libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(std::io::Error::other("descriptors were truncated"));
        }
    }
    if fds.is_empty() || fds.len() > RELAY_FDS {
        return Err(std::io::Error::other(format!(
            "expected {RELAY_FDS} descriptors, got {}",
            fds.len()
        )));
    }
    Ok(fds)
}
