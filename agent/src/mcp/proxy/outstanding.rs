//! The ids a passthrough session's requests wait under, across its POSTs. Each POST has a
//! filter of its own, which refuses an id reused within it (`filter/pending.rs`), but a server
//! routes a session's responses by id: the TypeScript SDK's transport keeps one stream per id,
//! so a second request with an id already waiting takes over the first one's stream, and a
//! `get-env` result reached the POST whose filter took it for an exempt tool's. So an id is
//! held for its session from the moment its request is forwarded until its POST's response
//! ends, and a request reusing one that is held is refused.
//!
//! A server without sessions answers each POST on its own response, but one transport may
//! serve them all: its ids are held per identity (`identity.rs`), so one client's reuse is
//! refused and two clients' ids never meet.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use super::ProxyBody;
use crate::mcp::filter::IdKey;

/// Most ids one session (or identity) may hold at once, as a session's filter does.
const MAX_HELD: usize = 256;
/// Most sessions holding ids at once.
const MAX_SCOPES: usize = 4096;

/// Whose ids these are: an upstream session's, or (without sessions) an identity's.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) enum Scope {
    Session(String),
    Identity(u64),
}

/// Why a request was not given its ids.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refused {
    #[error(
        "request id {0} is already in use by a request of this session that has not been answered"
    )]
    InUse(String),
    #[error("this session has {MAX_HELD} requests waiting for answers; wait for some")]
    TooMany,
    #[error("{MAX_SCOPES} sessions have requests waiting; try again later")]
    TooManySessions,
}

#[derive(Default)]
pub(super) struct Outstanding {
    held: Mutex<HashMap<Scope, HashSet<IdKey>>>,
}

/// Ids held until dropped (with the response that answers them).
pub(super) struct Claimed {
    owner: Arc<Outstanding>,
    scope: Scope,
    ids: Vec<IdKey>,
}

impl Outstanding {
    /// Holds `ids` (raw JSON-RPC id texts) for `scope`, all or none.
    pub(super) fn claim(
        self: &Arc<Self>,
        scope: Scope,
        ids: &[String],
    ) -> Result<Claimed, Refused> {
        let keys: Vec<(IdKey, &String)> = ids
            .iter()
            .filter_map(|raw| IdKey::of(raw).map(|k| (k, raw)))
            .collect();
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if !held.contains_key(&scope) && held.len() >= MAX_SCOPES && !keys.is_empty() {
            return Err(Refused::TooManySessions);
        }
        let set = held.entry(scope.clone()).or_default();
        if let Some((_, raw)) = keys.iter().find(|(k, _)| set.contains(k)) {
            let raw = (*raw).clone();
            if set.is_empty() {
                held.remove(&scope);
            }
            return Err(Refused::InUse(raw));
        }
        if set.len() + keys.len() > MAX_HELD {
            if set.is_empty() {
                held.remove(&scope);
            }
            return Err(Refused::TooMany);
        }
        set.extend(keys.iter().map(|(k, _)| k.clone()));
        if set.is_empty() {
            held.remove(&scope);
        }
        Ok(Claimed {
            owner: self.clone(),
            scope,
            ids: keys.into_iter().map(|(k, _)| k).collect(),
        })
    }

    #[cfg(test)]
    fn scopes(&self) -> usize {
        self.held.lock().map(|h| h.len()).unwrap_or(0)
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let mut held = self.owner.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(set) = held.get_mut(&self.scope) {
            for id in &self.ids {
                set.remove(id);
            }
            if set.is_empty() {
                held.remove(&self.scope);
            }
        }
    }
}

/// A response body that holds its request's ids until it is done (or dropped).
pub(super) struct Holding {
    body: ProxyBody,
    _ids: Claimed,
}

impl Holding {
    pub(super) fn new(body: ProxyBody, ids: Claimed) -> Self {
        Holding { body, _ids: ids }
    }
}

impl Body for Holding {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(raw: &[&str]) -> Vec<String> {
        raw.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn an_id_is_held_for_its_session_until_its_response_ends() {
        let out = Arc::new(Outstanding::default());
        let s1 = Scope::Session("s1".into());
        let seven = out.claim(s1.clone(), &ids(&["7"])).expect("free");
        // 7, 7.0 and 7e0 are one id to the peers.
        for again in ["7", "7.0", "7e0"] {
            assert!(matches!(
                out.claim(s1.clone(), &ids(&[again])),
                Err(Refused::InUse(_))
            ));
        }
        // All or none: a batch with one held id holds none of the others.
        assert!(out.claim(s1.clone(), &ids(&["8", "7"])).is_err());
        let eight = out.claim(s1.clone(), &ids(&["8"])).expect("8 was not held");
        // Another session, or an identity, has ids of its own.
        let other = out
            .claim(Scope::Session("s2".into()), &ids(&["7"]))
            .expect("another session");
        let stateless = out
            .claim(Scope::Identity(1), &ids(&["7"]))
            .expect("identity");
        drop(seven);
        let again = out.claim(s1.clone(), &ids(&["7"])).expect("answered");
        drop((again, eight, other, stateless));
        assert_eq!(out.scopes(), 0);
    }

    #[test]
    fn a_session_holds_a_bounded_number_of_ids() {
        let out = Arc::new(Outstanding::default());
        let s = Scope::Identity(9);
        let many: Vec<String> = (0..MAX_HELD).map(|i| i.to_string()).collect();
        let held = out.claim(s.clone(), &many).expect("up to the bound");
        assert!(matches!(
            out.claim(s.clone(), &ids(&["\"one more\""])),
            Err(Refused::TooMany)
        ));
        drop(held);
        assert!(out.claim(s, &ids(&["\"one more\""])).is_ok());
    }
}
