//! cgroup v2 plumbing: where the unified hierarchy is mounted, and session directories in it.
//!
//! The kernel programs attach to a session's cgroup directory, so everything an agent starts
//! (children included) is covered, and nothing outside it is.

use std::{
    fs,
    io::{self, BufRead},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use thiserror::Error;

/// Why a cgroup operation failed; each says what to check.
#[derive(Debug, Error)]
pub enum CgroupError {
    /// No cgroup2 line in mountinfo.
    #[error(
        "no cgroup v2 hierarchy is mounted (no `cgroup2` entry in /proc/self/mountinfo); mount one with `mount -t cgroup2 none /sys/fs/cgroup/unified`"
    )]
    NoCgroup2,
    /// An I/O error, with the path it happened on.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A session name that would escape the toolwall directory.
    #[error(
        "invalid session name {0:?}: use letters, digits, '-', '_' and '.', at most 64 characters"
    )]
    BadSessionName(String),
}

fn io_err<'p>(action: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> CgroupError + 'p {
    move |source| CgroupError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// The mount point of the cgroup v2 hierarchy (`/sys/fs/cgroup` on unified hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones), read from `/proc/self/mountinfo`.
pub fn cgroup2_mount() -> Result<PathBuf, CgroupError> {
    let path = Path::new("/proc/self/mountinfo");
    let file = fs::File::open(path).map_err(io_err("open", path))?;
    for line in io::BufReader::new(file).lines() {
        let line = line.map_err(io_err("read", path))?;
        if let Some(mount) = parse_mountinfo_cgroup2(&line) {
            return Ok(mount);
        }
    }
    Err(CgroupError::NoCgroup2)
}

/// Every mount whose filesystem type is one of `types` (`/proc/self/mountinfo`): its type and
/// mount point.
pub(crate) fn mounts_of(types: &[&str]) -> Result<Vec<(String, PathBuf)>, CgroupError> {
    let path = Path::new("/proc/self/mountinfo");
    let file = fs::File::open(path).map_err(io_err("open", path))?;
    let mut found = Vec::new();
    for line in io::BufReader::new(file).lines() {
        let line = line.map_err(io_err("read", path))?;
        if let Some((fstype, mount)) = parse_mountinfo(&line)
            && types.contains(&fstype)
        {
            found.push((fstype.to_owned(), mount));
        }
    }
    Ok(found)
}

/// The mount point of a mountinfo line whose filesystem type is `cgroup2`, if it is one.
fn parse_mountinfo_cgroup2(line: &str) -> Option<PathBuf> {
    parse_mountinfo(line)
        .filter(|(fstype, _)| *fstype == "cgroup2")
        .map(|(_, mount)| mount)
}

/// A mountinfo line's filesystem type and mount point.
///
/// Format (proc(5)): `id parent major:minor root mountpoint options [optional...] - fstype ...`.
fn parse_mountinfo(line: &str) -> Option<(&str, PathBuf)> {
    let (left, right) = line.split_once(" - ")?;
    let fstype = right.split_whitespace().next()?;
    let mount = left.split_whitespace().nth(4)?;
    Some((fstype, PathBuf::from(unescape_mountinfo(mount))))
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = u32::from(bytes[i + 1] - b'0') * 64
                + u32::from(bytes[i + 2] - b'0') * 8
                + u32::from(bytes[i + 3] - b'0');
            out.push(v as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The session a process runs in, read from its cgroup v2 path (`0::/toolwall/<name>` in
/// `/proc/<pid>/cgroup`; `pid` may be `self`). The kernel's record, so it holds whatever the
/// agent did to its environment: Codex CLI, for one, starts MCP servers with a scrubbed
/// environment, and the shim still knows its session.
pub(crate) fn session_of(pid: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    session_in(&text)
}

/// The session named in the text of a `/proc/<pid>/cgroup` file.
pub(crate) fn session_in(text: &str) -> Option<String> {
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let (_, rest) = path.split_once("/toolwall/")?;
    let name = rest.split('/').next()?;
    (!name.is_empty()).then(|| name.to_owned())
}

/// The cgroup v2 path of a live process (`pid` may be `self`), `None` when it is gone.
pub(crate) fn cgroup_path_of(pid: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_owned)
}

/// The session of this process: its cgroup's, else `TOOLWALL_SESSION` (set by `toolwall
/// exec`), else empty.
pub(crate) fn current_session() -> String {
    session_of("self")
        .or_else(|| std::env::var("TOOLWALL_SESSION").ok())
        .unwrap_or_default()
}

/// A cgroup v2 directory made for one agent session, `<cgroup2>/toolwall/<name>`.
#[derive(Debug)]
pub struct SessionCgroup {
    path: PathBuf,
}

impl SessionCgroup {
    /// Creates (or reuses) `<cgroup2>/toolwall/<name>`.
    pub fn create(name: &str) -> Result<Self, CgroupError> {
        Self::create_under(&cgroup2_mount()?, name)
    }

    /// Creates (or reuses) `<root>/toolwall/<name>`; `root` must be a cgroup2 directory.
    pub fn create_under(root: &Path, name: &str) -> Result<Self, CgroupError> {
        validate_session_name(name)?;
        let path = root.join("toolwall").join(name);
        fs::create_dir_all(&path).map_err(io_err("create cgroup", &path))?;
        Ok(Self { path })
    }

    /// An existing cgroup directory (one the daemon made for a session).
    pub fn at(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
        }
    }

    /// The cgroup directory (what the kernel programs attach to).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cgroup id the kernel reports for tasks in it (the directory's inode number).
    pub fn id(&self) -> Result<u64, CgroupError> {
        let meta = fs::metadata(&self.path).map_err(io_err("stat", &self.path))?;
        Ok(meta.ino())
    }

    /// Moves a process (and so all it forks from now on) into this cgroup.
    pub fn add_process(&self, pid: u32) -> Result<(), CgroupError> {
        let procs = self.path.join("cgroup.procs");
        fs::write(&procs, pid.to_string()).map_err(io_err("write", &procs))
    }

    /// Makes `cmd` start inside this cgroup: the child moves itself in between fork and exec,
    /// so not one instruction of the program runs outside it.
    ///
    /// Returns the open `cgroup.procs` file; keep it alive until the command is spawned.
    pub fn enter_on_spawn(&self, cmd: &mut std::process::Command) -> Result<fs::File, CgroupError> {
        use std::os::{fd::AsRawFd, unix::process::CommandExt};
        let procs = self.path.join("cgroup.procs");
        // Opened before the fork (O_CLOEXEC by default in std), so the child only has to write:
        // allocation-free, async-signal-safe.
        let file = fs::OpenOptions::new()
            .write(true)
            .open(&procs)
            .map_err(io_err("open", &procs))?;
        let fd = file.as_raw_fd();
        // SAFETY: the closure only calls write(2), which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                // "0" means "the writing process".
                if libc::write(fd, b"0".as_ptr().cast(), 1) == 1 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            });
        }
        Ok(file)
    }

    /// Process ids currently in the cgroup.
    pub fn processes(&self) -> Result<Vec<u32>, CgroupError> {
        let procs = self.path.join("cgroup.procs");
        let text = fs::read_to_string(&procs).map_err(io_err("read", &procs))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Process ids in the cgroup and every cgroup below it (a root agent can make some).
    pub fn all_processes(&self) -> Result<Vec<u32>, CgroupError> {
        let mut out = Vec::new();
        let mut dirs = vec![self.path.clone()];
        while let Some(dir) = dirs.pop() {
            let procs = dir.join("cgroup.procs");
            let text = fs::read_to_string(&procs).map_err(io_err("read", &procs))?;
            out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            for entry in fs::read_dir(&dir).map_err(io_err("read", &dir))? {
                let entry = entry.map_err(io_err("read", &dir))?;
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(entry.path());
                }
            }
        }
        Ok(out)
    }

    /// Sends SIGKILL to every process in the cgroup and below it (`cgroup.kill`, Linux 5.14):
    /// what a stdio server left behind must not outlive it.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        let kill = self.path.join("cgroup.kill");
        fs::write(&kill, b"1").map_err(io_err("write", &kill))
    }

    /// Removes the directory if no process is left in it; returns whether it was removed.
    pub fn remove_if_empty(&self) -> Result<bool, CgroupError> {
        if !self.all_processes()?.is_empty() {
            return Ok(false);
        }
        match fs::remove_dir(&self.path) {
            Ok(()) => Ok(true),
            // A process joined between the check and the rmdir: keep the directory.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
            Err(e) => Err(io_err("remove cgroup", &self.path)(e)),
        }
    }
}

