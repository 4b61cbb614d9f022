//! Which session an LLM request belongs to. `toolwall exec` gives each session the base URL
//! `http://PROXY/s/<key>`, where the key is a random secret the daemon issued when it opened
//! the session: a path naming the session itself would let any agent write intercepted-call
//! events into any other session's record. A key only says what a client knows, though: it
//! sits in the agent's environment, which every process of the agent's user can read, in the
//! session or not (so a key alone would let a process outside the session write into it, and
//! a session's process with no key at all would write as the host). So where the session has a
//! cgroup, the kernel says where a connection comes from (`sockdiag.rs`): a key is honoured
//! only from its session's processes, and a request of a session's process belongs to that
//! session with or without a key. A request without the prefix from outside every session
//! belongs to the proxy's default session (host traffic); a key nobody issued is refused, but
//! for a session this daemon adopted from one that died, whose processes hold the dead
//! daemon's key and are known by their cgroup alone.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

/// The keys and cgroups of open sessions.
#[derive(Default)]
pub struct SessionKeys(RwLock<Sessions>);

#[derive(Default)]
struct Sessions {
    /// Key -> session.
    keys: HashMap<String, String>,
    /// Cgroup id -> session: a session's own cgroup and those the daemon made for it (its
    /// stdio servers').
    places: HashMap<u64, String>,
    /// Session -> its cgroup directories (the cgroups a session's processes made inside
    /// them are its too).
    dirs: HashMap<String, Vec<PathBuf>>,
    /// Session -> which opening of that name it is: a connection made in a session is its
    /// own only while that opening lasts (one handed out outlived it, and passed for the
    /// next session of the name).
    openings: HashMap<String, u64>,
    next_opening: u64,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys are secrets: only how many.
        let n = self.0.read().map(|m| m.keys.len()).unwrap_or(0);
        write!(f, "SessionKeys({n} issued)")
    }
}

/// Where a client connection comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Peer {
    /// A process of this opening of this session.
    Session(String, u64),
    /// A process of no open session that has a cgroup.
    Outside,
    /// The kernel did not say (why): nothing is honoured while sessions have cgroups.
    Unknown(String),
}

/// How deep and how wide the cgroups inside a session's are searched for a connection's.
const MAX_DEPTH: usize = 8;
const MAX_DIRS: usize = 1024;

impl SessionKeys {
    /// A fresh key for `session` (any earlier one of it stops working).
    pub fn issue(&self, session: &str) -> std::io::Result<String> {
        let mut bytes = [0u8; 16];
        // SAFETY: getrandom writes at most `len` bytes into the buffer.
        let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
        if got != bytes.len() as isize {
            return Err(std::io::Error::last_os_error());
        }
        let key = hex::encode(bytes);
        let mut sessions = self.write();
        sessions.keys.retain(|_, s| s != session);
        sessions.keys.insert(key.clone(), session.to_owned());
        Ok(key)
    }

    /// Records `dir`, a cgroup of `session` (its own, or one made for it): its processes'
    /// connections are the session's, and only they may use the session's key.
    pub fn place(&self, session: &str, dir: &Path) -> std::io::Result<()> {
        let id = std::fs::metadata(dir)?.ino();
        let mut sessions = self.write();
        if !sessions.openings.contains_key(session) {
            sessions.next_opening += 1;
            let opening = sessions.next_opening;
            sessions.openings.insert(session.to_owned(), opening);
        }
        sessions.places.insert(id, session.to_owned());
        sessions
            .dirs
            .entry(session.to_owned())
            .or_default()
            .push(dir.to_path_buf());
        Ok(())
    }

