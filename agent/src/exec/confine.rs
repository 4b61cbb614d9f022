//! Who the agent runs as, and what it cannot do there: the user lookup, the dropped
//! capabilities and the confinement applied between fork and exec.

use std::path::PathBuf;

use anyhow::Context;

use super::ExecArgs;
use crate::config::Config;

/// Who the agent runs as, when that is not the caller.
#[derive(Debug)]
pub(crate) struct AgentUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<libc::gid_t>,
    pub home: PathBuf,
}

/// The capabilities no agent keeps, root or not: each could undo the session (detach its
/// programs, move processes out of its cgroup, read the daemon's memory).
pub(crate) const DROPPED_CAPS: [(u32, &str); 6] = [
    (21, "CAP_SYS_ADMIN"),
    (39, "CAP_BPF"),
    (12, "CAP_NET_ADMIN"),
    (38, "CAP_PERFMON"),
    (19, "CAP_SYS_PTRACE"),
    // open_by_handle_at: a file by its handle, from any mount (the host's /tmp under the
    // agent's private one).
    (2, "CAP_DAC_READ_SEARCH"),
];

/// What a stdio server the daemon runs loses besides [`DROPPED_CAPS`]: a root server must not
/// send raw packets past its egress limit, change its ids or load kernel code.
pub(crate) const SERVER_DROPPED_CAPS: [(u32, &str); 8] = [
    (13, "CAP_NET_RAW"),
    (6, "CAP_SETGID"),
    (7, "CAP_SETUID"),
    (16, "CAP_SYS_MODULE"),
    (27, "CAP_MKNOD"),
    (17, "CAP_SYS_RAWIO"),
    (22, "CAP_SYS_BOOT"),
    (25, "CAP_SYS_TIME"),
];

/// The user to run the agent as: none when the caller is not root (it runs as the caller) or
/// asked for root; else `--user`, `SUDO_USER`, `exec.user`, in that order.
pub(super) fn agent_user(args: &ExecArgs, config: &Config) -> anyhow::Result<Option<AgentUser>> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        anyhow::ensure!(
            args.user.is_none(),
            "--user needs root: toolwall exec switches to that user before starting the agent"
        );
        return Ok(None);
    }
    if args.as_root {
        return Ok(None);
    }
    let sudo_user = std::env::var("SUDO_USER")
        .ok()
        .filter(|u| !u.is_empty() && u != "root");
    let Some(name) = args
        .user
        .clone()
        .or(sudo_user)
        .or_else(|| config.exec.user.clone())
    else {
        anyhow::bail!(
            "toolwall exec was started by root and no user to run the agent as is known: an agent running as root can leave its session. Pass --user NAME, set `exec.user` in the configuration, run it through sudo (SUDO_USER), or pass --as-root to run the agent as root anyway"
        );
    };
    let user =
        lookup_user(&name).map_err(|e| anyhow::anyhow!("{e} (--user, SUDO_USER or exec.user)"))?;
    anyhow::ensure!(
        user.uid != 0,
        "user {name:?} is root; pass --as-root to run the agent as root"
    );
    Ok(Some(user))
}

