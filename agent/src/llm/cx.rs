//! What the dialect machines share while they read one response: the gate they ask about each
//! tool call (at the stage it has reached), and the [`Record`]s of what was decided, which
//! become `mcp_tool_call_intercepted` events once the owner adds the time and ids.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{Dialect, Fatal, OnMalformed};
use crate::decision::{CallQuery, CallStage, Decision, Gate};
use crate::events::{Event, ToolCallIntercepted};

/// One tool call the interceptor decided about: what becomes a `mcp_tool_call_intercepted`
/// event once the caller adds the time and ids (the interceptors have no clock).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Record {
    /// Dialect of the response it was found in.
    pub dialect: Dialect,
    /// The name the model used (Codex's namespace joined: `mcp__srv__get_sum`).
    pub tool_name: String,
    /// The call id from the response.
    pub tool_call_id: String,
    /// Arguments, when complete (never assembled for a blocked streamed call).
    pub input: Option<Value>,
    /// The gate's answer.
    pub decision: Decision,
}

impl Record {
    /// The event to store.
    pub(crate) fn into_event(
        self,
        now: DateTime<Utc>,
        session_id: &str,
        request_id: &str,
    ) -> Event {
        let tool = self
            .decision
            .tool
            .unwrap_or_else(|| crate::decision::ToolIdentity {
                server_id: String::new(),
                server_type: String::new(),
                server_addr: String::new(),
                tool: String::new(),
                tool_hash: String::new(),
            });
        Event::McpToolCallIntercepted(ToolCallIntercepted {
            policy_revision: None,
            timestamp: now,
            session_id: session_id.to_owned(),
            request_id: request_id.to_owned(),
            dialect: self.dialect.as_str().to_owned(),
            tool_name: self.tool_name,
            server_tool: tool.tool,
            tool_call_id: self.tool_call_id,
            input: self.input,
            server_id: tool.server_id,
            server_type: tool.server_type,
            server_addr: tool.server_addr,
            tool_hash: tool.tool_hash,
            action: self.decision.action,
            reason: self.decision.reason,
        })
    }
}

/// What a stream interceptor needs from its owner, shared by the dialect machines.
pub(crate) struct Cx {
    pub(super) gate: Arc<dyn Gate>,
    pub(super) dialect: Dialect,
    pub(super) on_malformed: OnMalformed,
    pub(super) records: Vec<Record>,
}

impl Cx {
    pub(super) fn check(&self, name: &str, namespace: Option<&str>) -> Decision {
        self.check_at(name, namespace, CallStage::Proposed)
    }

    /// A second look at a name (another view of a call already asked about): same rules, no
    /// rate-limit budget spent.
    pub(super) fn inspect(&self, name: &str) -> Decision {
        self.check_at(name, None, CallStage::Inspected)
    }

    /// Whether argument rules may judge this call: a stream holds it until its arguments are
    /// whole, then asks [`Cx::check_complete`].
    pub(super) fn needs_arguments(&self, name: &str, namespace: Option<&str>) -> bool {
        self.gate.needs_arguments(&CallQuery {
            server_id: None,
            name,
            namespace,
            stage: CallStage::Proposed,
            arguments: None,
        })
    }

    /// A call whose arguments are whole: `arguments` is their JSON text (Anthropic's `input`,
    /// OpenAI's `arguments` string; `None` or blank: none). Parsed only when a rule reads them;
    /// arguments a rule reads that are not JSON are refused (fail closed).
    pub(super) fn check_complete(
        &self,
        name: &str,
        namespace: Option<&str>,
        arguments: Option<&str>,
    ) -> Decision {
        self.complete_at(name, namespace, arguments, CallStage::Proposed)
    }

