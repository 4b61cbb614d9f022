//! The policy in force, replaced whole when the daemon applies a signed bundle
//! (`daemon/bundle.rs`): each question is answered by one policy, the old or the new, never a
//! mix of the two. The layers hold this (through `daemon/audit_gate.rs`), not a [`Policy`],
//! so a new revision reaches every one of them at the same moment.

use std::sync::{Arc, PoisonError, RwLock};

use super::Policy;
use crate::{
    config::McpConfig,
    decision::{CallQuery, Decision, Gate, ResultVerdict},
    registry::Registry,
};

/// One policy and what it was made from.
pub(crate) struct InForce {
    /// The rules.
    pub policy: Arc<Policy>,
    /// The `sandbox.mcp` it was built from (declared servers: how the daemon runs them).
    pub mcp: Arc<McpConfig>,
    /// The bundle's revision; `None` for the local file's policy.
    pub revision: Option<u64>,
}

/// The swappable policy.
pub(crate) struct LivePolicy {
    now: RwLock<Arc<InForce>>,
}

impl LivePolicy {
    pub(crate) fn new(first: InForce) -> Arc<Self> {
        Arc::new(LivePolicy {
            now: RwLock::new(Arc::new(first)),
        })
    }

    /// The policy in force now.
    pub(crate) fn now(&self) -> Arc<InForce> {
        self.now
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Puts `next` in force for every question asked from now on, with what the running
    /// policy learnt from listings (`Policy::take_over`: a tool a definition check hid stays
    /// hidden, and a listing the old policy is still judging is judged by `next` too).
    pub(crate) fn replace(&self, next: InForce) {
        let mut now = self.now.write().unwrap_or_else(PoisonError::into_inner);
        next.policy.take_over(&now.policy);
        *now = Arc::new(next);
    }

    /// The registry (one for every revision: definitions and pins outlive policies).
    pub(crate) fn registry(&self) -> Arc<Registry> {
        self.now().policy.registry().clone()
    }
}

impl Gate for LivePolicy {
    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
        self.now().policy.check_call(call)
    }

    fn needs_arguments(&self, call: &CallQuery<'_>) -> bool {
        self.now().policy.needs_arguments(call)
    }

    fn dispatched(
        &self,
        name: &str,
        arguments: &serde_json::Value,
    ) -> Option<(String, serde_json::Value)> {
        self.now().policy.dispatched(name, arguments)
    }

    fn declared_url(&self, server_id: &str) -> Option<String> {
        self.now().policy.declared_url(server_id)
    }

    fn inspect_result(
        &self,
        server_id: &str,
        tool: Option<&str>,
        message: &[u8],
    ) -> Option<ResultVerdict> {
        self.now().policy.inspect_result(server_id, tool, message)
    }

    fn check_listed(
        &self,
        server_id: &str,
        server_type: &str,
        tool: &serde_json::Value,
    ) -> Decision {
        self.now().policy.check_listed(server_id, server_type, tool)
    }

    fn check_listed_all(
        &self,
        server_id: &str,
        server_type: &str,
        tools: &[serde_json::Value],
    ) -> Vec<Decision> {
        self.now()
            .policy
            .check_listed_all(server_id, server_type, tools)
    }
}