    /// Forgets the key and cgroups of a session that closed.
    pub fn forget(&self, session: &str) {
        let mut sessions = self.write();
        sessions.keys.retain(|_, s| s != session);
        sessions.places.retain(|_, s| s != session);
        sessions.dirs.remove(session);
        sessions.openings.remove(session);
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Sessions> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Sessions> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Where a connection comes from, given the cgroup the kernel said its client end is in
    /// (`sockdiag.rs`, asked once per connection) or why it did not say. Matters only while
    /// some session has a cgroup.
    pub(super) fn origin(&self, cgroup: Result<u64, String>) -> Peer {
        if self.read().places.is_empty() {
            return Peer::Outside;
        }
        match cgroup {
            Ok(id) => self.origin_of(id),
            Err(e) => Peer::Unknown(e),
        }
    }

    fn origin_of(&self, id: u64) -> Peer {
        let sessions = self.read();
        let found = |session: &String| {
            Peer::Session(
                session.clone(),
                sessions.openings.get(session).copied().unwrap_or_default(),
            )
        };
        if let Some(session) = sessions.places.get(&id) {
            return found(session);
        }
        // A cgroup made inside a session's (a root agent may): searched for, bounded.
        let mut budget = MAX_DIRS;
        for (session, dirs) in &sessions.dirs {
            if dirs
                .iter()
                .any(|dir| holds(dir, id, MAX_DEPTH, &mut budget))
            {
                return found(session);
            }
        }
        Peer::Outside
    }

    /// Whether the opening of `session` a connection was made in is still open.
    fn still_open(&self, session: &str, opening: u64) -> bool {
        self.read().openings.get(session) == Some(&opening)
    }

    /// Whether `session` was issued a key by this daemon.
    fn has_key(&self, session: &str) -> bool {
        self.read().keys.values().any(|s| s == session)
    }

    fn session_of(&self, key: &str) -> Option<(String, bool)> {
        let sessions = self.read();
        let session = sessions.keys.get(key)?;
        Some((session.clone(), sessions.dirs.contains_key(session)))
    }
}

/// Whether a cgroup below `dir` has the id `id`.
fn holds(dir: &Path, id: u64, depth: usize, budget: &mut usize) -> bool {
    if depth == 0 {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    for entry in entries.flatten() {
        if *budget == 0 {
            return false;
        }
        *budget -= 1;
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if !kind.is_dir() {
            continue;
        }
        let path = entry.path();
        if std::fs::metadata(&path).is_ok_and(|m| m.ino() == id)
            || holds(&path, id, depth - 1, budget)
        {
            return true;
        }
    }
    false
}

/// Why a request's session is refused.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// A `/s/<key>` prefix that names no open session.
    UnknownKey,
    /// A session's key from a process that is not of that session.
    NotItsSession,
    /// A request where the kernel did not say where its connection comes from.
    Unverified(String),
    /// A connection made in a session that has closed since.
    SessionClosed,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::UnknownKey => write!(
                f,
                "this /s/ key names no open session (toolwall exec gives each session its base URL)"
            ),
            Refused::NotItsSession => write!(
                f,
                "this /s/ key is honoured only from its own session's processes"
            ),
            Refused::Unverified(why) => write!(
                f,
                "cannot tell which session this connection comes from ({why}); refused, not guessed"
            ),
            Refused::SessionClosed => write!(
                f,
                "this connection was made in a session that has closed; open a new one"
            ),
        }
    }
}

