//! Private temporary directories for an agent: in its own mount namespace, `/tmp`, `/var/tmp`,
//! `/dev/shm`, `/run/lock` and its user's `/run/user/<uid>` are empty tmpfs of its own (of at
//! most `exec.tmp_size_mib`), so nothing it leaves there reaches the host's processes (a
//! socket, a script another user's job runs, a file a service reads) and nothing of the host's
//! there reaches it (a forwarder's socket, a runtime directory's keys, another session's
//! files). A working directory inside one of them is kept: the host's directory is mounted at
//! the same path in the private one; so are the API socket's directory and the Unix sockets
//! `exec.allow_unix` lists, each by itself (`tests/tests/session_private.rs`).
//!
//! The file systems are made and the working directory's tree is copied here, before the fork
//! (with the new mount API, as detached mounts), so that `exec.confine: strict` can grant
//! writes below them ([`super::strict::ruleset`]) and the child only has to attach them.

use std::{
    ffi::CString,
    os::{
        fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::{ffi::OsStrExt, fs::MetadataExt},
    },
    path::{Path, PathBuf},
};

use anyhow::Context;

/// The temporary directories every user may write, made private.
const SHARED: [&str; 5] = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock"];

/// What [`PrivateDirs::attach`] mounts, made before the fork (the child may not allocate).
pub(crate) struct PrivateDirs {
    /// Each directory and its new file system, detached.
    mounts: Vec<(CString, OwnedFd)>,
    /// What the agent needs of the host's under them, outermost first.
    kept: Vec<Kept>,
    /// The working directory, to enter anew once they are attached (the process still stands
    /// in the host's directory until it does).
    cwd: Option<CString>,
    /// What the session's banner should say besides the directories: what was not made
    /// private or not kept, and why.
    pub(crate) notes: Vec<String>,
}

/// A path of the host's kept under a private directory: its copy, detached, the directories to
/// make above it in the private one, and whether it is a directory (else a file is made to
/// mount it on).
struct Kept {
    path: CString,
    parents: Vec<CString>,
    tree: OwnedFd,
    is_dir: bool,
}

