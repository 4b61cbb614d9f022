//! Stdio MCP servers the daemon runs for shims inside sessions.
//!
//! Whatever runs inside a session could forge what it reports, so a shim there is only a pipe
//! (`mcp/relay.rs`): it asks here (`POST /api/stdio`, upgraded) and hands over its stdin and
//! stdout; the daemon starts the server — outside the agent's session, as the shim's user, in
//! a cgroup of its own that the kernel layer watches like a session — and runs the same filter
//! the shim runs stand-alone (`mcp/shim.rs`) between the agent's pipes and the server's, with
//! the daemon's policy and event store. A declared stdio
//! server runs its declared command; an undeclared one is refused under
//! `sandbox.mcp.fail_closed` and otherwise runs the command the shim was given.

mod extra_deny;
mod launch;
mod stderr;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::os::fd::AsRawFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};

use super::peer::{Holder, Kind, Place, SocketPeer};
use super::state::DaemonState;
use crate::config::Egress;
use crate::mcp::filter::FilterContext;
use crate::mcp::framing::DEFAULT_MAX_MESSAGE_BYTES;
use crate::mcp::relay::{MAX_REQUEST_BYTES, RunRequest, UPGRADE_PROTOCOL, recv_fds};
use extra_deny::ExtraDeny;
use launch::{sanitize, what_to_run};
use stderr::log_stderr;

/// Most `--deny` patterns a shim may add (each is compiled and kept while its server runs).
const MAX_SHIM_DENY: usize = 64;

/// The process asking, as the socket's peer credentials say.
#[derive(Clone, Copy, Debug)]
pub(super) struct Asker {
    pub uid: u32,
    pub gid: u32,
}

type Body = http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>;

