//! Where a `path_prefix` condition's paths really are: each path normalized as written and
//! resolved as the host resolves it now, with recently resolved directories cached across
//! calls (resolving costs a system call per component).

use std::collections::HashMap;
use std::sync::PoisonError;

use super::{MAX_CACHED_NAME, normalized};

/// Paths already resolved on the host during one judgement (`path_prefix`), by their text.
pub(super) struct Resolved<'r> {
    /// Text → (normalized as written, as the host resolves it).
    pub(super) seen: HashMap<String, (Option<String>, Option<String>)>,
    pub(super) dirs: &'r DirCache,
}

impl Resolved<'_> {
    /// `path` normalized as written (`None` unless absolute) and as the host resolves it now
    /// ([`Resolved::real`]), each computed once per judgement.
    pub(super) fn both(&mut self, path: &str) -> &(Option<String>, Option<String>) {
        if !self.seen.contains_key(path) {
            let lexical = normalized(path);
            let real = lexical.as_ref().and_then(|_| self.real(path));
            self.seen.insert(path.to_owned(), (lexical, real));
        }
        &self.seen[path]
    }

    /// `path` with symlinks resolved as the host resolves them now: the longest part of it
    /// that exists, made real, and the rest as written (normalized). `None` when nothing of it
    /// resolves. Its directory comes from [`DirCache`]; the last component is looked at each
    /// time (a symlink there is resolved whole).
    fn real(&self, path: &str) -> Option<String> {
        match path.rsplit_once('/') {
            Some((dir, name))
                if !matches!(name, "" | "." | "..")
                    && !std::fs::symlink_metadata(path)
                        .is_ok_and(|m| m.file_type().is_symlink()) =>
            {
                let dir = if dir.is_empty() { "/" } else { dir };
                self.dirs
                    .real(dir)
                    .and_then(|d| normalized(&format!("{d}/{name}")))
            }
            _ => resolve(path),
        }
    }
}

/// Directories resolved in the last [`DIR_TTL`], shared by every call: calls name files in few
/// directories, and resolving one costs a system call per component (a decision with 1,000
/// rules took 26 µs, nearly all of it resolving one path).
#[derive(Debug, Default)]
pub(super) struct DirCache(std::sync::Mutex<HashMap<String, (std::time::Instant, Option<String>)>>);

impl DirCache {
    fn real(&self, dir: &str) -> Option<String> {
        let now = std::time::Instant::now();
        if let Some((at, real)) = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(dir)
            && now.duration_since(*at) < DIR_TTL
        {
            return real.clone();
        }
        let real = resolve(dir);
        if dir.len() <= MAX_CACHED_NAME {
            let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            if cache.len() >= MAX_DIRS {
                cache.retain(|_, (at, _)| now.duration_since(*at) < DIR_TTL);
                if cache.len() >= MAX_DIRS {
                    cache.clear();
                }
            }
            cache.insert(dir.to_owned(), (now, real.clone()));
        }
        real
    }
}

/// How long a resolved directory is trusted: a symlink swapped within it is seen that late
/// (the server opens the path later than the decision anyway).
const DIR_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// Most directories kept.
const MAX_DIRS: usize = 4096;

/// `path` resolved by the host: the longest part of it that exists made real (symlinks, `..`
/// after them), the rest appended as written, normalized.
fn resolve(path: &str) -> Option<String> {
    let mut head = std::path::PathBuf::from(path);
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        if let Ok(mut real) = std::fs::canonicalize(&head) {
            for part in rest.iter().rev() {
                real.push(part);
            }
            return real.to_str().and_then(normalized);
        }
        match (head.file_name().map(|f| f.to_owned()), head.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                head = parent.to_path_buf();
            }
            _ => return None,
        }
    }
}

/// Whether normalized `path` is `prefix` or below it (by whole segments: `/etcx` is not
/// under `/etc`).
pub(super) fn under(path: &str, prefix: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}
