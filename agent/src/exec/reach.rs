//! What the agent's user may do by the mode bits: why it cannot start the agent (the first
//! directory on the way it may not enter, or the file it may not execute), and which listed Unix
//! socket it could put its own in place of; each said with owner and mode and what to do.
//!
//! `exec` started by root runs the agent as another user, and a program under root's home (a
//! build directory, `~/.local/bin`) is out of that user's reach; the kernel's bare "Permission
//! denied" does not say where. This reads only mode bits (ACLs can grant more), so it is asked
//! only once starting the agent has failed.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// The identity the agent runs with.
pub(super) struct Who<'a> {
    pub(super) name: &'a str,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) groups: &'a [libc::gid_t],
}

/// A sentence naming what `who` cannot reach on the way to `program` (looked up in `path_var`
/// when it has no `/`; a relative one from `cwd`), or `None` when the mode bits allow it all.
pub(super) fn explain(
    program: &OsStr,
    path_var: Option<&OsStr>,
    cwd: &Path,
    who: &Who<'_>,
) -> Option<String> {
    let program = Path::new(program);
    let candidates: Vec<PathBuf> = if program.components().count() > 1 || program.is_absolute() {
        vec![program.to_path_buf()]
    } else {
        std::env::split_paths(path_var.unwrap_or_default())
            .map(|dir| dir.join(program))
            .filter(|p| p.exists())
            .collect()
    };
    candidates.iter().find_map(|path| blocked(path, cwd, who))
}

/// What of `path` (an ancestor to search, or the file to execute) `who` is refused. A relative
/// path is looked up from the working directory, which the agent inherits already open: the
/// directories above it do not count, it and those below it do.
fn blocked(path: &Path, cwd: &Path, who: &Who<'_>) -> Option<String> {
    let mut dir = if path.is_absolute() {
        PathBuf::from("/")
    } else {
        cwd.to_path_buf()
    };
    let mut on_the_way = vec![dir.clone()];
    for part in path.parent()?.components() {
        if part != std::path::Component::RootDir {
            dir.push(part);
            on_the_way.push(dir.clone());
        }
    }
    let file = on_the_way.last()?.join(path.file_name()?);
    for dir in on_the_way {
        let meta = std::fs::metadata(&dir).ok()?;
        if !allowed(&meta, who, 0o1) {
            return Some(format!(
                "user {} (uid {}) cannot enter {} ({}), so it cannot start {}: put the agent where {} can reach it (e.g. /usr/local/bin), run it as a user who can reach it, or let others search the directory (chmod o+x {})",
                who.name,
                who.uid,
                dir.display(),
                describe(&meta),
                file.display(),
                who.name,
                dir.display()
            ));
        }
    }
    let meta = std::fs::metadata(&file).ok()?;
    if meta.mode() & 0o111 == 0 {
        return Some(format!(
            "{} is not executable ({}): chmod +x it",
            file.display(),
            describe(&meta)
        ));
    }
    (!allowed(&meta, who, 0o1)).then(|| {
        format!(
            "user {} (uid {}) may not execute {} ({}): let others run it (chmod o+rx) or run the agent as a user who may",
            who.name,
            who.uid,
            file.display(),
            describe(&meta)
        )
    })
}

/// Why `who` could take the place of the listed Unix socket `socket` (`exec.allow_unix`), or
/// `None`. Its directory being writable by `who`, without the sticky bit it could rename the
/// socket and bind its own there; with it, bind the name while the service's socket is missing,
/// or replace a socket of its own. Either way clients outside the session would then connect to
/// the agent.
pub(super) fn squattable(socket: &Path, who: &Who<'_>) -> Option<String> {
    let dir = socket.parent()?;
    let meta = std::fs::metadata(dir).ok()?;
    if !allowed(&meta, who, 0o3) {
        return None;
    }
    let how = if meta.mode() & 0o1000 == 0 {
        "could rename it and bind a socket of its own there"
    } else {
        match std::fs::symlink_metadata(socket) {
            Err(_) => "could bind the name while it is missing",
            Ok(own) if own.uid() == who.uid => "owns it and could bind another in its place",
            Ok(_) => return None,
        }
    };
    Some(format!(
        "exec.allow_unix lists {}, but user {} (uid {}) may write its directory {} ({}) and {how}, so clients outside the session would reach the agent; list sockets in directories only their service can write",
        socket.display(),
        who.name,
        who.uid,
        dir.display(),
        describe(&meta)
    ))
}

