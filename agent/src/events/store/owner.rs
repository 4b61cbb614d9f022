//! One daemon per event store.
//!
//! Two daemons writing one store mix their records: a user's `toolwall mcp calls` shows another
//! configuration's calls as their own, and each daemon's correlator joins events it never saw.
//! The default store is one path per user (`/var/lib/toolwall/events.db` for root), so this is
//! easy to do by accident: a second `toolwall run --config other.yaml` without `store.path`.
//! The daemon therefore holds an exclusive `flock` on `<store>.daemon` for as long as it runs and
//! writes there who it is; a second daemon is refused, naming the first and what to do.
//! Stand-alone shims and filter proxies still write to a daemon's store: that is their job.

use std::io::{Read as _, Seek as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why a daemon may not use a store.
#[derive(Debug, Error)]
pub(crate) enum ClaimError {
    /// Another daemon runs on it.
    #[error(
        "the event store {store} is in use by another daemon ({holder}); give this configuration a store of its own (`store.path`), or stop that daemon first"
    )]
    InUse {
        /// The store.
        store: PathBuf,
        /// What the other daemon wrote about itself.
        holder: String,
    },
    /// The claim file could not be opened or written.
    #[error("claim the event store through {path}")]
    Io {
        /// The claim file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The claim; released when dropped (or when the process dies, however it dies).
#[derive(Debug)]
pub(crate) struct StoreClaim {
    _file: std::fs::File,
}

/// Claims `store` for this daemon, run with the configuration described by `config`.
///
/// The claim file is named after the store as the kernel finds it (a link to the store, or
/// another spelling of its path, names the same claim), is never followed if it is a link (a
/// link planted in a shared directory would have root's daemon truncate its target), and must
/// be a regular file of this user's.
pub(crate) fn claim(store: &Path, config: &str) -> Result<StoreClaim, ClaimError> {
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let store = std::fs::canonicalize(store).unwrap_or_else(|_| store.to_path_buf());
    let mut path = store.as_os_str().to_owned();
    path.push(".daemon");
    let path = PathBuf::from(path);
    let io = |source| ClaimError::Io {
        path: path.clone(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    // SAFETY: geteuid has no preconditions.
    if !meta.is_file() || meta.uid() != unsafe { libc::geteuid() } {
        return Err(io(std::io::Error::other(
            "not a regular file of this user's: remove it (it was not made by toolwall)",
        )));
    }
    // SAFETY: flock on a descriptor we own; the lock lives as long as the descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io(error));
        }
        let mut holder = String::new();
        // What the holder wrote is bounded: the claim file is written only here.
        let _ = (&mut file).take(4096).read_to_string(&mut holder);
        let holder = holder.trim();
        return Err(ClaimError::InUse {
            store,
            holder: if holder.is_empty() {
                "it has not said who it is yet".to_owned()
            } else {
                holder.to_owned()
            },
        });
    }
    let who = format!("pid {}, configuration {config}", std::process::id());
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    file.write_all(who.as_bytes()).map_err(io)?;
    Ok(StoreClaim { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_is_refused_naming_the_first_and_freed_when_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("events.db");
        let first = claim(&store, "/etc/toolwall/a.yaml").expect("the first claim");
        let refused = claim(&store, "/etc/toolwall/b.yaml").expect_err("a second daemon");
        let said = refused.to_string();
        assert!(said.contains(&store.display().to_string()), "{said}");
        assert!(
            said.contains(&format!("pid {}", std::process::id())),
            "{said}"
        );
        assert!(said.contains("/etc/toolwall/a.yaml"), "{said}");
        assert!(said.contains("store.path"), "{said}");
        drop(first);
        claim(&store, "/etc/toolwall/b.yaml").expect("free once the first daemon is gone");
    }
}
