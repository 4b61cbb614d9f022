//! The kernel layer's objects on bpffs, so that a daemon that dies does not open the gate.
//!
//! A bpf_link held only by a file descriptor detaches when its process dies, so `kill -9` of
//! the daemon would remove every program from every session. Here each
//! session's links are pinned at `<root>/<build>/sessions/<name>/<program>` and the maps at
//! `<root>/<build>/maps/<MAP>`: the programs keep enforcing the last rules while no daemon runs,
//! and the next daemon of the same build loads onto the same maps (rules, counters, the event
//! ring with what it holds) and re-adopts every pinned session.
//!
//! `<build>` is a digest of the embedded object: aya reuses a pinned map by name without
//! checking its layout, so a daemon of another build must never load its programs onto these
//! maps. It takes the other build's sessions over instead (`service/takeover.rs`): its own
//! programs attached first, then the other build's links unpinned and its ring read empty.

use std::{
    fs::File,
    io,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use sha2::{Digest, Sha256};

/// `BPF_FS_MAGIC` from `linux/magic.h`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Why the pin directory could not be used; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The directory is not on a bpf filesystem and none could be mounted for it.
    #[error(
        "{0} is not on a bpf filesystem; mount one (`mount -t bpf bpf /sys/fs/bpf`) or set netmon.pin_dir to a directory under one"
    )]
    NotBpffs(PathBuf),
    /// Another daemon holds the directory.
    #[error("another toolwall daemon uses {0}; stop it, or give this one its own netmon.pin_dir")]
    Busy(PathBuf),
    /// An I/O error on a path.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// Where.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

fn io_err<'p>(action: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> PinError + 'p {
    move |source| PinError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// This build's directory on bpffs, locked for the life of the daemon.
#[derive(Debug)]
pub struct PinDir {
    root: PathBuf,
    build: PathBuf,
    /// `flock`ed: one daemon per directory (two would share and fight over the maps).
    _lock: File,
}

impl PinDir {
    /// Opens (creating) `<root>/<build>`, mounting bpffs at `/sys/fs/bpf` when `root` lies
    /// under it and nothing is mounted there yet.
    pub fn open(root: &Path, object: &[u8]) -> Result<Self, PinError> {
        ensure_bpffs(root)?;
        let build = root.join(build_id(object));
        for dir in [build.join("maps"), build.join("sessions")] {
            std::fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
        }
        let lock = File::open(&build).map_err(io_err("open", &build))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(PinError::Busy(build));
        }
        let pins = PinDir {
            root: root.to_path_buf(),
            build,
            _lock: lock,
        };
        pins.remove_stale_builds();
        Ok(pins)
    }

    /// Removes other builds' pinned maps that nothing uses any more: no daemon holds their
    /// directory and no session is pinned in it (a daemon of another version killed with no
    /// session open). Builds with sessions stay: their programs still enforce.
    fn remove_stale_builds(&self) {
        let Ok(builds) = list_dirs(&self.root) else {
            return;
        };
        for build in builds.into_iter().map(|b| self.root.join(b)) {
            if build == self.build {
                continue;
            }
            let Ok(dir) = File::open(&build) else {
                continue;
            };
            // SAFETY: flock on a descriptor we own; released when `dir` closes.
            let free = unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
            if !free || !list_dirs(&build.join("sessions")).is_ok_and(|s| s.is_empty()) {
                continue;
            }
            if remove_build(&build).is_ok() {
                tracing::info!(build = %build.display(), "removed the unused pins of another toolwall build");
            } else {
                tracing::warn!(build = %build.display(), "could not remove the unused pins of another toolwall build");
            }
        }
    }

    /// Where the maps are pinned (aya's `default_map_pin_directory`).
    pub fn maps(&self) -> PathBuf {
        self.build.join("maps")
    }

    /// Where one session's links are pinned.
    pub fn session(&self, name: &str) -> PathBuf {
        self.build.join("sessions").join(name)
    }

    /// Unpins a session's links and removes its directory (a session whose cgroup is gone).
    pub fn remove_session(&self, name: &str) -> Result<(), PinError> {
        let dir = self.session(name);
        for entry in list_entries(&dir)? {
            let pin = dir.join(entry);
            std::fs::remove_file(&pin).map_err(io_err("unpin", &pin))?;
        }
        std::fs::remove_dir(&dir).map_err(io_err("remove", &dir))
    }

    /// Sessions whose links this build pinned (a daemon before this one may have died).
    pub fn sessions(&self) -> Result<Vec<String>, PinError> {
        list_dirs(&self.build.join("sessions"))
    }

    /// Other builds' pins that hold sessions, each locked when no daemon of that build runs
    /// (so none starts while this one takes its sessions over).
    pub(crate) fn other_builds(&self) -> Vec<OtherBuild> {
        let Ok(builds) = list_dirs(&self.root) else {
            return Vec::new();
        };
        builds
            .into_iter()
            .map(|b| self.root.join(b))
            .filter(|b| {
                *b != self.build && list_dirs(&b.join("sessions")).is_ok_and(|s| !s.is_empty())
            })
            .map(|dir| {
                let lock = File::open(&dir).ok().filter(|f| {
                    // SAFETY: flock on a descriptor we own; released when the file closes.
                    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
                });
                OtherBuild { dir, lock }
            })
            .collect()
    }

    /// Removes the maps' pins once no session is pinned (a clean stop): nothing of toolwall
    /// stays in the kernel. With sessions left, everything stays, and the next daemon adopts it.
    pub fn remove_if_unused(&self) -> Result<bool, PinError> {
        if !self.sessions()?.is_empty() {
            return Ok(false);
        }
        remove_build(&self.build)?;
        // Other builds' pins keep the root; then it stays.
        let _ = std::fs::remove_dir(&self.root);
        Ok(true)
    }
}