impl PrivateDirs {
    /// Makes them for an agent of `uid`/`gid` started in `cwd`, each at most `size_mib`. Kept
    /// where they lie under one: `cwd`; the directory of `api_socket` (the daemon refuses one
    /// others may write), or the socket itself when that directory is a private one; each of
    /// `listed` (`exec.allow_unix`) that is a socket now, by itself (its directory may hold
    /// what is not the agent's). Every kept path is opened without following a symbolic link,
    /// so one swapped in meanwhile is refused, not followed. Root only (the caller's mount
    /// namespace is the host's, so nothing is mounted here).
    pub(crate) fn make(
        cwd: &Path,
        api_socket: &Path,
        listed: &[PathBuf],
        (uid, gid): (u32, u32),
        size_mib: u64,
    ) -> anyhow::Result<PrivateDirs> {
        let cwd = cwd
            .canonicalize()
            .with_context(|| format!("the working directory {}", cwd.display()))?;
        // The path must name the directory exec stands in: a link on its way while it was
        // resolved would have the agent kept in (or standing under) another directory.
        let here = std::fs::metadata(".").context("the working directory")?;
        let (_, there) =
            open_path(&cwd).with_context(|| format!("the working directory {}", cwd.display()))?;
        anyhow::ensure!(
            (here.dev(), here.ino()) == (there.st_dev, there.st_ino),
            "the working directory {} changed while exec started (a symbolic link on its way?); start exec again from the directory itself",
            cwd.display()
        );
        let mut notes = Vec::new();
        let mut dirs: Vec<(PathBuf, String)> = SHARED
            .iter()
            .map(|d| (PathBuf::from(d), "1777".to_owned()))
            .collect();
        // Made private when the host has it (a login user's), else left absent.
        dirs.push((PathBuf::from(format!("/run/user/{uid}")), "0700".to_owned()));
        // A symbolic link to another of them (`/var/tmp -> /tmp`, `/var/lock -> /run/lock`) is
        // covered by its target; one to anywhere else is said.
        let targets: Vec<PathBuf> = dirs.iter().map(|(d, _)| d.clone()).collect();
        dirs.retain(|(d, _)| {
            if !d.is_symlink() {
                return d.is_dir();
            }
            if let Ok(target) = d.canonicalize()
                && !targets.contains(&target)
            {
                notes.push(format!(
                    "{} is a link to {}, which stays the host's",
                    d.display(),
                    target.display()
                ));
            }
            false
        });
        let roots: Vec<&Path> = dirs.iter().map(|(d, _)| d.as_path()).collect();
        let under_root = |p: &Path| roots.iter().any(|r| p.starts_with(r));
        let mut wanted = vec![cwd.clone()];
        if let Some(dir) = api_socket.parent().and_then(|d| d.canonicalize().ok()) {
            wanted.push(if roots.contains(&dir.as_path()) {
                dir.join(api_socket.file_name().unwrap_or_default())
            } else {
                dir
            });
        }
        for socket in listed.iter().filter(|p| under_root(p)) {
            use std::os::unix::fs::FileTypeExt;
            let why = match std::fs::symlink_metadata(socket) {
                Err(_) => Some("it does not exist yet"),
                Ok(meta) if !meta.file_type().is_socket() => Some("it is not a socket"),
                Ok(_) if socket.canonicalize().ok().as_deref() != Some(socket.as_path()) => {
                    Some("its path holds a symbolic link")
                }
                Ok(_) => None,
            };
            match why {
                None => {
                    notes.push(format!(
                        "exec.allow_unix {} is kept in the agent's private directory as the socket it is now: if its service makes it anew (a restart), the agent cannot reach the new one; list sockets outside /tmp, /var/tmp, /dev/shm and /run/user",
                        socket.display()
                    ));
                    wanted.push(socket.clone());
                }
                Some(why) => notes.push(format!(
                    "exec.allow_unix {} is not kept in the agent's private directory: {why}",
                    socket.display()
                )),
            }
        }
        let mut kept = Vec::new();
        for (dir, path) in to_keep(&roots, wanted.into_iter()) {
            let (tree, is_dir) = open_tree(&path)
                .with_context(|| format!("keep {} for the agent", path.display()))?;
            kept.push(Kept {
                path: c_path(&path)?,
                parents: parents_below(&path, &dir)
                    .iter()
                    .map(|p| c_path(p))
                    .collect::<anyhow::Result<_>>()?,
                tree,
                is_dir,
            });
        }
        if roots.contains(&cwd.as_path()) {
            notes.push(format!(
                "the working directory {} is the agent's private one: empty, and what the agent writes there is gone when it ends",
                cwd.display()
            ));
        }
        // Entered anew in the child in every case: it still stands in the host's directory,
        // which a private one may cover.
        let cwd = Some(c_path(&cwd)?);
        let mut mounts = Vec::with_capacity(dirs.len());
        for (dir, mode) in dirs {
            let owner = dir.starts_with("/run/user").then_some((uid, gid));
            let fs = tmpfs(&mode, owner, size_mib)
                .with_context(|| format!("make a private {} (tmpfs)", dir.display()))?;
            mounts.push((c_path(&dir)?, fs));
        }
        Ok(PrivateDirs {
            mounts,
            kept,
            cwd,
            notes,
        })
    }

    /// The new file systems' roots, for `exec.confine: strict`'s write rules (the host's
    /// directories they cover are out of the agent's reach anyway).
    pub(crate) fn roots(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.mounts
            .iter()
            .map(|(_, fd)| std::os::fd::AsFd::as_fd(fd))
    }

    /// Whether `dir` is one of the directories made private.
    pub(crate) fn is_root(&self, dir: &Path) -> bool {
        self.mounts
            .iter()
            .any(|(path, _)| path.as_bytes() == dir.as_os_str().as_bytes())
    }

