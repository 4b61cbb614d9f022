//! Where the database and the API socket live when the configuration does not say.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The database used by root when `store.path` is not set (system-wide, survives users).
pub(crate) const ROOT_STORE_PATH: &str = "/var/lib/toolwall/events.db";

/// The database path: `store.path` if set; for root `/var/lib/toolwall/events.db`; otherwise
/// `$XDG_DATA_HOME/toolwall/events.db`, else `$HOME/.local/share/toolwall/events.db`, else
/// `./toolwall-events.db` (no home at all, e.g. a bare container).
pub(crate) fn default_store_path(configured: Option<&Path>) -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let is_root = unsafe { libc::geteuid() } == 0;
    store_path_from(
        configured,
        is_root,
        std::env::var_os("XDG_DATA_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
    )
}

/// [`default_store_path`] with its inputs explicit, so each rule can be tested.
pub(crate) fn store_path_from(
    configured: Option<&Path>,
    is_root: bool,
    xdg_data_home: Option<PathBuf>,
    home: Option<PathBuf>,
) -> PathBuf {
    if let Some(path) = configured {
        return path.to_path_buf();
    }
    if is_root {
        return PathBuf::from(ROOT_STORE_PATH);
    }
    // XDG says relative values are invalid and must be ignored.
    if let Some(xdg) = xdg_data_home.filter(|p| p.is_absolute()) {
        return xdg.join("toolwall").join("events.db");
    }
    if let Some(home) = home.filter(|p| p.is_absolute()) {
        return home.join(".local/share/toolwall/events.db");
    }
    PathBuf::from("toolwall-events.db")
}

/// The API socket: `api.socket`, else `/run/toolwall/api.sock` for root, else
/// `$XDG_RUNTIME_DIR/toolwall/api.sock`, else `/tmp/toolwall-<uid>/api.sock`. The default
/// directories are toolwall's own and must be private (see [`prepare_socket_dir`]): a socket
/// path another local user can predict and pre-create would let them impersonate the daemon
/// or catch its clients.
pub(crate) fn socket_path(configured: Option<&Path>) -> PathBuf {
    if let Some(path) = configured {
        return path.to_path_buf();
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        return PathBuf::from("/run/toolwall/api.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("toolwall/api.sock"),
        None => PathBuf::from(format!("/tmp/toolwall-{uid}/api.sock")),
    }
}

/// [`socket_path`], with the default directory checked before use: it must be a real
/// directory (not a symlink) owned by the current user that nobody else can write to; a
/// directory of ours with read/search bits for others is tightened to 0711 (others may reach the socket in it, not list or write). With `create`
/// (the daemon) it is created with mode 0711 when missing; without (clients) a missing one is
/// fine (no daemon runs). The directory of a configured `api.socket` is the administrator's
/// choice, but the daemon still checks it (see [`ensure_configured_dir`]).
pub(crate) fn prepare_socket_dir(
    configured: Option<&Path>,
    create: bool,
) -> anyhow::Result<PathBuf> {
    let socket = socket_path(configured);
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    match (configured, socket.parent()) {
        (None, Some(dir)) => ensure_private_dir(dir, create, uid)?,
        (Some(_), Some(dir)) if create => {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            ensure_configured_dir(dir, uid)?
        }
        _ => {}
    }
    Ok(socket)
}

/// Makes sure the directory of a configured `api.socket` is one only the daemon's user (or
/// root) can change: whoever can write to it can rename the live socket and bind their own in
/// its place (a directory owned by `nobody` was accepted), catching every client. Missing
/// directories are created 0711 (others may reach the socket, not list or write); an existing
/// one's mode is left as it is (it may be `/run`).
fn ensure_configured_dir(dir: &Path, uid: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(e)
                .with_context(|| format!("create {}, the directory of api.socket", dir.display()));
        }
    }
    // Followed if a symlink (`/var/run`): what matters is who can write where the socket is.
    let meta = std::fs::metadata(dir)
        .with_context(|| format!("inspect {}, the directory of api.socket", dir.display()))?;
    let fix = "set `api.socket` to a path in a directory owned by the daemon's user (or root) that no one else can write to, e.g. /run/toolwall/api.sock";
    anyhow::ensure!(
        meta.file_type().is_dir(),
        "{}, the directory of api.socket, is not a directory; {fix}",
        dir.display()
    );
    anyhow::ensure!(
        meta.uid() == uid || meta.uid() == 0,
        "{}, the directory of api.socket, is owned by uid {}, not by the daemon's user (uid {uid}) or root: its owner could rename the live socket and bind their own in its place; {fix}",
        dir.display(),
        meta.uid()
    );
    let mode = meta.mode() & 0o7777;
    anyhow::ensure!(
        mode & 0o022 == 0,
        "{}, the directory of api.socket, has mode {mode:04o}: others can write to it (and replace the API socket, sticky bit or not); {fix}, or `chmod go-w` it",
        dir.display()
    );
    // And the way to it (a parent owned by another user lets them move the checked directory
    // aside and make their own; so does a symlink of theirs in `/tmp`), as written and as
    // resolved.
    check_way(dir, uid, fix)?;
    let resolved = std::fs::canonicalize(dir)
        .with_context(|| format!("resolve {}, the directory of api.socket", dir.display()))?;
    check_way(&resolved, uid, fix)
}