/// Another build's pin directory ([`PinDir::other_builds`]).
#[derive(Debug)]
pub(crate) struct OtherBuild {
    dir: PathBuf,
    /// Held while no daemon of that build runs.
    lock: Option<File>,
}

impl OtherBuild {
    /// Its directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether no daemon of that build runs (this one holds its lock).
    pub(crate) fn is_free(&self) -> bool {
        self.lock.is_some()
    }

    /// The sessions pinned there.
    pub(crate) fn sessions(&self) -> Vec<String> {
        list_dirs(&self.dir.join("sessions")).unwrap_or_default()
    }

    /// The pins of one session's links.
    pub(crate) fn links(&self, session: &str) -> Vec<PathBuf> {
        let dir = self.dir.join("sessions").join(session);
        list_entries(&dir)
            .map(|names| names.into_iter().map(|n| dir.join(n)).collect())
            .unwrap_or_default()
    }

    /// Where its event ring is pinned.
    pub(crate) fn ring(&self) -> PathBuf {
        self.dir
            .join("maps")
            .join(agent_common::connect::EVENTS_MAP)
    }

    /// Detaches one session's links at once (whatever else holds them: an unpinned link lives
    /// on, attached, while any descriptor of it is open), unpins them and removes its
    /// directory.
    pub(crate) fn unpin_session(&self, session: &str) -> Result<(), PinError> {
        for pin in self.links(session) {
            if let Err(error) = detach_link(&pin) {
                tracing::warn!(pin = %pin.display(), %error, "could not detach another build's link before unpinning it");
            }
            std::fs::remove_file(&pin).map_err(io_err("unpin", &pin))?;
        }
        let dir = self.dir.join("sessions").join(session);
        std::fs::remove_dir(&dir).map_err(io_err("remove", &dir))
    }

    /// Removes the whole directory once it holds no session (its maps go with the last
    /// reference to them).
    pub(crate) fn remove_if_empty(&self) -> Result<bool, PinError> {
        if !self.sessions().is_empty() {
            return Ok(false);
        }
        remove_build(&self.dir)?;
        Ok(true)
    }
}

/// Unpins a build's maps and removes its directories (its sessions' are empty already).
fn remove_build(build: &Path) -> Result<(), PinError> {
    let maps = build.join("maps");
    for name in list_entries(&maps)? {
        let path = maps.join(name);
        std::fs::remove_file(&path).map_err(io_err("unpin", &path))?;
    }
    for dir in [maps, build.join("sessions"), build.to_path_buf()] {
        std::fs::remove_dir(&dir).map_err(io_err("remove", &dir))?;
    }
    Ok(())
}

/// Detaches the pinned link at `pin` (`BPF_LINK_DETACH`): its program stops running at once,
/// though the link object stays until its last reference goes.
fn detach_link(pin: &Path) -> io::Result<()> {
    const BPF_LINK_DETACH: libc::c_long = 34;
    let fd = obj_get(pin)?;
    // union bpf_attr, BPF_LINK_DETACH: { u32 link_fd; }
    let mut attr = [0u64; 16];
    attr[0] = u64::from(fd.as_raw_fd() as u32);
    bpf(BPF_LINK_DETACH, &mut attr).map(drop)
}

