//! Where a demo puts what it makes, and the removal, at the next demo's start, of what a demo
//! that was killed (SIGKILL: none of its guards ran) left.
//!
//! A demo `<pid>` makes `toolwall-demo-<pid>-<suffix>` in the temporary directory and in
//! [`PIN_ROOT`], and its session `demo-<suffix>`. Each of the two directories is found on its
//! own: pins whose directory was removed by hand, or made under another `TMPDIR`, would
//! otherwise stay until the machine restarts (`tests/tests/demo.rs` kills a demo and checks that
//! the next one removes both).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::daemon::{end_session, remove_pins};

/// Where the daemons of demos pin their programs.
const PIN_ROOT: &str = "/sys/fs/bpf";
/// How a demo's directories begin: `toolwall-demo-<pid>-<suffix>`.
pub(super) const PREFIX: &str = "toolwall-demo-";

/// The random part of a demo directory's name.
pub(super) fn suffix_of(dir: &Path) -> Option<String> {
    name_parts(dir).map(|(_, suffix)| suffix)
}

/// The pin directory of demo `pid`.
pub(super) fn pin_dir(pid: u32, suffix: &str) -> PathBuf {
    Path::new(PIN_ROOT).join(format!("{PREFIX}{pid}-{suffix}"))
}

/// `<cgroup2>/toolwall/<session>`, where the daemon makes the session's cgroup (root only).
pub(super) fn session_cgroup(session: &str) -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    crate::cgroup::cgroup2_mount()
        .ok()
        .map(|mount| mount.join("toolwall").join(session))
}

/// `(pid, suffix)` of a name `toolwall-demo-<pid>-<suffix>`.
fn name_parts(path: &Path) -> Option<(u32, String)> {
    let name = path.file_name()?.to_str()?;
    let (pid, suffix) = name.strip_prefix(PREFIX)?.split_once('-')?;
    Some((pid.parse().ok()?, suffix.to_owned()))
}

/// Removes what killed demos left: their directories, their pins and their sessions' cgroups.
/// Only a demo's whose process is gone, and only directories this user owns.
pub(super) fn sweep() {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut left: BTreeMap<(u32, String), Vec<PathBuf>> = BTreeMap::new();
    for root in [std::env::temp_dir(), PathBuf::from(PIN_ROOT)] {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        for path in entries.filter_map(Result::ok).map(|e| e.path()) {
            let Some((pid, suffix)) = name_parts(&path) else {
                continue;
            };
            let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == me);
            if ours && !Path::new(&format!("/proc/{pid}")).exists() {
                left.entry((pid, suffix)).or_default().push(path);
            }
        }
    }
    for ((pid, suffix), paths) in left {
        if let Some(cgroup) = session_cgroup(&format!("demo-{suffix}")) {
            end_session(&cgroup);
            let _ = std::fs::remove_dir(&cgroup);
        }
        let mut removed = Vec::new();
        for path in paths {
            let outcome = if path.starts_with(PIN_ROOT) {
                remove_pins(&path);
                Ok(())
            } else {
                std::fs::remove_dir_all(&path)
            };
            match outcome {
                Ok(()) if !path.exists() => removed.push(path.display().to_string()),
                Ok(()) => {}
                Err(error) => eprintln!("demo: could not remove {}: {error}", path.display()),
            }
        }
        if !removed.is_empty() {
            println!(
                "demo: removed what an earlier demo (pid {pid}, killed) left: {}",
                removed.join(", ")
            );
        }
    }
}