/// `POST /api/stdio`: starts the server and answers 101, then relays until it exits.
pub(super) async fn run(
    state: &Arc<DaemonState>,
    mut req: Request<Incoming>,
    asker: Asker,
    peer: &SocketPeer,
    session: Option<String>,
) -> anyhow::Result<Response<Body>> {
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok());
    anyhow::ensure!(
        upgrade == Some(UPGRADE_PROTOCOL),
        "expected `Upgrade: {UPGRADE_PROTOCOL}` (this route is for `toolwall shim`)"
    );
    let on_upgrade = hyper::upgrade::on(&mut req);
    let (parts, body) = req.into_parts();
    let body = crate::edge::read_body(body, &parts.headers, MAX_REQUEST_BYTES, super::READ_TIMEOUT)
        .await?;
    let request: RunRequest =
        serde_json::from_slice(&body).context("expected a shim's run request")?;
    // Where the asker is now that its request is read (it may take 10 s): a connection handed
    // to another process, whose first owner left and whose session closed, starts nothing.
    let still = match (peer.place(|n| state.server_session(n)), &session) {
        (Place::Session(now), Some(then)) => &now == then,
        (Place::Host, None) => true,
        _ => false,
    };
    anyhow::ensure!(
        still,
        "the process that asked is gone or has moved: connect from the process that asks"
    );
    let launch = what_to_run(state, &request, asker)?;
    // Each running server holds a thread, a cgroup and four pipes.
    let holder = match &session {
        Some(session) => Holder::Session(session.clone()),
        None => Holder::Uid(asker.uid),
    };
    let held = state
        .quotas
        .take(Kind::Server, holder.clone())
        .with_context(|| {
            format!(
                "{holder} runs {} stdio MCP servers already; end one first",
                Kind::Server.limit()
            )
        })?;
    // Compiling is CPU work the asker chooses: bounded in count, and off the API's workers.
    anyhow::ensure!(
        request.deny.len() <= MAX_SHIM_DENY,
        "{} --deny patterns; a shim may give at most {MAX_SHIM_DENY} (put the rest in the daemon's `deny:`)",
        request.deny.len()
    );
    let (inner, deny) = (state.gate.clone(), request.deny.clone());
    let gate = tokio::task::spawn_blocking(move || ExtraDeny::wrap(inner, &deny))
        .await
        .context("compiling the shim's --deny patterns")??;

    // A cgroup of its own, watched by the kernel layer like a session, named after the
    // session it serves.
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let session_name = session
        .clone()
        .unwrap_or_else(|| super::state::HOST.to_owned());
    let cgroup_name = format!(
        "{}-mcp-{}-{}",
        sanitize(&session_name),
        sanitize(&request.server_id),
        RUNS.fetch_add(1, Ordering::Relaxed)
    );
    let (cgroup, generation) = state
        .open_server(
            &cgroup_name,
            &session_name,
            launch
                .egress
                .as_ref()
                .map(|e| (request.server_id.as_str(), e)),
        )
        .with_context(|| format!("a cgroup for MCP server {:?}", request.server_id))?;
    // The server's connections to the LLM proxy are its session's.
    if let (Some(dir), Some(session)) = (&cgroup, &session) {
        state
            .session_keys
            .place(session, dir)
            .with_context(|| format!("the cgroup of MCP server {:?}", request.server_id))?;
    }
    let procs = match &cgroup {
        Some(dir) => Some(
            std::ffi::CString::new(
                dir.join("cgroup.procs")
                    .into_os_string()
                    .into_encoded_bytes(),
            )
            .context("cgroup path")?,
        ),
        None => None,
    };
    let cwd = std::ffi::CString::new(launch.cwd.clone().into_os_string().into_encoded_bytes())
        .context("working directory")?;
    let mut command = tokio::process::Command::new(&launch.program);
    command
        .args(&launch.args)
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls (open, write, close) between fork and exec, on data
    // prepared before the fork. Runs before the confinement below (which makes cgroupfs
    // read-only).
    unsafe {
        command.pre_exec(move || {
            if let Some(procs) = &procs {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
            }
            Ok(())
        });
    }
    // The server runs outside the agent's session, so it is confined as `toolwall exec`
    // confines agents: its own cgroup and mount namespaces (cgroupfs read-only, bpffs
    // hidden), no_new_privs, the dangerous capabilities out of the bounding set, then the
    // user's ids — else a root agent could have an unconfined root process started for it.
    let (uid, gid, groups) = launch.ids.clone();
    if uid == 0 {
        tracing::warn!(
            server = %request.server_id,
            "the server runs as root (its agent does): confined as the agent is, and like the agent able to leave that (root owns the host); run agents as users"
        );
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    crate::exec::confine_on_spawn(
        command.as_std_mut(),
        Some((uid, gid, groups)),
        &crate::exec::SERVER_DROPPED_CAPS,
        if root {
            crate::exec::Pids::OwnAsInit
        } else {
            crate::exec::Pids::Host
        },
        None,
        None,
    )?;
    // The working directory is entered as the server's user, after the ids changed (std's
    // `current_dir` would enter it as root, before them): root must not open for an agent a
    // directory the agent cannot open.
    // SAFETY: chdir is async-signal-safe; the path was prepared before the fork.
    unsafe {
        command.pre_exec(move || {
            if libc::chdir(cwd.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Last: nothing it runs may reach into other processes (`seccomp.rs`).
    crate::seccomp::apply_on_spawn(command.as_std_mut(), crate::seccomp::server_filters()?);
    let ctx = FilterContext {
        gate,
        server_id: request.server_id.clone(),
        server_type: "stdio".to_owned(),
        layer: "shim",
        session_id: session.clone().unwrap_or_default(),
        events: Some(state.sink.clone()),
        approvals: Some(crate::approval::Asker::Local(state.approvals.clone())),
    };
    // The limit is the shim's only below the daemon's own: a larger one is memory the asker
    // would take from the daemon.
    let max_message = request.max_message_bytes.min(DEFAULT_MAX_MESSAGE_BYTES);
    let server = request.server_id.clone();
    // Each server on a thread and runtime of its own: the agent's pipes, the server's and the
    // filter all wake on one thread, as in a stand-alone shim (the daemon's worker threads
    // would hand every message across threads).
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let thread_state = state.clone();
    let thread_cgroup = cgroup_name.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("mcp-{}", sanitize(&server)))
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(error) => {
                    let _ = started_tx.send(Err(anyhow::Error::new(error).context("a runtime")));
                    return;
                }
            };
            // The server is the first process of a PID namespace of its own (made for the
            // children of this thread only): it cannot name, signal or read any process but
            // its own, and they all die with it.
            if root && let Err(error) = crate::exec::own_pid_namespace_for_children() {
                let _ = started_tx.send(Err(anyhow::Error::new(error).context("a PID namespace")));
                return;
            }
            runtime.block_on(async move {
                let mut child = match crate::mcp::shim::spawn_server(&mut command) {
                    Ok(child) => child,
                    Err(error) => {
                        let _ = started_tx.send(Err(error));
                        return;
                    }
                };
                let _ = started_tx.send(Ok(()));
                if let Some(stderr) = child.stderr.take() {
                    tokio::spawn(log_stderr(server.clone(), stderr));
                }
                match relay(on_upgrade, child, ctx, max_message).await {
                    Ok(code) => tracing::info!(%server, code, "stdio MCP server exited"),
                    Err(error) => tracing::warn!(%server, "{error:#}"),
                }
            });
            // What the server left running dies with it.
            thread_state.end_server(&thread_cgroup);
            drop(held);
        });
    let started = match spawned {
        Ok(_) => started_rx
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the server's thread ended at once"))),
        Err(error) => Err(anyhow::Error::new(error).context("a thread for the server")),
    };
    let shown = format!("{} {}", launch.program, launch.args.join(" "));
    if let Err(error) = started {
        let _ = state.close_session(&cgroup_name);
        return Err(error.context(format!(
            "{shown} (as uid {uid}, in {})",
            launch.cwd.display()
        )));
    }
    // Its session began to close (or closed) while it started: the close may not have seen
    // it. It runs now, in its cgroup, so ending it reaches everything it started.
    if let Some(session) = &session
        && !state.still_open(session, generation)
    {
        state.end_server(&cgroup_name);
        anyhow::bail!("session {session:?} closed while its server started; ended");
    }
    tracing::info!(
        server = %request.server_id,
        session = session.as_deref().unwrap_or(""),
        uid,
        cgroup = %cgroup_name,
        declared = launch.declared,
        egress = match &launch.egress {
            None => "the session's rules".to_owned(),
            Some(Egress::Any) => "any".to_owned(),
            Some(Egress::Only(allowed)) if allowed.is_empty() => "nowhere".to_owned(),
            Some(Egress::Only(allowed)) => format!("{} destinations", allowed.len()),
        },
        "started stdio MCP server for a shim: {shown}"
    );
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, UPGRADE_PROTOCOL)
        .body(Full::new(bytes::Bytes::new()).boxed())
        .context("the switching response")
}

