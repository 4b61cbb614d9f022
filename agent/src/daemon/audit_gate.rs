//! The policy as the daemon's layers ask it, with the audit in the question: while the event
//! store cannot write (disk full, read-only; `events::StoreHealth`), an MCP tool call that
//! would be allowed is refused under `store.on_failure: block` (the default) — a call that
//! cannot be recorded does not run (otherwise calls would go on, answered as recorded, while
//! nothing was). `queue` lets it run; its events wait in memory.

use std::sync::Arc;

use crate::config::OnStoreFailure;
use crate::decision::{CallQuery, Decision, Gate};
use crate::events::StoreHealth;
use crate::policy::LivePolicy;

pub(crate) struct AuditGate {
    policy: Arc<LivePolicy>,
    health: Arc<StoreHealth>,
    on_failure: OnStoreFailure,
}

impl AuditGate {
    pub(crate) fn shared(
        policy: Arc<LivePolicy>,
        health: Arc<StoreHealth>,
        on_failure: OnStoreFailure,
    ) -> Arc<dyn Gate> {
        Arc::new(AuditGate {
            policy,
            health,
            on_failure,
        })
    }
}

impl Gate for AuditGate {
    fn needs_arguments(&self, call: &CallQuery<'_>) -> bool {
        self.policy.needs_arguments(call)
    }

    fn dispatched(
        &self,
        name: &str,
        arguments: &serde_json::Value,
    ) -> Option<(String, serde_json::Value)> {
        self.policy.dispatched(name, arguments)
    }

    fn declared_url(&self, server_id: &str) -> Option<String> {
        self.policy.declared_url(server_id)
    }

    fn inspect_result(
        &self,
        server_id: &str,
        tool: Option<&str>,
        message: &[u8],
    ) -> Option<crate::decision::ResultVerdict> {
        self.policy.inspect_result(server_id, tool, message)
    }

    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
        let decision = self.policy.check_call(call);
        // Native tools of the agent (no server, not a registered tool) are not ours to record.
        let mcp = decision.tool.is_some() || call.server_id.is_some();
        // An asked call is a block only until someone approves it: the store is judged now.
        let refused = decision.is_blocked() && decision.ask.is_none();
        if refused || !mcp || self.on_failure != OnStoreFailure::Block {
            return decision;
        }
        match self.health.failing() {
            None => decision,
            Some(why) => decision.overruled(format!(
                "the event store cannot record this call ({why}); refused under store.on_failure: block"
            )),
        }
    }

    fn check_listed(
        &self,
        server_id: &str,
        server_type: &str,
        tool: &serde_json::Value,
    ) -> Decision {
        self.policy.check_listed(server_id, server_type, tool)
    }

    fn check_listed_all(
        &self,
        server_id: &str,
        server_type: &str,
        tools: &[serde_json::Value],
    ) -> Vec<Decision> {
        self.policy.check_listed_all(server_id, server_type, tools)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::decision::CallStage;
    use crate::registry::Registry;

    fn gate(on_failure: OnStoreFailure, health: Arc<StoreHealth>) -> Arc<dyn Gate> {
        let registry = Arc::new(Registry::in_memory().expect("registry"));
        let config = Config::default();
        let policy = crate::policy::Policy::new(&config, registry, &[]).expect("policy");
        let live = LivePolicy::new(crate::policy::InForce {
            policy: Arc::new(policy),
            mcp: Arc::new(config.sandbox.mcp),
            revision: None,
        });
        AuditGate::shared(live, health, on_failure)
    }

    fn call(server: Option<&str>) -> CallQuery<'_> {
        CallQuery {
            server_id: server,
            name: "read_file",
            namespace: None,
            stage: CallStage::Executing,
            arguments: None,
        }
    }

    #[test]
    fn a_call_the_store_cannot_record_is_refused_unless_queued() {
        let health = Arc::new(StoreHealth::default());
        let block = gate(OnStoreFailure::Block, health.clone());
        let queue = gate(OnStoreFailure::Queue, health.clone());
        assert!(!block.check_call(&call(Some("files"))).is_blocked());
        health.set_failing_for_test("database or disk is full");
        let refused = block.check_call(&call(Some("files")));
        assert!(refused.is_blocked());
        assert!(
            refused.reason.contains("database or disk is full"),
            "{refused:?}"
        );
        assert!(!queue.check_call(&call(Some("files"))).is_blocked());
        // Not an MCP call: nothing of ours to record.
        assert!(!block.check_call(&call(None)).is_blocked());
    }
}