pub(crate) fn validate_session_name(name: &str) -> Result<(), CgroupError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(CgroupError::BadSessionName(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_session_is_read_from_the_cgroup_v2_line() {
        let hybrid = "12:pids:/user.slice\n1:name=systemd:/user.slice\n0::/toolwall/s1\n";
        assert_eq!(super::session_in(hybrid).as_deref(), Some("s1"));
        assert_eq!(
            super::session_in("0::/system.slice/toolwall/agent-7/sub\n").as_deref(),
            Some("agent-7")
        );
        for none in [
            "0::/user.slice\n",
            "0::/toolwall/\n",
            "1:cpu:/toolwall/x\n",
            "",
        ] {
            assert_eq!(super::session_in(none), None, "{none:?}");
        }
    }

    use super::*;

    #[test]
    fn finds_cgroup2_on_hybrid_and_unified_hosts() {
        let hybrid = "35 25 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate";
        assert_eq!(
            parse_mountinfo_cgroup2(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let v1 = "36 25 0:31 / /sys/fs/cgroup/cpu rw,nosuid shared:11 - cgroup cgroup rw,cpu";
        assert_eq!(parse_mountinfo_cgroup2(v1), None);
        let escaped = "35 25 0:30 / /mnt/my\\040cg rw - cgroup2 none rw";
        assert_eq!(
            parse_mountinfo_cgroup2(escaped),
            Some(PathBuf::from("/mnt/my cg"))
        );
    }

    #[test]
    fn session_names_cannot_escape() {
        for bad in ["", "..", ".", "a/b", "../x", "a b", &"x".repeat(65)] {
            assert!(validate_session_name(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["s1", "claude-2026.11.22_a"] {
            assert!(validate_session_name(good).is_ok(), "{good:?} refused");
        }
    }
}
