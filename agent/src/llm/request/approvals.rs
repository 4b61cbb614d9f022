//! OpenAI Responses `mcp_approval_response` items: an approval makes the provider run the
//! hosted MCP call its `mcp_approval_request` proposed, so it is forwarded only when toolwall
//! can judge that call and the policy allows it. The call is found by `approval_request_id`
//! among the request's `input` items, or among the approval requests this process judged in
//! responses ([`note_request`], a bounded memory); an approval of a call refused either way,
//! or of one found nowhere, refuses the request. A denial (`approve: false`) always passes.

use std::collections::{HashMap, VecDeque};
use std::sync::{LazyLock, Mutex, PoisonError};

use serde_json::Value;

use super::hosted::{Unjudgeable, mcp_name};
use crate::decision::{CallQuery, CallStage, Decision, Gate};
use crate::llm::{Dialect, Record};

/// Approval requests remembered; past the bound the oldest are forgotten (an approval of one
/// must then carry its request in `input`).
const MAX_SEEN: usize = 16_384;

/// What the response side decided about an approval request.
#[derive(Clone, Debug)]
enum Verdict {
    Allowed { server: String, tool: String },
    Blocked { server: String, tool: String },
}

#[derive(Default)]
struct Seen {
    order: VecDeque<String>,
    verdicts: HashMap<String, Verdict>,
}

/// The approval requests judged in responses, by id: shared by every proxy of the process, as
/// an approval may come on another connection than the response that asked for it.
static SEEN: LazyLock<Mutex<Seen>> = LazyLock::new(Mutex::default);

/// Notes how the response side decided the approval request `id` (of `tool` on `server`). A
/// refusal stays: the same id later allowed (another copy of the item) is still refused.
pub(crate) fn note_request(id: &str, server: &str, tool: &str, blocked: bool) {
    if id.is_empty() {
        return;
    }
    let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    if matches!(seen.verdicts.get(id), Some(Verdict::Blocked { .. })) {
        return;
    }
    let (server, tool) = (server.to_owned(), tool.to_owned());
    let verdict = if blocked {
        Verdict::Blocked { server, tool }
    } else {
        Verdict::Allowed { server, tool }
    };
    if seen.verdicts.insert(id.to_owned(), verdict).is_none() {
        seen.order.push_back(id.to_owned());
        while seen.order.len() > MAX_SEEN {
            if let Some(old) = seen.order.pop_front() {
                seen.verdicts.remove(&old);
            }
        }
    }
}

fn seen(id: &str) -> Option<Verdict> {
    SEEN.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .verdicts
        .get(id)
        .cloned()
}

fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// Judges every approving `mcp_approval_response` of `input[]`.
pub(super) fn judge_approvals(
    gate: &dyn Gate,
    request: &Value,
    session: &str,
) -> Result<(), Unjudgeable> {
    let Some(input) = request.get("input").and_then(Value::as_array) else {
        return Ok(());
    };
    // A request that continues a stored response or conversation: the provider approves the
    // approval request it stored, whatever copy the input holds, so only what the proxy itself
    // saw and allowed in a response is taken.
    let stored = ["previous_response_id", "conversation"]
        .iter()
        .any(|k| request.get(*k).is_some_and(|v| !v.is_null()));
    for item in input {
        // Anything but an explicit `false` is read as an approval (fail closed).
        if str_at(item, "type") != "mcp_approval_response"
            || item.get("approve") == Some(&Value::Bool(false))
        {
            continue;
        }
        let id = str_at(item, "approval_request_id");
        let remembered = seen(id);
        let copies: Vec<&Value> = input
            .iter()
            .filter(|i| str_at(i, "type") == "mcp_approval_request" && str_at(i, "id") == id)
            .collect();
        if let Some(Verdict::Blocked { server, tool }) = &remembered {
            let arguments = copies.first().and_then(|c| identity(c).2);
            let decision = ask(gate, server, tool, None);
            return Err(refused(
                id, server, tool, arguments, decision, session, true,
            ));
        }
        if copies.is_empty() || stored {
            let Some(Verdict::Allowed { server, tool }) = remembered else {
                return Err(Unjudgeable::ApprovalUnknown { id: id.to_owned() });
            };
            // Allowed when the response proposed it (a person may have approved it there);
            // asked again by name, the policy may have changed since.
            let decision = ask(gate, &server, &tool, None);
            if decision.is_blocked() {
                return Err(refused(id, &server, &tool, None, decision, session, false));
            }
            continue;
        }
        for copy in copies {
            let (server, tool, arguments) = identity(copy);
            let same_as_seen = matches!(&remembered, Some(Verdict::Allowed { server: s, tool: t }) if s == server && t == tool);
            // A copy the response side allowed as it stands was judged on its arguments there;
            // any other is judged here, arguments included (a rule that would ask a person
            // refuses: no one is asked about a request).
            let decision = if same_as_seen {
                ask(gate, server, tool, None)
            } else {
                ask(gate, server, tool, Some(arguments.unwrap_or_default()))
            };
            if decision.is_blocked() {
                return Err(refused(
                    id, server, tool, arguments, decision, session, false,
                ));
            }
        }
    }
    Ok(())
}