/// A descriptor of the object pinned at `pin` (`BPF_OBJ_GET`).
fn obj_get(pin: &Path) -> io::Result<std::os::fd::OwnedFd> {
    const BPF_OBJ_GET: libc::c_long = 7;
    let path = std::ffi::CString::new(pin.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // union bpf_attr, BPF_OBJ_GET: { u64 pathname; u32 bpf_fd; u32 file_flags; s32 path_fd; }
    let mut attr = [0u64; 16];
    attr[0] = path.as_ptr() as u64;
    let fd = bpf(BPF_OBJ_GET, &mut attr)?;
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

/// The id of the cgroup a pinned cgroup link is attached to; 0 once it was detached (by
/// `bpftool link detach`, say). aya 0.14 does not expose the link's cgroup, so this asks the
/// kernel directly: `BPF_OBJ_GET` on the pin, then `BPF_OBJ_GET_INFO_BY_FD`.
pub(crate) fn link_cgroup(pin: &Path) -> io::Result<u64> {
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    let fd = obj_get(pin)?;
    // struct bpf_link_info: u32 type, id, prog_id; then (8-aligned, at byte 16) for a cgroup
    // link { u64 cgroup_id; u32 attach_type; }.
    let mut info = [0u64; 32];
    let mut attr = [0u64; 16];
    attr[0] = u64::from(fd.as_raw_fd() as u32) | ((std::mem::size_of_val(&info) as u64) << 32);
    attr[1] = info.as_mut_ptr() as u64;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info[2])
}

/// bpf(2) with `attr` (a zeroed `union bpf_attr` as large as the kernel reads, whatever
/// pointers it holds valid for the call).
fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> io::Result<libc::c_long> {
    // SAFETY: attr is as large as the size passed; the caller vouches for its pointers.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), size_of_val(attr)) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

/// A short digest of the eBPF object: pins of one build never meet another's maps.
pub fn build_id(object: &[u8]) -> String {
    let digest = Sha256::digest(object);
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn list_entries(dir: &Path) -> Result<Vec<String>, PinError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err("read", dir))? {
        let entry = entry.map_err(io_err("read", dir))?;
        out.push(entry.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    Ok(out)
}

fn list_dirs(dir: &Path) -> Result<Vec<String>, PinError> {
    Ok(list_entries(dir)?
        .into_iter()
        .filter(|n| dir.join(n).is_dir())
        .collect())
}

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills the zeroed struct; c is a valid C string.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statfs(c.as_ptr(), &mut fs) == 0 && fs.f_type as i64 == BPF_FS_MAGIC }
}

/// The nearest existing ancestor of `root` must be on bpffs; `/sys/fs/bpf` is mounted when
/// missing, as systemd does on most distributions (this VM's kernel boots without it).
fn ensure_bpffs(root: &Path) -> Result<(), PinError> {
    let existing = root
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    if is_bpffs(existing) {
        return Ok(());
    }
    let standard = Path::new("/sys/fs/bpf");
    if root.starts_with(standard) && !is_bpffs(standard) {
        std::fs::create_dir_all(standard).map_err(io_err("create", standard))?;
        // SAFETY: constant C strings; mount(2) copies them.
        let rc = unsafe {
            libc::mount(
                c"bpf".as_ptr(),
                c"/sys/fs/bpf".as_ptr(),
                c"bpf".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(io_err("mount bpffs on", standard)(
                io::Error::last_os_error(),
            ));
        }
        tracing::info!("mounted a bpf filesystem on /sys/fs/bpf for toolwall's pins");
        return Ok(());
    }
    Err(PinError::NotBpffs(root.to_path_buf()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn builds_are_told_apart_by_their_object() {
        let a = super::build_id(b"object a");
        assert_eq!(a.len(), 16);
        assert_eq!(a, super::build_id(b"object a"));
        assert_ne!(a, super::build_id(b"object b"));
    }

    #[test]
    fn a_directory_off_bpffs_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().expect("temp dir");
        let error = super::PinDir::open(&dir.path().join("pins"), b"x").unwrap_err();
        assert!(error.to_string().contains("mount -t bpf"), "{error}");
    }
}