/// The user of that name from the password database, with its groups.
pub(crate) fn lookup_user(name: &str) -> anyhow::Result<AgentUser> {
    use std::ffi::{CStr, CString};
    let c_name = CString::new(name).with_context(|| format!("user name {name:?}"))?;
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwnam_r writes into pwd and buf, both alive for the call.
    let rc = unsafe {
        libc::getpwnam_r(
            c_name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    anyhow::ensure!(
        rc == 0 && !result.is_null(),
        "no user {name:?} on this host"
    );
    // SAFETY: getpwnam_r succeeded, so pw_dir points into buf.
    let home = unsafe { CStr::from_ptr(pwd.pw_dir) }
        .to_string_lossy()
        .into_owned();
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut count = groups.len() as libc::c_int;
    // SAFETY: getgrouplist writes at most `count` entries into groups.
    let rc =
        unsafe { libc::getgrouplist(c_name.as_ptr(), pwd.pw_gid, groups.as_mut_ptr(), &mut count) };
    anyhow::ensure!(rc >= 0, "user {name:?} is in more than 256 groups");
    groups.truncate(count.max(0) as usize);
    Ok(AgentUser {
        name: name.to_owned(),
        uid: pwd.pw_uid,
        gid: pwd.pw_gid,
        groups,
        home: PathBuf::from(home),
    })
}

/// The home directory of `uid` in the password database.
pub(crate) fn home_of(uid: u32) -> Option<PathBuf> {
    passwd_of(uid).map(|(_, home)| home)
}

/// The name of `uid` in the password database.
pub(crate) fn user_name(uid: u32) -> Option<String> {
    passwd_of(uid).map(|(name, _)| name)
}

/// Name and home directory of `uid` in the password database.
fn passwd_of(uid: u32) -> Option<(String, PathBuf)> {
    use std::ffi::CStr;
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r writes into pwd and buf, both alive for the call.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded, so pw_name and pw_dir point into buf.
    let (name, home) = unsafe { (CStr::from_ptr(pwd.pw_name), CStr::from_ptr(pwd.pw_dir)) };
    Some((
        name.to_string_lossy().into_owned(),
        PathBuf::from(home.to_string_lossy().into_owned()),
    ))
}

/// The name of `gid` in the group database.
pub(super) fn group_name(gid: u32) -> Option<String> {
    use std::ffi::CStr;
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 64 * 1024];
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: getgrgid_r writes into grp and buf, both alive for the call.
    let rc = unsafe { libc::getgrgid_r(gid, &mut grp, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() {
        return None;
    }
    // SAFETY: getgrgid_r succeeded, so gr_name points into buf.
    Some(
        unsafe { CStr::from_ptr(grp.gr_name) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Which processes a confined one sees. In a namespace of its own (made by the spawning thread
/// with [`own_pid_namespace_for_children`]; root only) it gets a `/proc` that shows only its
/// namespace: no process outside to trace, signal or write the memory of through
/// `/proc/<pid>/mem` (which no seccomp filter sees), and all of it dies with its pid 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pids {
    /// The host's (not root: no namespaces).
    Host,
    /// Its own, where it is pid 1: a stdio server (`daemon/stdio.rs`), which the daemon stops
    /// with its cgroup.
    OwnAsInit,
    /// Its own, under a pid 1 that forwards signals and reaps (`exec/init.rs`): an agent.
    OwnUnderInit,
}

/// Puts the children this thread starts from now on into a new PID namespace (the first is
/// its pid 1). The thread can start no more threads after it (the kernel refuses threads
/// whose children's namespace differs), so callers make it on a thread of its own.
pub(crate) fn own_pid_namespace_for_children() -> std::io::Result<()> {
    // SAFETY: unshare has no memory preconditions; CLONE_NEWPID affects only the children
    // this thread makes from now on.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Confines the agent between fork and exec, after it entered its cgroup: its own cgroup, IPC
/// and mount namespaces, with every cgroup filesystem read-only and every bpf filesystem hidden in
/// the latter (without nsdelegate, a root agent could otherwise write itself into another
/// cgroup, or open the session's pinned links and detach them; it cannot unmount without
/// CAP_SYS_ADMIN), `no_new_privs`, [`DROPPED_CAPS`]
/// gone from the bounding set (so not even a root agent gets them back at exec), then the
/// user's groups and ids. Every step must succeed, or the agent does not start.
/// Also confines the stdio servers the daemon runs for shims (`daemon/stdio.rs`): a server
/// runs outside the agent's session, so it must not get back what the agent lost. `ids`: the
/// uid, gid and groups to run as. `pids`: see [`Pids`]. `landlock`: a ruleset to restrict the
/// process to (`exec.confine: strict`, [`super::strict`]), applied once `no_new_privs` is set.
/// `private`: the agent's own temporary directories ([`super::private`]; root only).
pub(crate) fn confine_on_spawn(
    cmd: &mut std::process::Command,
    ids: Option<(u32, u32, Vec<libc::gid_t>)>,
    also_dropped: &'static [(u32, &'static str)],
    pids: Pids,
    landlock: Option<std::os::fd::OwnedFd>,
    private: Option<super::private::PrivateDirs>,
) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let (tunables, read_only, mqueues) = if root {
        (kernel_tunables()?, protected_mounts()?, mqueue_mounts()?)
    } else {
        (Vec::new(), Vec::new(), Vec::new())
    };
    // SAFETY: the closure makes only async-signal-safe system calls and does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            let check = |rc: libc::c_int| {
                if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            if root {
                // IPC too: System V objects and POSIX message queues are the host's otherwise.
                check(libc::unshare(
                    libc::CLONE_NEWCGROUP | libc::CLONE_NEWNS | libc::CLONE_NEWIPC,
                ))?;
                // Slave: the host's later mounts still show; ours do not go back.
                check(libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_SLAVE,
                    std::ptr::null(),
                ))?;
                // The host's POSIX message queues through its mqueue mounts (`/dev/mqueue`):
                // each is replaced by the new IPC namespace's own.
                for path in &mqueues {
                    check(libc::mount(
                        c"mqueue".as_ptr(),
                        path.as_ptr(),
                        c"mqueue".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        std::ptr::null(),
                    ))?;
                }
                if pids != Pids::Host {
                    check(libc::mount(
                        c"proc".as_ptr(),
                        c"/proc".as_ptr(),
                        c"proc".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        std::ptr::null(),
                    ))?;
                }
                for (path, flags) in &tunables {
                    check(libc::mount(
                        path.as_ptr(),
                        path.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ))?;
                    check(libc::mount(
                        std::ptr::null(),
                        path.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | flags,
                        std::ptr::null(),
                    ))?;
                }
                for (path, flags, bpf) in &read_only {
                    if *bpf {
                        // Root may open a pinned link by path (no capability needed) and
                        // detach it: the pins are hidden under an empty, read-only tmpfs.
                        check(libc::mount(
                            c"toolwall-hidden".as_ptr(),
                            path.as_ptr(),
                            c"tmpfs".as_ptr(),
                            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                            c"mode=0,size=4k".as_ptr().cast(),
                        ))?;
                    } else {
                        check(libc::mount(
                            std::ptr::null(),
                            path.as_ptr(),
                            std::ptr::null(),
                            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | flags,
                            std::ptr::null(),
                        ))?;
                    }
                }
                if let Some(private) = &private {
                    private.attach()?;
                }
            }
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            if let Some(ruleset) = &landlock {
                let raw = std::os::fd::AsRawFd::as_raw_fd(ruleset);
                if libc::syscall(libc::SYS_landlock_restrict_self, raw, 0u32) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if root {
                check(libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL,
                    0,
                    0,
                    0,
                ))?;
                for &(cap, _) in DROPPED_CAPS.iter().chain(also_dropped) {
                    // EINVAL: a capability this kernel does not know; nothing to drop.
                    if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0
                        && *libc::__errno_location() != libc::EINVAL
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            // Not root, the process can only be who it already is, and setgroups(2) would fail
            // even with its own groups: a daemon run by a user starts that user's servers as is.
            if let Some((uid, gid, groups)) = &ids
                && (root || (*uid, *gid) != (libc::getuid(), libc::getgid()))
            {
                check(libc::setgroups(groups.len(), groups.as_ptr()))?;
                check(libc::setgid(*gid))?;
                check(libc::setuid(*uid))?;
            }
            // Nothing the spawning process holds open passes on (a daemon's or exec's own
            // descriptors, inherited or not yet marked): only stdin, stdout and stderr.
            if libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if root && pids == Pids::OwnUnderInit {
                super::init::become_init()?;
            }
            Ok(())
        });
    }
    Ok(())
}

/// The flags a read-only bind remount of `path`'s mount must keep (a remount sets them all).
fn mount_flags(path: &std::ffi::CStr) -> std::io::Result<libc::c_ulong> {
    // SAFETY: statvfs writes into the zeroed struct; path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut flags = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if st.f_flag & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    Ok(flags)
}

/// The kernel's tunables, made read-only for a confined root process: through them root
/// leaves any confinement (it can set `kernel.core_pattern` to a program of its own, which the
/// kernel then runs as root in the root cgroup). Paths this kernel lacks are left out.
fn kernel_tunables() -> anyhow::Result<Vec<(std::ffi::CString, libc::c_ulong)>> {
    let mut out = Vec::new();
    for path in [c"/proc/sys", c"/proc/sysrq-trigger", c"/sys"] {
        match mount_flags(path) {
            Ok(flags) => out.push((path.to_owned(), flags)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("statvfs {path:?}")),
        }
    }
    Ok(out)
}

/// Every mqueue filesystem mount (`/dev/mqueue` where systemd mounts it).
fn mqueue_mounts() -> anyhow::Result<Vec<std::ffi::CString>> {
    use std::os::unix::ffi::OsStrExt;
    crate::cgroup::mounts_of(&["mqueue"])?
        .into_iter()
        .map(|(_, mount)| {
            std::ffi::CString::new(mount.as_os_str().as_bytes())
                .with_context(|| format!("mount point {}", mount.display()))
        })
        .collect()
}

/// Every cgroup (v1 and v2) and bpf filesystem mount, with the flags a read-only bind remount
/// of it must keep (a remount sets them all), and whether it is a bpf one (to hide).
fn protected_mounts() -> anyhow::Result<Vec<(std::ffi::CString, libc::c_ulong, bool)>> {
    use std::os::unix::ffi::OsStrExt;
    let mut mounts = crate::cgroup::mounts_of(&["bpf", "cgroup2", "cgroup"])?;
    // bpf filesystems first: hidden before the cgroup ones turn read-only.
    mounts.sort_by_key(|(fstype, _)| fstype != "bpf");
    let mut out = Vec::with_capacity(mounts.len());
    for (fstype, mount) in mounts {
        let is_bpf = fstype == "bpf";
        let path = std::ffi::CString::new(mount.as_os_str().as_bytes())
            .with_context(|| format!("mount point {}", mount.display()))?;
        let flags = mount_flags(&path).with_context(|| format!("statvfs {}", mount.display()))?;
        out.push((path, flags, is_bpf));
    }
    Ok(out)
}