/// Every component of `dir` (not followed) is owned by root or `uid`, and a directory others
/// may write to has the sticky bit (they can then rename only what they own, and the next
/// component is not theirs).
fn check_way(dir: &Path, uid: u32, fix: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let absolute =
        std::path::absolute(dir).with_context(|| format!("make {} absolute", dir.display()))?;
    for way in absolute.ancestors() {
        let meta = std::fs::symlink_metadata(way)
            .with_context(|| format!("inspect {} on the way to api.socket", way.display()))?;
        anyhow::ensure!(
            meta.uid() == uid || meta.uid() == 0,
            "{}, on the way to api.socket, is owned by uid {}: its owner could put another directory (or link) in its place and catch the API socket; {fix}",
            way.display(),
            meta.uid()
        );
        let mode = meta.mode() & 0o7777;
        anyhow::ensure!(
            !meta.is_dir() || mode & 0o022 == 0 || mode & 0o1000 != 0,
            "{}, on the way to api.socket, has mode {mode:04o}: others can rename what is in it; {fix}",
            way.display()
        );
    }
    Ok(())
}

/// Makes sure `dir` is a private directory of user `uid` (see [`prepare_socket_dir`]).
fn ensure_private_dir(dir: &Path, create: bool, uid: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if create {
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(dir)
        {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("create {}", dir.display())),
        }
    }
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("inspect {}", dir.display())),
    };
    let fix = "remove it (as its owner or root), or set `api.socket` in the configuration to a \
               path in a directory only you can write to";
    anyhow::ensure!(
        meta.file_type().is_dir(),
        "{} is not a directory (a symlink or a file): another user may have put it there to \
         catch toolwall's API socket; {fix}",
        dir.display()
    );
    anyhow::ensure!(
        meta.uid() == uid,
        "{} is owned by uid {}, not by you (uid {uid}): another user may have created it to \
         catch toolwall's API socket; {fix}",
        dir.display(),
        meta.uid()
    );
    let mode = meta.mode() & 0o7777;
    anyhow::ensure!(
        mode & 0o022 == 0,
        "{} has mode {mode:04o}: others can write to it (and replace the API socket); it must \
         be 0711; {fix}, or `chmod 711` it if it is really yours",
        dir.display()
    );
    if mode & 0o066 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
            .with_context(|| format!("restrict {} to its owner (mode 0711)", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (store.path, is root, $XDG_DATA_HOME, $HOME, expected).
    type Case<'a> = (
        Option<&'a Path>,
        bool,
        Option<PathBuf>,
        Option<PathBuf>,
        &'a str,
    );

    #[test]
    fn store_path_precedence() {
        let xdg = Some(PathBuf::from("/x"));
        let home = Some(PathBuf::from("/h"));
        let cases: [Case<'_>; 6] = [
            (
                Some(Path::new("/c/db")),
                true,
                xdg.clone(),
                home.clone(),
                "/c/db",
            ),
            (None, true, xdg.clone(), home.clone(), ROOT_STORE_PATH),
            (
                None,
                false,
                xdg.clone(),
                home.clone(),
                "/x/toolwall/events.db",
            ),
            (
                None,
                false,
                Some(PathBuf::from("rel")),
                home.clone(),
                "/h/.local/share/toolwall/events.db",
            ),
            (
                None,
                false,
                None,
                home,
                "/h/.local/share/toolwall/events.db",
            ),
            (None, false, None, None, "toolwall-events.db"),
        ];
        for (configured, root, xdg, home, want) in cases {
            assert_eq!(
                store_path_from(configured, root, xdg, home),
                PathBuf::from(want)
            );
        }
    }

    #[test]
    fn the_default_socket_directory_must_be_private_and_ours() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let base = tempfile::tempdir().expect("tempdir");
        let me = std::fs::metadata(base.path()).expect("stat").uid();
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").mode() & 0o7777;

        // Missing: created 0711 by the daemon; a client only notes there is none.
        let dir = base.path().join("toolwall-1000");
        ensure_private_dir(&dir, false, me).expect("missing is fine for a client");
        assert!(!dir.exists());
        ensure_private_dir(&dir, true, me).expect("created");
        assert_eq!(
            mode(&dir),
            0o711,
            "others may reach the socket, not list or write"
        );
        ensure_private_dir(&dir, true, me).expect("ours already");

        // Someone else's (pre-created by another user): refused, naming the path and the fix.
        let error = ensure_private_dir(&dir, true, me + 1).expect_err("other owner");
        let text = format!("{error:#}");
        assert!(text.contains(&dir.display().to_string()), "{text}");
        assert!(
            text.contains("owned by uid") && text.contains("api.socket"),
            "{text}"
        );

        // Writable by others: refused; readable by others but ours: tightened.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let error = ensure_private_dir(&dir, false, me).expect_err("world-writable");
        assert!(format!("{error:#}").contains("0777"), "{error:#}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        ensure_private_dir(&dir, false, me).expect("ours, tightened");
        assert_eq!(mode(&dir), 0o711);

        // A symlink (even to a directory of ours) or a file: refused.
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).expect("symlink");
        assert!(ensure_private_dir(&link, true, me).is_err());
        let file = base.path().join("file");
        std::fs::write(&file, b"").expect("file");
        assert!(ensure_private_dir(&file, true, me).is_err());
    }

    #[test]
    fn a_configured_socket_directory_must_be_the_daemons_and_closed_to_others() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let base = tempfile::tempdir().expect("tempdir");
        let me = std::fs::metadata(base.path()).expect("stat").uid();
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").mode() & 0o7777;

        // Missing: created 0711, each level.
        let dir = base.path().join("run/toolwall");
        ensure_configured_dir(&dir, me).expect("created");
        assert_eq!(mode(&dir), 0o711);
        assert_eq!(mode(&base.path().join("run")), 0o711);
        // An existing one of ours that others may read: accepted, and left as it is.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        ensure_configured_dir(&dir, me).expect("ours, closed to writes");
        assert_eq!(mode(&dir), 0o755);

        // Writable by others, with the sticky bit or without: refused.
        for open in [0o777, 0o1777, 0o775] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(open)).expect("chmod");
            let text = format!(
                "{:#}",
                ensure_configured_dir(&dir, me).expect_err("writable")
            );
            assert!(
                text.contains(&format!("{open:04o}")) && text.contains(&dir.display().to_string()),
                "{text}"
            );
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");

        // Another user's: refused, naming the owner and what to do.
        if me == 0 {
            std::os::unix::fs::chown(&dir, Some(65534), None).expect("chown to nobody");
            let text = format!(
                "{:#}",
                ensure_configured_dir(&dir, 0).expect_err("nobody's")
            );
            assert!(
                text.contains("owned by uid 65534") && text.contains("set `api.socket`"),
                "{text}"
            );
        } else {
            let text = format!(
                "{:#}",
                ensure_configured_dir(&dir, me + 1).expect_err("mine")
            );
            assert!(text.contains(&format!("owned by uid {me}")), "{text}");
        }

        // The way to it: a parent of another user's, or a link of theirs, is refused (through
        // either, they could swap the checked directory for their own).
        if me == 0 {
            let parent = base.path().join("theirs");
            let dir = parent.join("sock");
            ensure_configured_dir(&dir, 0).expect("all root's");
            std::os::unix::fs::chown(&parent, Some(65534), None).expect("chown to nobody");
            let text = format!("{:#}", ensure_configured_dir(&dir, 0).expect_err("parent"));
            assert!(
                text.contains("on the way to api.socket") && text.contains("65534"),
                "{text}"
            );
            let target = base.path().join("target");
            ensure_configured_dir(&target, 0).expect("all root's");
            let link = base.path().join("link");
            std::os::unix::fs::symlink(&target, &link).expect("symlink");
            ensure_configured_dir(&link, 0).expect("a link of root's");
            std::os::unix::fs::lchown(&link, Some(65534), None).expect("lchown");
            let text = format!("{:#}", ensure_configured_dir(&link, 0).expect_err("link"));
            assert!(
                text.contains("on the way to api.socket") && text.contains("65534"),
                "{text}"
            );
        }

        // A file where the directory should be: refused.
        let file = base.path().join("file");
        std::fs::write(&file, b"").expect("file");
        assert!(ensure_configured_dir(&file, me).is_err());
    }

    #[test]
    fn default_socket_paths_are_in_a_directory_of_their_own() {
        let configured = Path::new("/srv/x.sock");
        assert_eq!(socket_path(Some(configured)), configured);
        let default = socket_path(None);
        assert_eq!(
            default.file_name().and_then(|n| n.to_str()),
            Some("api.sock")
        );
        let dir = default.parent().expect("a directory");
        assert_ne!(dir, Path::new("/tmp"), "never directly in /tmp");
    }
}