    /// The directories made private, for the session's banner.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &std::ffi::CStr> {
        self.mounts.iter().map(|(path, _)| path.as_c_str())
    }

    /// Attaches them. Runs in the child between fork and exec, in its own mount namespace
    /// (after the root was made a slave, so nothing goes back to the host): system calls only,
    /// no allocation.
    pub(crate) fn attach(&self) -> std::io::Result<()> {
        for (path, fs) in &self.mounts {
            move_mount(fs.as_raw_fd(), path)?;
        }
        for kept in &self.kept {
            for dir in kept.parents.iter().chain(kept.is_dir.then_some(&kept.path)) {
                // SAFETY: mkdir(2) with a valid path; one that exists is fine.
                if unsafe { libc::mkdir(dir.as_ptr(), 0o755) } != 0
                    && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if !kept.is_dir {
                // SAFETY: open(2) with a valid path; the descriptor is closed at once.
                let fd = unsafe {
                    libc::open(
                        kept.path.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o600,
                    )
                };
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // SAFETY: fd was just opened here.
                unsafe { libc::close(fd) };
            }
            move_mount(kept.tree.as_raw_fd(), &kept.path)?;
            // The copy is a peer of the host's mount: a slave, so nothing mounted under it in
            // here goes back.
            // SAFETY: mount(2) changing the propagation of a mount point just attached.
            let rc = unsafe {
                libc::mount(
                    std::ptr::null(),
                    kept.path.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_SLAVE,
                    std::ptr::null(),
                )
            };
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if let Some(cwd) = &self.cwd {
            // SAFETY: chdir(2) with a valid path.
            if unsafe { libc::chdir(cwd.as_ptr()) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// What to keep of `wanted`, outermost first, with the private directory (of `roots`) it lies
/// in: what lies strictly under one, and not under another kept (which brings it along).
fn to_keep(roots: &[&Path], wanted: impl Iterator<Item = PathBuf>) -> Vec<(PathBuf, PathBuf)> {
    let mut wanted: Vec<(PathBuf, PathBuf)> = wanted
        .filter_map(|p| {
            let root = roots.iter().find(|r| p.starts_with(r) && p != **r)?;
            Some((root.to_path_buf(), p))
        })
        .collect();
    wanted.sort_by_key(|(_, p)| p.components().count());
    let mut kept: Vec<(PathBuf, PathBuf)> = Vec::new();
    for (root, path) in wanted {
        if !kept.iter().any(|(_, k)| path.starts_with(k)) {
            kept.push((root, path));
        }
    }
    kept
}

/// The directories strictly between `dir` and `cwd`, outermost first.
fn parents_below(cwd: &Path, dir: &Path) -> Vec<PathBuf> {
    let mut parents: Vec<PathBuf> = cwd
        .ancestors()
        .skip(1)
        .take_while(|p| p.starts_with(dir) && *p != dir)
        .map(Path::to_path_buf)
        .collect();
    parents.reverse();
    parents
}

fn c_path(path: &Path) -> anyhow::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| anyhow::anyhow!("{} holds a NUL byte", path.display()))
}

fn fd_of(rc: libc::c_long) -> std::io::Result<OwnedFd> {
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the system call returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as libc::c_int) })
}

/// A detached tmpfs of `mode` (and `owner`) of at most `size_mib`, not setuid, no devices.
fn tmpfs(mode: &str, owner: Option<(u32, u32)>, size_mib: u64) -> std::io::Result<OwnedFd> {
    // SAFETY: fsopen with a NUL-terminated name.
    let context =
        fd_of(unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), libc::FSOPEN_CLOEXEC) })?;
    let set = |key: &std::ffi::CStr, value: &str| -> std::io::Result<()> {
        let value = CString::new(value).map_err(std::io::Error::other)?;
        // SAFETY: fsconfig with NUL-terminated key and value on the context just opened.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                context.as_raw_fd(),
                libc::FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    set(c"source", "toolwall-private")?;
    set(c"mode", mode)?;
    set(c"size", &format!("{size_mib}m"))?;
    if let Some((uid, gid)) = owner {
        set(c"uid", &uid.to_string())?;
        set(c"gid", &gid.to_string())?;
    }
    // SAFETY: fsconfig's create command takes no key or value.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            libc::FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fsmount of the created context.
    fd_of(unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            context.as_raw_fd(),
            libc::FSMOUNT_CLOEXEC,
            libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        )
    })
}

