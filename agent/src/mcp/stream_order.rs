//! Keeps a Streamable HTTP session's GET stream ahead of its requests on the way upstream.
//!
//! Servers send their own requests (sampling, elicitation) on the session's GET stream; a
//! client opens that stream and POSTs a `tools/call` at once, on two connections. Forwarded
//! side by side, the POST can reach the server first (it finds an idle pooled connection,
//! the GET opens a new one), the server finds no stream for its request and drops it, and
//! the client waits out its time-out. The MCP conformance suite showed it through the filter
//! proxy, never direct (tests/tests/mcp_conformance.rs). So before a session's request is
//! forwarded, the GET streams being opened for it must have their heads; and a session that
//! never opened one waits once, [`GRACE`] at most, for a GET that may be on its way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

/// How long a session's first request waits for a GET stream that has not arrived; a
/// session whose client opens none pays it once.
pub(crate) const GRACE: Duration = Duration::from_millis(100);
/// Most sessions tracked; beyond it the table starts afresh (only ordering help is lost).
const MAX_SESSIONS: usize = 10_000;

#[derive(Clone, Copy, Default)]
struct State {
    /// GET streams sent upstream whose heads have not come back.
    opening: usize,
    /// A GET stream was opened for the session.
    opened: bool,
    /// The session's first request waited [`GRACE`] for a GET that did not come.
    gave_up: bool,
}

/// The sessions' GET streams, shared by the proxy's connections.
#[derive(Default)]
pub(crate) struct StreamOrder {
    sessions: Mutex<HashMap<String, watch::Sender<State>>>,
}

/// A GET stream on its way upstream; drop it once the upstream answered its head (or not).
pub(crate) struct Opening {
    order: Arc<StreamOrder>,
    session: String,
}

impl StreamOrder {
    fn state(&self, session: &str) -> watch::Sender<State> {
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        // Every forwarded request asks: a known session costs no copy of its id.
        if let Some(state) = sessions.get(session) {
            return state.clone();
        }
        if sessions.len() >= MAX_SESSIONS {
            sessions.clear();
        }
        sessions
            .entry(session.to_owned())
            .or_insert_with(|| watch::channel(State::default()).0)
            .clone()
    }

    /// A GET stream of `session` is being forwarded.
    pub(crate) fn opening(self: &Arc<Self>, session: String) -> Opening {
        self.state(&session).send_modify(|s| {
            s.opening += 1;
            s.opened = true;
        });
        Opening {
            order: self.clone(),
            session,
        }
    }

    /// Waits until a request of `session` may be forwarded: its GET streams have their heads
    /// (at most `limit`), or, for a session without one yet, [`GRACE`] has passed once.
    pub(crate) async fn before_request(&self, session: &str, limit: Duration) {
        let state = self.state(session);
        let mut rx = state.subscribe();
        let now = *rx.borrow();
        if !now.opened && !now.gave_up {
            let waited = tokio::time::timeout(GRACE, rx.wait_for(|s| s.opened)).await;
            if waited.is_err() {
                state.send_modify(|s| s.gave_up = true);
                return;
            }
        }
        let _ = tokio::time::timeout(limit, rx.wait_for(|s| s.opening == 0)).await;
    }

    /// The session ended (DELETE).
    pub(crate) fn ended(&self, session: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(session);
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        let sessions = self
            .order
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(state) = sessions.get(&self.session) {
            state.send_modify(|s| s.opening = s.opening.saturating_sub(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn requests_wait_for_streams_being_opened() {
        let order = Arc::new(StreamOrder::default());
        // No GET yet: the first request waits the grace period once, later ones not at all.
        let started = tokio::time::Instant::now();
        order.before_request("a", Duration::from_secs(60)).await;
        assert_eq!(started.elapsed(), GRACE);
        let started = tokio::time::Instant::now();
        order.before_request("a", Duration::from_secs(60)).await;
        assert_eq!(started.elapsed(), Duration::ZERO);

        // A GET in flight holds the request until its head came back.
        let opening = order.opening("b".into());
        let waiter = {
            let order = order.clone();
            tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                order.before_request("b", Duration::from_secs(60)).await;
                started.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(opening);
        let waited = waiter.await.expect("waiter");
        assert_eq!(waited, Duration::from_secs(3));

        // A request that arrives before its session's GET waits for it and for its head.
        let waiter = {
            let order = order.clone();
            tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                order.before_request("c", Duration::from_secs(60)).await;
                started.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let opening = order.opening("c".into());
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(opening);
        assert_eq!(waiter.await.expect("waiter"), Duration::from_millis(510));

        // An upstream that never answers the GET's head delays a request `limit` at most.
        let _stuck = order.opening("d".into());
        let started = tokio::time::Instant::now();
        order.before_request("d", Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        order.ended("d");
    }
}
