//! The requests of one session that the server has not answered yet, by id. A response is
//! matched to the one request it answers, so the result rules know which tool a result is of
//! (per-tool exemptions). Two outstanding requests may never share an id: the server's answer
//! to one would be taken for the other's, and a secret returned by one tool judged as the
//! result of a tool exempt from inspection. So a request whose id equals an outstanding one
//! is refused, and when the bound is reached new requests are refused rather than the oldest
//! forgotten (`filter/pending_tests.rs`).

use std::collections::HashMap;

use serde_json::Value;

/// How many requests of one session may wait for the server's answer at once.
pub(super) const MAX_PENDING: usize = 256;

/// A request id as the peers compare it. JSON-RPC ids are strings or numbers, and peers read
/// numbers by value: `8`, `8.0` and `8e0` are one id to a Python server (which answers `8.0`
/// with `8`), and to a JavaScript one every number is a double, so `9007199254740993` is
/// `9007199254740992`. The Python SDK's server also routes responses by the id's text, so `7`
/// and `"7"` are one id to it. Numbers, and strings that read as a finite number, are keyed by
/// their double, the loosest reading: ids that any peer could take for one another share a
/// key, and are kept apart by refusal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum IdKey {
    Number(u64),
    Text(String),
    Null,
}

impl IdKey {
    /// The key of an id's JSON text; `None` for a value JSON-RPC does not allow as an id.
    pub(crate) fn of(raw: &str) -> Option<IdKey> {
        match serde_json::from_str::<Value>(raw).ok()? {
            Value::String(s) => Some(match s.parse::<f64>() {
                Ok(n) if n.is_finite() => IdKey::Number((n + 0.0).to_bits()),
                _ => IdKey::Text(s),
            }),
            Value::Null => Some(IdKey::Null),
            // `+ 0.0` makes -0 the same key as 0.
            Value::Number(n) => Some(IdKey::Number((n.as_f64()? + 0.0).to_bits())),
            _ => None,
        }
    }
}

impl std::fmt::Display for IdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdKey::Number(bits) => write!(f, "{}", f64::from_bits(*bits)),
            IdKey::Text(s) => write!(f, "{}", Value::from(s.as_str())),
            IdKey::Null => f.write_str("null"),
        }
    }
}

/// What an outstanding request was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Request {
    /// A `tools/call` of this tool.
    Call(String),
    /// A `tools/list`; `first`: of its first page (no cursor), which begins a listing anew.
    List { first: bool },
    /// Any other request.
    Other,
}

/// The outstanding requests of one session.
#[derive(Debug, Default)]
pub(super) struct Pending {
    by_id: HashMap<IdKey, Request>,
}

impl Pending {
    pub(super) fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The ids of the requests waiting for the server.
    pub(super) fn ids(&self) -> Vec<IdKey> {
        self.by_id.keys().cloned().collect()
    }

    /// Why a request with id `key` may not go out now, if it may not.
    pub(super) fn refusal(&self, key: &IdKey, raw: &str) -> Option<String> {
        if self.by_id.contains_key(key) {
            return Some(format!(
                "toolwall: request id {raw} is already used by a request not yet answered; give each outstanding request its own id"
            ));
        }
        if self.by_id.len() >= MAX_PENDING {
            return Some(format!(
                "toolwall: {MAX_PENDING} requests of this session are waiting for the server; send more once some are answered"
            ));
        }
        None
    }

    /// Notes a request sent on (or held for a person). The caller asked [`Self::refusal`].
    pub(super) fn add(&mut self, key: IdKey, request: Request) {
        self.by_id.insert(key, request);
    }

    /// The request a response ends, forgotten.
    pub(super) fn end(&mut self, key: &IdKey) -> Option<Request> {
        self.by_id.remove(key)
    }

    /// A request the client cancelled. The server may answer it all the same, so its id stays
    /// taken until it does (were it freed, a late answer to a cancelled call would be taken
    /// for the answer to the next request given its id); that answer is no tool's.
    pub(super) fn cancelled(&mut self, key: &IdKey) {
        if let Some(request) = self.by_id.get_mut(key) {
            *request = Request::Other;
        }
    }
}

#[cfg(test)]
#[path = "pending_tests.rs"]
mod tests;