/// The session a request belongs to and the path to forward, its `/s/<key>` prefix removed.
pub(super) fn split_session(
    path_and_query: &str,
    keys: &SessionKeys,
    default_session: &str,
    origin: &Peer,
) -> Result<(String, String), Refused> {
    // Where the connection comes from decides before any key: a session's connection is its
    // own only while the session lasts, and one the kernel could not place is not guessed
    // (a session's process would pass as the host's).
    match origin {
        Peer::Session(from, opening) if !keys.still_open(from, *opening) => {
            return Err(Refused::SessionClosed);
        }
        Peer::Unknown(why) => return Err(Refused::Unverified(why.clone())),
        _ => {}
    }
    let Some(rest) = path_and_query.strip_prefix("/s/") else {
        let session = match origin {
            Peer::Session(session, _) => session.clone(),
            Peer::Outside | Peer::Unknown(_) => default_session.to_owned(),
        };
        return Ok((session, path_and_query.to_owned()));
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (key, tail) = rest.split_at(end);
    let (session, has_cgroup) = match (keys.session_of(key), origin) {
        (Some(known), _) => known,
        // A session adopted from a daemon that died (`kill -9`) has no key: the one its agents
        // hold died with that daemon. Their requests are its own by where they come from,
        // as without a key.
        (None, Peer::Session(from, _)) if !keys.has_key(from) => (from.clone(), true),
        (None, _) => return Err(Refused::UnknownKey),
    };
    // A session without a cgroup (the kernel layer off) is known by its key alone.
    if has_cgroup {
        match origin {
            Peer::Session(from, _) if *from == session => {}
            Peer::Session(..) | Peer::Outside => return Err(Refused::NotItsSession),
            Peer::Unknown(why) => return Err(Refused::Unverified(why.clone())),
        }
    }
    let tail = if tail.starts_with('/') {
        tail.to_owned()
    } else {
        format!("/{tail}")
    };
    Ok((session, tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_known_by_its_key_and_never_by_its_name() {
        let keys = SessionKeys::default();
        let demo = keys.issue("demo").unwrap();
        let other = keys.issue("other").unwrap();
        assert_ne!(demo, other);
        let split = |path: &str| split_session(path, &keys, "dflt", &Peer::Outside);
        assert_eq!(
            split(&format!("/s/{demo}/v1/messages?beta=true")),
            Ok(("demo".into(), "/v1/messages?beta=true".into()))
        );
        assert_eq!(
            split(&format!("/s/{other}?x=1")),
            Ok(("other".into(), "/?x=1".into()))
        );
        assert_eq!(
            split("/v1/messages"),
            Ok(("dflt".into(), "/v1/messages".into()))
        );
        // A session's name is no key: naming `victim` must not write into it.
        for path in [
            "/s/demo/v1/messages",
            "/s//v1/messages",
            "/s/../v1/messages",
        ] {
            assert_eq!(split(path), Err(Refused::UnknownKey), "{path}");
        }
        // A closed session's key, or an earlier key of a reopened one, stops working.
        let again = keys.issue("demo").unwrap();
        assert_eq!(split(&format!("/s/{demo}/v1/x")), Err(Refused::UnknownKey));
        keys.forget("demo");
        assert_eq!(split(&format!("/s/{again}/v1/x")), Err(Refused::UnknownKey));
        assert!(split(&format!("/s/{other}/v1/x")).is_ok());
    }

    #[test]
    fn a_key_is_honoured_only_from_its_sessions_processes() {
        let dir = tempfile::tempdir().unwrap();
        let (own, inner, atk, host) = (
            dir.path().join("victim"),
            dir.path().join("victim/made/inside"),
            dir.path().join("atk"),
            dir.path().join("host"),
        );
        for d in [&inner, &atk, &host] {
            std::fs::create_dir_all(d).unwrap();
        }
        let keys = SessionKeys::default();
        keys.place("victim", &own).unwrap();
        keys.place("atk", &atk).unwrap();
        let victim = keys.issue("victim").unwrap();
        let bare = keys.issue("bare").unwrap(); // a session with no cgroup (kernel layer off)
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let is = |peer: &Peer, name: &str| matches!(peer, Peer::Session(s, _) if s == name);
        // The kernel's answer, mapped: the session's cgroup, one made inside it, others.
        let from = keys.origin_of(ino(&own));
        assert!(is(&from, "victim"), "{from:?}");
        assert_eq!(keys.origin_of(ino(&inner)), from);
        let thief = keys.origin_of(ino(&atk));
        assert!(is(&thief, "atk"), "{thief:?}");
        assert_eq!(keys.origin_of(ino(&host)), Peer::Outside);
        let split = |path: &str, peer: &Peer| split_session(path, &keys, "dflt", peer);
        let path = format!("/s/{victim}/v1/messages");
        assert_eq!(
            split(&path, &from),
            Ok(("victim".into(), "/v1/messages".into()))
        );
        // The key from outside the session, and from another session.
        assert_eq!(split(&path, &Peer::Outside), Err(Refused::NotItsSession));
        assert_eq!(split(&path, &thief), Err(Refused::NotItsSession));
        // The kernel not saying is refused, key or not: not guessed to be the host.
        for p in [path.as_str(), "/v1/messages"] {
            assert!(matches!(
                split(p, &Peer::Unknown("no answer".into())),
                Err(Refused::Unverified(_))
            ));
        }
        // A session's process without a key is still the session's (not the host's).
        assert_eq!(
            split("/v1/messages", &from),
            Ok(("victim".into(), "/v1/messages".into()))
        );
        assert_eq!(
            split("/v1/messages", &Peer::Outside),
            Ok(("dflt".into(), "/v1/messages".into()))
        );
        // A session without a cgroup is known by its key alone, as before.
        assert!(split(&format!("/s/{bare}/v1/x"), &Peer::Outside).is_ok());
        // Closed: its cgroups are no longer its, and a connection made in it (handed out
        // before it closed) speaks for nobody — nor for the next session of its name.
        keys.forget("victim");
        assert_eq!(keys.origin_of(ino(&own)), Peer::Outside);
        assert_eq!(split("/v1/messages", &from), Err(Refused::SessionClosed));
        assert_eq!(split(&path, &from), Err(Refused::SessionClosed));
        keys.place("victim", &own).unwrap();
        let again = keys.issue("victim").unwrap();
        assert_eq!(split(&path, &Peer::Outside), Err(Refused::UnknownKey));
        let renewed = format!("/s/{again}/v1/messages");
        assert_eq!(split(&renewed, &from), Err(Refused::SessionClosed));
        assert_eq!(split("/v1/messages", &from), Err(Refused::SessionClosed));
        let now = keys.origin_of(ino(&own));
        assert_ne!(now, from);
        assert!(split(&renewed, &now).is_ok());
    }

    /// A daemon that adopted a session from one that died knows its cgroup but not the key its
    /// agents hold: their requests are the session's by where they come from; the same key
    /// from outside, or from a session that has a key of this daemon's, is still refused.
    #[test]
    fn an_adopted_sessions_old_key_is_its_own_from_its_processes_only() {
        let dir = tempfile::tempdir().unwrap();
        let (adopted, fresh) = (dir.path().join("adopted"), dir.path().join("fresh"));
        for d in [&adopted, &fresh] {
            std::fs::create_dir_all(d).unwrap();
        }
        let keys = SessionKeys::default();
        keys.place("adopted", &adopted).unwrap();
        keys.place("fresh", &fresh).unwrap();
        keys.issue("fresh").unwrap();
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let old = "/s/0123456789abcdef0123456789abcdef/v1/messages";
        let split = |peer: &Peer| split_session(old, &keys, "dflt", peer);
        assert_eq!(
            split(&keys.origin_of(ino(&adopted))),
            Ok(("adopted".into(), "/v1/messages".into()))
        );
        assert_eq!(split(&Peer::Outside), Err(Refused::UnknownKey));
        assert_eq!(
            split(&keys.origin_of(ino(&fresh))),
            Err(Refused::UnknownKey)
        );
    }
}