/// A detached copy of the mount tree at `path`, and whether it is a directory.
fn open_tree(path: &Path) -> anyhow::Result<(OwnedFd, bool)> {
    let (at, st) = open_path(path)?;
    // SAFETY: open_tree of the descriptor itself (an empty path).
    let tree = fd_of(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            at.as_raw_fd(),
            c"".as_ptr(),
            libc::OPEN_TREE_CLONE
                | libc::OPEN_TREE_CLOEXEC
                | libc::AT_EMPTY_PATH as libc::c_uint
                | libc::AT_RECURSIVE as libc::c_uint,
        )
    })
    .context("copy its mount tree")?;
    Ok((tree, st.st_mode & libc::S_IFMT == libc::S_IFDIR))
}

/// `path` opened `O_PATH`, and its status. No component of `path` may be a symbolic link (it
/// is canonical when chosen; one swapped in since is refused, never followed).
fn open_path(path: &Path) -> anyhow::Result<(OwnedFd, libc::stat)> {
    let c = c_path(path)?;
    // struct open_how { u64 flags; u64 mode; u64 resolve; } (libc's is non-exhaustive).
    let how: [u64; 3] = [
        (libc::O_PATH | libc::O_CLOEXEC) as u64,
        0,
        libc::RESOLVE_NO_SYMLINKS,
    ];
    // SAFETY: openat2 with a NUL-terminated path and an open_how of the size passed.
    let at = fd_of(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c.as_ptr(),
            how.as_ptr(),
            size_of_val(&how),
        )
    })
    .context("open it (without following a symbolic link)")?;
    // SAFETY: fstat into a zeroed struct of a descriptor we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(at.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error()).context("stat it");
    }
    Ok((at, st))
}

/// Attaches the detached mount `fd` at `path`.
fn move_mount(fd: libc::c_int, path: &std::ffi::CStr) -> std::io::Result<()> {
    // SAFETY: move_mount of a detached mount onto a NUL-terminated path.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd,
            c"".as_ptr(),
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directories_above_a_working_directory_are_made_outermost_first() {
        let parents = parents_below(Path::new("/tmp/a/b/project"), Path::new("/tmp"));
        assert_eq!(
            parents,
            [PathBuf::from("/tmp/a"), PathBuf::from("/tmp/a/b")],
            "made in this order before the working directory is mounted"
        );
        assert!(parents_below(Path::new("/tmp/project"), Path::new("/tmp")).is_empty());
        assert!(parents_below(Path::new("/tmp"), Path::new("/tmp")).is_empty());
    }

    #[test]
    fn only_what_lies_under_a_private_directory_is_kept_and_only_once() {
        let roots = [Path::new("/tmp"), Path::new("/dev/shm")];
        let kept = to_keep(
            &roots,
            [
                "/tmp/project/sockets", // under the working directory: comes with it
                "/tmp/project",
                "/tmp",         // the private directory itself: nothing to keep
                "/srv/project", // not under one
                "/tmpfoo/x",    // a sibling by name only
                "/dev/shm/s.sock",
            ]
            .into_iter()
            .map(PathBuf::from),
        );
        let kept: Vec<(&str, &str)> = kept
            .iter()
            .map(|(r, p)| (r.to_str().unwrap(), p.to_str().unwrap()))
            .collect();
        assert_eq!(
            kept,
            [("/tmp", "/tmp/project"), ("/dev/shm", "/dev/shm/s.sock")]
        );
    }
}
