//! Where the database lives when the configuration does not say.

use std::path::{Path, PathBuf};

/// The database used by root when `store.path` is not set (system-wide, survives users).
pub const ROOT_STORE_PATH: &str = "/var/lib/toolwall/events.db";

/// The database path: `store.path` if set; for root `/var/lib/toolwall/events.db`; otherwise
/// `$XDG_DATA_HOME/toolwall/events.db`, else `$HOME/.local/share/toolwall/events.db`, else
/// `./toolwall-events.db` (no home at all, e.g. a bare container).
pub fn default_store_path(configured: Option<&Path>) -> PathBuf {
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
}
