//! The comparison set of the definition checks (the registered tools a definition may shadow
//! or name), read from the registry again only when it is stale or lacks a listed tool: a
//! listing judged tool by tool would otherwise read the registry and rebuild the set per tool.

use std::{
    collections::HashSet,
    sync::{Arc, PoisonError},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::Others;
use crate::policy::Policy;

/// How long the registered tools read for the definition checks are used again (a listing
/// judged tool by tool reads the registry once).
const OTHERS_FRESH: Duration = Duration::from_secs(1);

/// The comparison set of the definition checks ([`Policy::others`]), when it was read, and
/// the servers whose newly registered tools it lacks.
#[derive(Debug)]
pub(super) struct OthersCache {
    at: Instant,
    set: Arc<Others>,
    lacks: HashSet<String>,
}

impl Policy {
    /// The registered tools listings are compared with. Other processes (shims started with
    /// this one) register too, so the registry is read again — once per [`OTHERS_FRESH`], or
    /// when this process registered a tool the set lacks: the filter judges a listing tool by
    /// tool, and a read per tool made it quadratic.
    ///
    /// A set that lacks only tools of the server being judged serves as it is: its own tools
    /// are skipped anyway (rebuilding it per tool of a listing registered tool by tool made
    /// 2,000 tools of 512-byte names run for minutes).
    pub(super) fn others(&self, judging: Option<&str>) -> Arc<Others> {
        let previous = match &*self
            .definition_state
            .others
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Some(cache)
                if cache.at.elapsed() < OTHERS_FRESH
                    && cache
                        .lacks
                        .iter()
                        .all(|server| Some(server.as_str()) == judging) =>
            {
                return cache.set.clone();
            }
            cache => cache.as_ref().map(|c| c.set.clone()),
        };
        if let Err(error) = self.registry.reload() {
            tracing::warn!(%error, "cannot re-read the registry before the definition checks");
        }
        let others = Arc::new(Others::reusing(
            self.registry
                .tools()
                .iter()
                .map(|e| (e.server_id.clone(), e.tool.clone()))
                .collect(),
            previous.as_deref(),
        ));
        *self
            .definition_state
            .others
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(OthersCache {
            at: std::time::Instant::now(),
            set: others.clone(),
            lacks: std::collections::HashSet::new(),
        });
        others
    }

    /// The comparison set may lack `server_id`'s listed `tools` now: it is rebuilt before it
    /// judges another server.
    pub(in crate::policy) fn registered_since_compared(&self, server_id: &str, tools: &[Value]) {
        let mut others = self
            .definition_state
            .others
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(cache) = others.as_mut()
            && tools
                .iter()
                .filter_map(|t| t.get("name").and_then(Value::as_str))
                .any(|name| !cache.set.contains(server_id, name))
        {
            cache.lacks.insert(server_id.to_owned());
        }
    }
}
