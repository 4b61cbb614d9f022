//! Dispatcher tools: a tool whose arguments name another tool and carry that tool's arguments
//! (Qwen Code offers MCP tools through `tool_call {"name": "mcp__s__t", "arguments": {…}}`) is
//! a call of the tool it names. It is judged as that call, by name and by its arguments' rules,
//! once its arguments are whole (`needs_arguments` holds it until then); it is recorded as that
//! call (`Gate::dispatched`), so the record joins the call's execution. `tool_call` is built in;
//! `sandbox.mcp.dispatchers` adds others of the same shape.

use serde_json::{Map, Value};

use super::Policy;
use crate::decision::{Action, CallQuery, CallStage, Decision};

/// Qwen Code's.
pub(super) const BUILT_IN: &[&str] = &["tool_call"];

/// The tool a dispatcher call names and the arguments it passes, or what is wrong with it.
pub(super) fn inner(arguments: &Value) -> Result<(String, Value), &'static str> {
    let name = arguments
        .get("name")
        .and_then(Value::as_str)
        .ok_or("names no tool (a string `name`)")?;
    let passed = match arguments.get("arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        // Some models send the arguments as JSON text.
        Some(Value::String(text)) => {
            serde_json::from_str(text).map_err(|_| "passes `arguments` text that is not JSON")?
        }
        Some(other) => other.clone(),
    };
    Ok((name.to_owned(), passed))
}

fn refused(reason: String) -> Decision {
    Decision {
        action: Action::Block,
        reason,
        tool: None,
        redact: Vec::new(),
        ask: None,
    }
}

impl Policy {
    /// Whether `call` is of a dispatcher (by the name the model gave it).
    pub(super) fn is_dispatcher(&self, call: &CallQuery<'_>) -> bool {
        call.server_id.is_none()
            && call.namespace.is_none()
            && self.dispatchers.iter().any(|d| d == call.name)
    }

    /// Judges a dispatcher call as the call it makes. Without its arguments it is no call yet:
    /// a second look (the request side, the backstop) lets the dispatcher itself be, a proposal
    /// is refused (every dialect holds it until its arguments are whole).
    pub(super) fn check_dispatched(&self, call: &CallQuery<'_>) -> Decision {
        let name = call.name;
        let Some(arguments) = call.arguments else {
            return if call.stage == CallStage::Inspected {
                Decision::not_mcp()
            } else {
                refused(format!(
                    "{name:?} is a dispatcher, judged as the tool it names, and its arguments were not read: refused, fail closed"
                ))
            };
        };
        match inner(arguments) {
            Err(why) => refused(format!(
                "the dispatcher call {name:?} {why}: refused, fail closed"
            )),
            Ok((tool, _)) if self.dispatchers.contains(&tool) => refused(format!(
                "the dispatcher call {name:?} names the dispatcher {tool:?}: refused, fail closed"
            )),
            Ok((tool, passed)) => self.check_call_inner(&CallQuery {
                server_id: None,
                name: &tool,
                namespace: None,
                stage: call.stage,
                arguments: Some(&passed),
            }),
        }
    }

    /// The call a dispatcher call makes, for its record.
    pub(super) fn dispatched_call(&self, name: &str, arguments: &Value) -> Option<(String, Value)> {
        if !self.dispatchers.iter().any(|d| d == name) {
            return None;
        }
        inner(arguments).ok()
    }
}