/// Takes the shim's stdin and stdout (SCM_RIGHTS, `mcp/relay.rs`), serves the server between
/// them, and tells the shim its exit status.
async fn relay(
    on_upgrade: hyper::upgrade::OnUpgrade,
    child: tokio::process::Child,
    ctx: FilterContext,
    max_message: usize,
) -> anyhow::Result<u8> {
    let upgraded = on_upgrade
        .await
        .context("the shim left before its server started")?;
    let stream = match upgraded.downcast::<TokioIo<tokio::net::UnixStream>>() {
        Ok(parts) if parts.read_buf.is_empty() => parts.io.into_inner(),
        _ => anyhow::bail!("the shim's relay did not start cleanly"),
    };
    // Accepted on the daemon's runtime; this server's runtime watches it from now on.
    let mut stream = tokio::net::UnixStream::from_std(
        stream
            .into_std()
            .context("taking over the shim's connection")?,
    )
    .context("taking over the shim's connection")?;
    let fds = tokio::time::timeout(
        HANDOVER_TIMEOUT,
        stream.async_io(Interest::READABLE, || recv_fds(stream.as_raw_fd())),
    )
    .await
    .context("the shim did not hand over its stdin and stdout in time")?
    .context("receiving the shim's stdin and stdout")?;
    let mut fds = fds.into_iter();
    let (Some(stdin), Some(stdout)) = (fds.next(), fds.next()) else {
        anyhow::bail!("the shim handed over fewer than two descriptors");
    };
    // Read through epoll on this thread: a file or terminal would need a blocking thread,
    // which a thread that made a PID namespace cannot start.
    for fd in [&stdin, &stdout] {
        let file = std::fs::File::from(fd.try_clone().context("the shim's descriptors")?);
        anyhow::ensure!(
            crate::mcp::is_pipe_or_socket(&file),
            "the shim's stdin and stdout must be pipes or sockets (as MCP clients start servers)"
        );
    }
    let serve = crate::mcp::shim::serve_child(
        child,
        ctx,
        crate::mcp::async_reader(stdin),
        crate::mcp::async_writer(stdout),
        max_message,
    );
    // The shim only waits for the exit status from now on: its connection ending (or saying
    // anything) means it is gone, and its server goes with it (else the agent could leave a
    // server running, outside its session, holding the pipes it handed over).
    let mut nothing = [0u8; 1];
    let code = tokio::select! {
        code = serve => code?,
        _ = stream.read(&mut nothing) => {
            anyhow::bail!("the shim went away; its server is ended")
        }
    };
    // The shim may be gone (its agent kept the pipes): nothing to tell then.
    let _ = stream.write_all(&[code]).await;
    Ok(code)
}

/// How long a shim may take to hand over its descriptors after the upgrade.
const HANDOVER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod tests;
