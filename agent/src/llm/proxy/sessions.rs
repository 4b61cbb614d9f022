//! Which session an LLM request belongs to. `toolwall exec` gives each session the base URL
//! `http://PROXY/s/<key>`, where the key is a random secret the daemon issued when it opened
//! the session: a path naming the session itself let any agent write intercepted-call events
//! into any other session's record (an attack did). A request without the prefix belongs to
//! the proxy's default session (host traffic); one with a key nobody issued is refused.

use std::collections::HashMap;
use std::sync::RwLock;

/// The keys issued to open sessions.
#[derive(Default)]
pub struct SessionKeys(RwLock<HashMap<String, String>>);

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys are secrets: only how many.
        let n = self.0.read().map(|m| m.len()).unwrap_or(0);
        write!(f, "SessionKeys({n} issued)")
    }
}

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
        let mut keys = self.0.write().unwrap_or_else(|e| e.into_inner());
        keys.retain(|_, s| s != session);
        keys.insert(key.clone(), session.to_owned());
        Ok(key)
    }

    /// Forgets the key of a session that closed.
    pub fn forget(&self, session: &str) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, s| s != session);
    }

    fn session_of(&self, key: &str) -> Option<String> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }
}

/// A `/s/<key>` prefix that names no open session.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct UnknownKey;

/// The session a request belongs to and the path to forward, its `/s/<key>` prefix removed.
pub(super) fn split_session(
    path_and_query: &str,
    keys: &SessionKeys,
    default_session: &str,
) -> Result<(String, String), UnknownKey> {
    let Some(rest) = path_and_query.strip_prefix("/s/") else {
        return Ok((default_session.to_owned(), path_and_query.to_owned()));
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (key, tail) = rest.split_at(end);
    let session = keys.session_of(key).ok_or(UnknownKey)?;
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
        let split = |path: &str| split_session(path, &keys, "dflt");
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
        // A session's name is no key: the attack wrote into `victim` by naming it.
        for path in [
            "/s/demo/v1/messages",
            "/s//v1/messages",
            "/s/../v1/messages",
        ] {
            assert_eq!(split(path), Err(UnknownKey), "{path}");
        }
        // A closed session's key, or an earlier key of a reopened one, stops working.
        let again = keys.issue("demo").unwrap();
        assert_eq!(split(&format!("/s/{demo}/v1/x")), Err(UnknownKey));
        keys.forget("demo");
        assert_eq!(split(&format!("/s/{again}/v1/x")), Err(UnknownKey));
        assert!(split(&format!("/s/{other}/v1/x")).is_ok());
    }
}
