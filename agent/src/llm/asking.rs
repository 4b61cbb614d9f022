//! The LLM layer's side of asking a person (`approval.rs`): a call the model proposes that an
//! argument rule asks about is held — the response stops there — until a person answers, and
//! then goes on to the agent or is replaced like any blocked call.
//!
//! The dialect machines judge synchronously inside the response body's poll (`llm/relay.rs`),
//! so the wait happens there: [`tokio::task::block_in_place`] hands the worker's other tasks
//! to another thread while this one waits (at most `approval.timeout_secs`, at most
//! `approval.max_pending` at once). Only the daemon's multi-threaded runtime can do that; on
//! any other the call is refused, never waved through.

use std::sync::Arc;

use crate::approval::{Approvals, Call};
use crate::decision::{CallQuery, CallStage, Decision, Gate, ResultVerdict};

/// The proxy's gate for one exchange: the policy, with asked calls put to a person.
pub(crate) struct AskingGate {
    pub(crate) inner: Arc<dyn Gate>,
    pub(crate) approvals: Arc<Approvals>,
    /// The exchange's session (an approval lets the same call run once in it).
    pub(crate) session: String,
}

impl AskingGate {
    fn wait(&self, call: &CallQuery<'_>, decision: Decision) -> Decision {
        use tokio::runtime::{Handle, RuntimeFlavor};
        let Ok(handle) = Handle::try_current() else {
            return refuse(decision, "no runtime to wait on");
        };
        if handle.runtime_flavor() != RuntimeFlavor::MultiThread {
            return refuse(decision, "this runtime cannot wait without stopping others");
        }
        let (id, answer) = tokio::task::block_in_place(|| {
            handle.block_on(self.approvals.ask(Call {
                layer: "llm",
                session_id: &self.session,
                stage: CallStage::Proposed,
                decision: &decision,
                arguments: call.arguments,
            }))
        });
        answer.settle(id.as_ref(), decision)
    }
}

fn refuse(mut decision: Decision, why: &str) -> Decision {
    if let Some(ask) = decision.ask.take() {
        decision.reason = format!("{ask}; no one can be asked here ({why}): refused");
    }
    decision
}

impl Gate for AskingGate {
    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
        let decision = self.inner.check_call(call);
        match (&decision.ask, call.stage) {
            // Asked once, when the model proposes it; a second look (the backstop) judges
            // names only, where no argument rule applies.
            (Some(_), CallStage::Proposed) => self.wait(call, decision),
            (Some(_), _) => refuse(decision, "only a proposed call is put to a person"),
            (None, _) => decision,
        }
    }

    fn needs_arguments(&self, call: &CallQuery<'_>) -> bool {
        self.inner.needs_arguments(call)
    }

    fn dispatched(
        &self,
        name: &str,
        arguments: &serde_json::Value,
    ) -> Option<(String, serde_json::Value)> {
        self.inner.dispatched(name, arguments)
    }

    fn declared_url(&self, server_id: &str) -> Option<String> {
        self.inner.declared_url(server_id)
    }

    fn inspect_result(
        &self,
        server_id: &str,
        tool: Option<&str>,
        message: &[u8],
    ) -> Option<ResultVerdict> {
        self.inner.inspect_result(server_id, tool, message)
    }

    fn check_listed(
        &self,
        server_id: &str,
        server_type: &str,
        tool: &serde_json::Value,
    ) -> Decision {
        self.inner.check_listed(server_id, server_type, tool)
    }

    fn check_listed_all(
        &self,
        server_id: &str,
        server_type: &str,
        tools: &[serde_json::Value],
    ) -> Vec<Decision> {
        self.inner.check_listed_all(server_id, server_type, tools)
    }
}
