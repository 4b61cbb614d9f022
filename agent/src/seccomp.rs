//! The system calls a stdio server the daemon runs may not make (otherwise a server limited
//! to no egress can attach gdb to a process of its user outside every toolwall cgroup and send
//! from there, and leave a process there that its kill never reaches), and those an agent may
//! not make: a user namespace of its own would let it mount or chroot so that a Unix socket
//! name the kernel programs let through resolves to another socket (`tests/tests/session_unix.rs`).
//!
//! Refused with EPERM: reaching into other processes (`ptrace`, `process_vm_readv`/`writev`,
//! `pidfd_getfd`), joining a namespace another process made (`setns`: an agent could pass one
//! over a socket) and making a user namespace (`unshare`/`clone` with `CLONE_NEWUSER`; `clone3`,
//! whose flags a filter cannot read, answers ENOSYS so libc falls back to `clone`). What a
//! process of the same user can still do through `/proc/<pid>/mem` no filter can see: a server
//! declared with a `user:` of its own shares a uid with nothing else.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// A server's filters, built before the fork (building allocates; installing does not).
pub(crate) fn server_filters() -> anyhow::Result<Vec<BpfProgram>> {
    filters(&[
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
    ])
}

/// An agent's filters: no user namespace, made or joined. Tracing stays (its own children are
/// all its PID namespace shows it).
pub(crate) fn agent_filters() -> anyhow::Result<Vec<BpfProgram>> {
    filters(&[])
}

/// Refuses `also` and every way to a user namespace.
fn filters(also: &[i64]) -> anyhow::Result<Vec<BpfProgram>> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| anyhow::anyhow!("seccomp on {}: {e}", std::env::consts::ARCH))?;
    let new_user = || -> anyhow::Result<SeccompRule> {
        Ok(SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(libc::CLONE_NEWUSER as u64),
            libc::CLONE_NEWUSER as u64,
        )?])?)
    };
    // A namespace another process made (a user namespace passed over a socket) would give
    // back what `unshare` below refuses.
    let mut refused: BTreeMap<i64, Vec<SeccompRule>> = also
        .iter()
        .copied()
        .chain([libc::SYS_setns])
        .map(|nr| (nr, Vec::new()))
        .collect();
    refused.insert(libc::SYS_unshare, vec![new_user()?]);
    refused.insert(libc::SYS_clone, vec![new_user()?]);
    let eperm = SeccompFilter::new(
        refused,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;
    let enosys = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;
    Ok(vec![eperm.try_into()?, enosys.try_into()?])
}

/// Installs `filters` in the child between fork and exec, as its last step.
pub(crate) fn apply_on_spawn(cmd: &mut std::process::Command, filters: Vec<BpfProgram>) {
    use std::os::unix::process::CommandExt;
    // SAFETY: installing a prebuilt filter is a prctl and a seccomp call on memory prepared
    // before the fork; the error path only reads errno.
    unsafe {
        cmd.pre_exec(move || {
            for filter in &filters {
                seccompiler::apply_filter(filter).map_err(|e| match e {
                    seccompiler::Error::Seccomp(io) | seccompiler::Error::Prctl(io) => io,
                    _ => std::io::Error::from_raw_os_error(libc::EINVAL),
                })?;
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_filtered_child_cannot_trace_or_make_a_user_namespace() {
        let filters = super::server_filters().expect("filters");
        let mut cmd = std::process::Command::new("/usr/bin/python3");
        cmd.args([
            "-c",
            "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nfor name, call in [('ptrace', lambda: libc.ptrace(16, os.getppid(), 0, 0)), ('unshare', lambda: libc.unshare(0x10000000))]:\n    rc = call()\n    print(name, rc, ctypes.get_errno())\n",
        ]);
        super::apply_on_spawn(&mut cmd, filters);
        let out = cmd.output().expect("python3");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("ptrace -1 1\n"), "{text}");
        assert!(text.contains("unshare -1 1\n"), "{text}");
    }
}
