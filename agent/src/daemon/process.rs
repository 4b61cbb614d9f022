//! How the daemon process meets its host: systemd's readiness protocol, the descriptor limit,
//! the stop signals, and a warning when other processes of an agent's user may trace it.

use anyhow::Context;

/// Tells systemd (when it started the daemon) how the daemon is; a failure is logged, never
/// fatal: the daemon works the same without a supervisor listening.
pub(super) fn notify(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(false, states) {
        tracing::warn!(%error, "could not notify systemd (NOTIFY_SOCKET)");
    }
}

/// Lifts the soft limit on open descriptors to the hard one: every session's proxy connections,
/// shims' pipes and servers hold some, and running out stops the API and the kernel watch.
pub(super) fn raise_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            let soft = limit.rlim_cur;
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                tracing::debug!(
                    from = soft,
                    to = limit.rlim_max,
                    "raised the descriptor limit"
                );
            }
        }
    }
}

/// Resolves on the first SIGINT or SIGTERM.
/// SIGTERM and SIGINT, caught from the moment this is called (before the daemon says it is
/// ready: a supervisor may stop it at once, and must find it stopping cleanly).
pub(super) fn shutdown_signals() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    })
}

/// Sessions are told apart by cgroup (`llm/proxy/sessions.rs`), but a process of an agent's
/// user outside its session can ptrace the agent where Yama allows it: gdb and `pidfd_getfd`
/// can take the agent's connection to the LLM proxy and speak as its session.
pub(super) fn warn_if_ptrace_is_open() {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok();
    if scope.as_deref().map(str::trim).is_none_or(|s| s == "0") {
        tracing::warn!(
            "kernel.yama.ptrace_scope is {}: a process of an agent's user outside its session can trace the agent and act as it; run agents as a user of their own (`toolwall exec --user`) or set kernel.yama.ptrace_scope=1",
            scope.as_deref().map_or("absent (no Yama)", |s| s.trim())
        );
    }
}

/// Warns when one of the daemon's own ports lies in the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`): a port the kernel picks for a `listen()` without `bind()`
/// passes no bind hook, so while the daemon is down a session could land on it by chance.
pub(super) fn warn_if_ephemeral(ports: &[(&str, u16)]) {
    let Ok(range) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") else {
        return;
    };
    let mut bounds = range.split_whitespace().map(str::parse::<u16>);
    let (Some(Ok(low)), Some(Ok(high))) = (bounds.next(), bounds.next()) else {
        return;
    };
    for (what, port) in ports {
        if (low..=high).contains(port) {
            tracing::warn!(
                "{what} listens on port {port}, inside the kernel's ephemeral range {low}-{high} (net.ipv4.ip_local_port_range): a session's listen() without bind() may be given it while the daemon is down; choose a port outside the range"
            );
        }
    }
}