/// Server, tool and arguments of an `mcp_approval_request` item.
fn identity(item: &Value) -> (&str, &str, Option<&str>) {
    (
        str_at(item, "server_label"),
        str_at(item, "name"),
        item.get("arguments").and_then(Value::as_str),
    )
}

/// The gate's answer for `tool` of `server` at the inspected stage, with `arguments` (JSON
/// text) when argument rules apply and they are given.
fn ask(gate: &dyn Gate, server: &str, tool: &str, arguments: Option<&str>) -> Decision {
    let name = mcp_name(server, tool);
    let mut query = CallQuery {
        server_id: None,
        name: &name,
        namespace: None,
        stage: CallStage::Inspected,
        arguments: None,
    };
    let Some(text) = arguments.filter(|_| gate.needs_arguments(&query)) else {
        return gate.check_call(&query);
    };
    let text = text.trim();
    let parsed = if text.is_empty() {
        Ok(Value::Object(serde_json::Map::new()))
    } else {
        serde_json::from_str::<Value>(text)
    };
    match parsed {
        Ok(value) => {
            query.arguments = Some(&value);
            gate.check_call(&query)
        }
        Err(e) => {
            let decision = gate.check_call(&query);
            if decision.is_blocked() {
                decision
            } else {
                decision.overruled(format!(
                    "argument rules apply to {name:?} and its arguments are not JSON ({e}): refused, fail closed"
                ))
            }
        }
    }
}

/// The refusal of an approval, with its `mcp_tool_call_intercepted` record.
fn refused(
    id: &str,
    server: &str,
    tool: &str,
    arguments: Option<&str>,
    mut decision: Decision,
    session: &str,
    refused_before: bool,
) -> Unjudgeable {
    if refused_before {
        decision = decision.overruled(format!(
            "toolwall refused the approval request {id:?} in the response that proposed it"
        ));
    }
    let name = mcp_name(server, tool);
    tracing::warn!(tool = name, approval_request = id, reason = %decision.reason, "approval of a denied hosted MCP call refused");
    let reason = decision.reason.clone();
    let record = Record {
        dialect: Dialect::OpenAiResponses,
        tool_name: name.clone(),
        tool_call_id: id.to_owned(),
        input: arguments
            .and_then(|a| serde_json::from_str::<Value>(a).ok())
            .map(|v| match decision.redact.as_slice() {
                [] => v,
                pointers => crate::policy::redacted(&v, pointers),
            }),
        decision,
    }
    .into_event(chrono::Utc::now(), session, "");
    Unjudgeable::ApprovalDenied {
        id: id.to_owned(),
        tool: name,
        reason,
        record: Box::new(record),
    }
}