/// Whether the mode bits give `who` the `want` bits (1 = x, 2 = w) on a file with `meta`.
fn allowed(meta: &std::fs::Metadata, who: &Who<'_>, want: u32) -> bool {
    if who.uid == 0 {
        return true;
    }
    let mode = meta.mode();
    let bits = if meta.uid() == who.uid {
        mode >> 6
    } else if meta.gid() == who.gid || who.groups.contains(&meta.gid()) {
        mode >> 3
    } else {
        mode
    };
    bits & want == want
}

/// `mode 0700, owner root:root`.
fn describe(meta: &std::fs::Metadata) -> String {
    let name = |uid: u32| super::confine::user_name(uid).unwrap_or_else(|| uid.to_string());
    let group = |gid: u32| super::confine::group_name(gid).unwrap_or_else(|| gid.to_string());
    format!(
        "mode {:04o}, owner {}:{}",
        meta.mode() & 0o7777,
        name(meta.uid()),
        group(meta.gid())
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    const NOBODY: Who<'static> = Who {
        name: "nobody",
        uid: 65534,
        gid: 65534,
        groups: &[],
    };

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_closed_directory_on_the_way_is_named_with_its_owner_and_mode() {
        let top = tempfile::tempdir().unwrap();
        chmod(top.path(), 0o755);
        let closed = top.path().join("home");
        std::fs::create_dir_all(closed.join("bin")).unwrap();
        let agent = closed.join("bin/agent");
        std::fs::write(&agent, "#!/bin/sh\n").unwrap();
        chmod(&agent, 0o755);
        chmod(&closed, 0o700);
        let said = explain(agent.as_os_str(), None, top.path(), &NOBODY).expect("a refusal");
        assert!(
            said.contains(&format!("cannot enter {} (mode 0700", closed.display())),
            "{said}"
        );
        assert!(said.contains("user nobody (uid 65534)"), "{said}");
        assert!(said.contains("chmod o+x"), "{said}");
        // Opened up, nothing is in the way.
        chmod(&closed, 0o711);
        assert_eq!(explain(agent.as_os_str(), None, top.path(), &NOBODY), None);
        // A relative path counts only the directories from the working directory on: here the
        // closed one lies above it, and the agent is reached.
        chmod(&closed, 0o700);
        let relative = explain(OsStr::new("./agent"), None, &closed.join("bin"), &NOBODY);
        assert_eq!(relative, None);
        chmod(&closed, 0o711);
        // A program found through PATH is judged the same way.
        chmod(&agent, 0o700);
        let path_var = closed.join("bin").into_os_string();
        let said =
            explain(OsStr::new("agent"), Some(&path_var), top.path(), &NOBODY).expect("a refusal");
        assert!(said.contains("may not execute"), "{said}");
    }

    #[test]
    fn a_listed_socket_the_agent_could_replace_is_named() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("run");
        std::fs::create_dir(&dir).unwrap();
        let socket = dir.join("service.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        chmod(top.path(), 0o755);
        // Only its service may write the directory: nothing to say.
        chmod(&dir, 0o755);
        assert_eq!(squattable(&socket, &NOBODY), None);
        // Anyone may: the socket can be renamed and replaced.
        chmod(&dir, 0o777);
        let said = squattable(&socket, &NOBODY).expect("a warning");
        assert!(said.contains("could rename it"), "{said}");
        assert!(said.contains("mode 0777"), "{said}");
        // Sticky, with the service's socket there: it cannot be renamed by others.
        chmod(&dir, 0o1777);
        assert_eq!(squattable(&socket, &NOBODY), None);
        // Sticky, with the socket missing: its name can be taken.
        drop(listener);
        std::fs::remove_file(&socket).unwrap();
        let said = squattable(&socket, &NOBODY).expect("a warning");
        assert!(said.contains("while it is missing"), "{said}");
    }
}
