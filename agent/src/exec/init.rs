//! Pid 1 of an agent's PID namespace (`exec/mod.rs`). The agent is not pid 1 itself: the
//! kernel drops every signal pid 1 has no handler for (the `SIGTERM` `toolwall exec` forwards
//! would be lost on most agents), and orphans are handed to pid 1 to reap. This process
//! forwards the one and reaps the other, and exits as the agent did; the kernel then kills
//! whatever the agent left running in the namespace.

use std::sync::atomic::{AtomicI32, Ordering};

/// The agent's pid in the namespace, for the signal handler.
static AGENT: AtomicI32 = AtomicI32::new(0);

/// What `toolwall exec` forwards (`run_child`) and what a supervisor may send.
const FORWARDED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2];

extern "C" fn forward(signal: libc::c_int) {
    let agent = AGENT.load(Ordering::Relaxed);
    if agent > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe { libc::kill(agent, signal) };
    }
}

/// Run between fork and exec by the namespace's first process, after its confinement: forks
/// the agent, which returns `Ok` to go on to its exec, and stays as its init, never returning.
///
/// # Safety
/// Only in a child between fork and exec: it makes async-signal-safe calls only and does not
/// allocate.
pub(super) unsafe fn become_init() -> std::io::Result<()> {
    // SAFETY (all calls below): async-signal-safe system calls on values of this frame.
    let agent = unsafe { libc::fork() };
    if agent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if agent == 0 {
        return Ok(());
    }
    AGENT.store(agent, Ordering::Relaxed);
    unsafe {
        // Not dumpable whatever `fs.suid_dumpable` says: this process carries none of the
        // agent's seccomp filter (installed after the fork), so an agent that could trace it or
        // write its memory could run code here that makes a user namespace.
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = forward as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        for signal in FORWARDED {
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
        // The parent's runtime may have left a handler that writes to a pipe of its own.
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        // Nothing of the parent's stays open here: the spawn's error pipe among them, which
        // would keep `toolwall exec` waiting for an exec that this process never makes.
        libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
        loop {
            let mut status = 0;
            let reaped = libc::waitpid(-1, &mut status, 0);
            if reaped == agent {
                let code = if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else if libc::WIFSIGNALED(status) {
                    128 + libc::WTERMSIG(status)
                } else {
                    1
                };
                libc::_exit(code);
            }
            if reaped < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(1);
            }
        }
    }
}