    /// [`Cx::check_complete`] at `stage` (an inspection spends no budget).
    pub(super) fn complete_at(
        &self,
        name: &str,
        namespace: Option<&str>,
        arguments: Option<&str>,
        stage: CallStage,
    ) -> Decision {
        if !self.needs_arguments(name, namespace) {
            return self.check_at(name, namespace, stage);
        }
        let text = arguments.map(str::trim).filter(|t| !t.is_empty());
        let parsed = match text {
            None => Ok(Value::Object(serde_json::Map::new())),
            Some(text) => serde_json::from_str::<Value>(text),
        };
        match parsed {
            Ok(value) => self.gate.check_call(&CallQuery {
                server_id: None,
                name,
                namespace,
                stage,
                arguments: Some(&value),
            }),
            Err(error) => {
                let decision = self.check_at(name, namespace, stage);
                if decision.is_blocked() {
                    decision
                } else {
                    decision.overruled(format!(
                        "argument rules apply to {name:?} and its arguments are not JSON ({error}): refused, fail closed"
                    ))
                }
            }
        }
    }

    pub(super) fn check_at(
        &self,
        name: &str,
        namespace: Option<&str>,
        stage: CallStage,
    ) -> Decision {
        self.gate.check_call(&CallQuery {
            server_id: None,
            name,
            namespace,
            stage,
            arguments: None,
        })
    }

    /// Records a decision unless it is about a tool that is not MCP (allowed, no identity). A
    /// dispatcher's call is recorded as the call it makes (its name and arguments), so the
    /// record joins that call's execution.
    pub(super) fn record(
        &mut self,
        name: String,
        id: String,
        input: Option<Value>,
        decision: Decision,
    ) {
        if decision.tool.is_none() && !decision.is_blocked() {
            return;
        }
        let (name, input) = match input.as_ref().and_then(|i| self.gate.dispatched(&name, i)) {
            Some((inner, passed)) => (inner, Some(passed)),
            None => (name, input),
        };
        tracing::info!(
            dialect = self.dialect.as_str(),
            tool = %name,
            action = decision.action.as_str(),
            reason = %decision.reason,
            "tool call intercepted"
        );
        // An argument rule's `redact`: the record never holds those values.
        let input = match decision.redact.as_slice() {
            [] => input,
            pointers => input.map(|v| crate::policy::redacted(&v, pointers)),
        };
        self.records.push(Record {
            dialect: self.dialect,
            tool_name: name,
            tool_call_id: id,
            input,
            decision,
        });
    }

    /// Decides about an event that did not parse: `Ok` to pass it, `Err` to end the stream.
    pub(super) fn malformed(
        &self,
        err: &serde_json::Error,
        mentions_tool: bool,
    ) -> Result<(), Fatal> {
        tracing::warn!(dialect = self.dialect.as_str(), error = %err, mentions_tool, "malformed JSON in SSE event");
        // Valid JSON that our strict reading refuses (a repeated key, a field of the wrong
        // type) is no broken event: a client's parser reads it, its own way. That is the parser
        // differential itself, so it ends the stream whatever the setting.
        let valid_json = err.classify() == serde_json::error::Category::Data;
        if mentions_tool && (self.on_malformed == OnMalformed::FailClosed || valid_json) {
            Err(Fatal::new("malformed tool call event"))
        } else {
            Ok(())
        }
    }
}

/// Most bytes of an allowed call's arguments assembled to record them; past it the event is
/// recorded without `input` (the call itself still passes untouched).
pub(crate) const RECORD_INPUT_CAP: usize = 1 << 20;

/// Appends an argument fragment to be recorded, within [`RECORD_INPUT_CAP`]; a buffer that
/// would overflow is poisoned (set to a non-JSON marker) so no truncated input is recorded.
pub(crate) fn push_capped(buf: &mut String, part: &str) {
    if buf.len() + part.len() > RECORD_INPUT_CAP {
        buf.clear();
        buf.push_str("\0(too large)");
        buf.shrink_to_fit();
    } else if !buf.starts_with('\0') {
        buf.push_str(part);
    }
}
