//! The ids a passthrough session's requests wait under, across its POSTs. Each POST has a
//! filter of its own, which refuses an id reused within it (`filter/pending.rs`), but a server
//! routes a session's responses by id: the TypeScript SDK's transport keeps one stream per id,
//! so a second request with an id already waiting takes over the first one's stream, and a
//! `get-env` result reached the POST whose filter took it for an exempt tool's. So an id is
//! held for its session from the moment its request is forwarded until its answer has passed,
//! and a request reusing one that is held is refused.
//!
//! A POST whose answers did not all pass (its client left, its upstream failed or ended the
//! stream early) leaves its ids *stranded*: the server may still be running the request and
//! send its answer to whoever holds the id next. They stay held until `--session-idle-timeout`
//! has passed or the upstream confirmed the session's deletion. Ids are kept as keyed hashes
//! (8 bytes each, whatever their length); when 4,096 sessions hold ids, the one whose ids
//! were all stranded longest ago is forgotten for a new one, and only sessions with requests
//! on their way refuse a newcomer.
//!
//! A server without sessions answers each POST on its own response, and the SDKs make it a
//! transport per request ("a single instance would cause request ID collisions"): there, ids
//! are only kept apart within a POST, and two clients may use the same ones.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::mcp::filter::IdKey;

/// Most ids one session may hold at once, as a session's filter does.
const MAX_HELD: usize = 256;
/// Most sessions holding ids at once.
const MAX_SESSIONS: usize = 4096;

/// Why a request was not given its ids.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refused {
    #[error(
        "request id {0} is already in use by a request of this session that has not been answered; give each outstanding request its own id"
    )]
    InUse(IdKey),
    #[error("this session has {MAX_HELD} requests waiting for answers; wait for some")]
    TooMany,
    #[error("{MAX_SESSIONS} sessions have requests waiting; try again later")]
    TooManySessions,
}

/// Whether an id's request is still on its way, or was abandoned unanswered (and when).
#[derive(Clone, Copy)]
enum Hold {
    Live,
    Stranded(Instant),
}

pub(super) struct Outstanding {
    held: Mutex<HashMap<String, HashMap<u64, Hold>>>,
    /// How long a stranded id stays held.
    strand_for: Duration,
    /// Keys ids by a keyed hash: a long id costs no more than a short one.
    hasher: RandomState,
}

/// Ids held until dropped: released when [`Claimed::answered`] was said, stranded otherwise.
pub(super) struct Claimed {
    owner: Arc<Outstanding>,
    session: String,
    ids: Vec<u64>,
    answered: bool,
}

impl Outstanding {
    pub(super) fn new(strand_for: Duration) -> Self {
        Outstanding {
            held: Mutex::default(),
            strand_for,
            hasher: RandomState::new(),
        }
    }

    /// Holds `ids` for `session`, all or none.
    pub(super) fn claim(
        self: &Arc<Self>,
        session: &str,
        ids: Vec<IdKey>,
    ) -> Result<Claimed, Refused> {
        let claimed = |ids: Vec<u64>| Claimed {
            owner: self.clone(),
            session: session.to_owned(),
            answered: ids.is_empty(),
            ids,
        };
        if ids.is_empty() {
            return Ok(claimed(Vec::new()));
        }
        let now = Instant::now();
        let hashes: Vec<u64> = ids.iter().map(|id| self.hasher.hash_one(id)).collect();
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if !held.contains_key(session) && held.len() >= MAX_SESSIONS {
            // The session whose ids were all stranded longest ago makes room; sessions with
            // requests on their way are never forgotten.
            let stalest = held
                .iter()
                .filter_map(|(s, set)| {
                    set.values()
                        .map(|hold| match hold {
                            Hold::Live => None,
                            Hold::Stranded(at) => Some(*at),
                        })
                        .collect::<Option<Vec<Instant>>>()
                        .and_then(|ats| ats.into_iter().max())
                        .map(|at| (at, s.clone()))
                })
                .min();
            match stalest {
                Some((_, s)) => {
                    held.remove(&s);
                }
                None => return Err(Refused::TooManySessions),
            }
        }
        let set = held.entry(session.to_owned()).or_default();
        set.retain(|_, hold| match hold {
            Hold::Live => true,
            Hold::Stranded(at) => now.duration_since(*at) < self.strand_for,
        });
        let refused = match hashes.iter().position(|h| set.contains_key(h)) {
            Some(i) => Some(Refused::InUse(ids[i].clone())),
            None if set.len() + ids.len() > MAX_HELD => Some(Refused::TooMany),
            None => None,
        };
        if let Some(refused) = refused {
            if set.is_empty() {
                held.remove(session);
            }
            return Err(refused);
        }
        set.extend(hashes.iter().map(|h| (*h, Hold::Live)));
        drop(held);
        Ok(claimed(hashes))
    }

    /// The upstream confirmed the session's deletion: what it held goes with it.
    pub(super) fn ended(&self, session: &str) {
        if let Ok(mut held) = self.held.lock() {
            held.remove(session);
        }
    }

    #[cfg(test)]
    fn sessions(&self) -> usize {
        self.held.lock().map(|h| h.len()).unwrap_or(0)
    }
}

impl Claimed {
    /// Every request of the POST was answered (each answer passed its filter), or the
    /// upstream refused them all: its ids are free once this is dropped.
    pub(super) fn answered(&mut self) {
        self.answered = true;
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let mut held = self.owner.held.lock().unwrap_or_else(|e| e.into_inner());
        let Some(set) = held.get_mut(&self.session) else {
            return;
        };
        let now = Instant::now();
        for id in &self.ids {
            match self.answered {
                true => {
                    set.remove(id);
                }
                false => {
                    if let Some(hold) = set.get_mut(id) {
                        *hold = Hold::Stranded(now);
                    }
                }
            }
        }
        if set.is_empty() {
            held.remove(&self.session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(raw: &[&str]) -> Vec<IdKey> {
        raw.iter().filter_map(|s| IdKey::of(s)).collect()
    }

    #[test]
    fn an_id_is_held_for_its_session_until_answered() {
        let out = Arc::new(Outstanding::new(Duration::from_secs(600)));
        let mut seven = out.claim("s1", ids(&["7"])).expect("free");
        // 7, 7.0 and 7e0 are one id to the peers.
        for again in ["7", "7.0", "7e0"] {
            assert!(matches!(
                out.claim("s1", ids(&[again])),
                Err(Refused::InUse(_))
            ));
        }
        // All or none: a batch with one held id holds none of the others.
        assert!(out.claim("s1", ids(&["8", "7"])).is_err());
        let mut eight = out.claim("s1", ids(&["8"])).expect("8 was not held");
        // Another session has ids of its own.
        let mut other = out.claim("s2", ids(&["7"])).expect("another session");
        seven.answered();
        drop(seven);
        let mut again = out.claim("s1", ids(&["7"])).expect("answered");
        for c in [&mut again, &mut eight, &mut other] {
            c.answered();
        }
        drop((again, eight, other));
        assert_eq!(out.sessions(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_id_stays_held_until_it_expires_or_its_session_ends() {
        let out = Arc::new(Outstanding::new(Duration::from_secs(600)));
        drop(out.claim("s1", ids(&["9"])).expect("free"));
        assert!(matches!(
            out.claim("s1", ids(&["9"])),
            Err(Refused::InUse(_))
        ));
        tokio::time::advance(Duration::from_secs(601)).await;
        let mut late = out.claim("s1", ids(&["9"])).expect("expired");
        late.answered();
        drop(late);
        drop(out.claim("s2", ids(&["9"])).expect("free"));
        out.ended("s2");
        assert!(out.claim("s2", ids(&["9"])).is_ok());
    }

    #[test]
    fn a_full_table_forgets_the_stalest_stranded_session_never_a_live_one() {
        let out = Arc::new(Outstanding::new(Duration::from_secs(600)));
        let mut live = Vec::new();
        for i in 0..MAX_SESSIONS - 1 {
            live.push(out.claim(&format!("live{i}"), ids(&["1"])).expect("room"));
        }
        drop(out.claim("stranded", ids(&["1"])).expect("room"));
        // Full: the stranded session makes room, and then nothing does.
        let mut newcomer = out
            .claim("new", ids(&["1"]))
            .expect("the stranded one goes");
        assert!(out.claim("stranded", ids(&["1"])).is_err());
        for c in live.iter_mut().chain(std::iter::once(&mut newcomer)) {
            c.answered();
        }
        drop((live, newcomer));
        assert_eq!(out.sessions(), 0);
    }

    #[test]
    fn a_session_holds_a_bounded_number_of_ids() {
        let out = Arc::new(Outstanding::new(Duration::from_secs(600)));
        let many: Vec<String> = (0..MAX_HELD).map(|i| i.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let mut held = out.claim("s", ids(&many)).expect("up to the bound");
        assert!(matches!(
            out.claim("s", ids(&["\"one more\""])),
            Err(Refused::TooMany)
        ));
        held.answered();
        drop(held);
        assert!(out.claim("s", ids(&["\"one more\""])).is_ok());
    }
}
