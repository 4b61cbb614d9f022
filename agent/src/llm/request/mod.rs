//! What the agent sends the model: the tools it offers, less the ones the policy
//! refuses by name ([`hide_denied`]; hosted tools the provider runs itself: `hosted.rs`,
//! `approvals.rs`), and the tool results in it, inspected by the same result
//! rules as at the MCP layer (`policy/results.rs`) before the model reads them.
//!
//! A tool's result reaches the model in the agent's next request: Anthropic `tool_result`
//! blocks (and `mcp_tool_result`), Chat Completions `role: "tool"` messages, Responses
//! `function_call_output` / `custom_tool_call_output` items, Gemini `functionResponse` parts. Each is judged as the tool's
//! result (the call it answers is found by id in the request, `pairing.rs`, its tool resolved by the
//! policy, so per-tool exemptions hold); redacted, its content is replaced in place; withheld,
//! it becomes a text saying why (an Anthropic block also `is_error: true`). A request with
//! changes is forwarded as toolwall's serialisation of what it parsed; one without, as the
//! bytes the agent sent. Every later request carries the same results again (the history):
//! they are judged again, and recorded once per call id.

use std::collections::HashSet;
use std::sync::Mutex;

use serde_json::Value;

use super::Dialect;
use crate::decision::{CallQuery, CallStage, Gate, ResultAction};
use crate::events::{Event, ResultInspected};

/// Largest request body an inspected route reads: the providers take at most 32 MB.
pub(crate) const MAX_REQUEST_BYTES: usize = 40 * 1024 * 1024;

/// Inspected request bodies judged at once (each parsed several times its size): the rest wait
/// their turn. A body is read whole before it takes a place, so a client that sends a body
/// slowly holds no place (its bytes count against `proxy.memory_budget_bytes` instead).
pub(crate) const MAX_READING: usize = 4;

/// Why a POST's path is refused, if it is: a path a provider's router could read as an
/// inspected route that toolwall's does not (`//`, dot segments, percent escapes, `;`
/// parameters, another case), so every POST toolwall forwards is routed one way.
pub(crate) fn ambiguous_path(path_and_query: &str) -> Option<String> {
    let path = path_and_query
        .split_once('?')
        .map_or(path_and_query, |(p, _)| p);
    let dotted = path
        .split('/')
        .any(|segment| segment == "." || segment == "..");
    let odd = path.contains("//") || path.contains(['%', ';', '\\']) || dotted;
    let lower = path.to_ascii_lowercase();
    let cased = lower != path
        && ["/messages", "/completions", "/responses", "/conversations"]
            .iter()
            .any(|r| lower.contains(r));
    (odd || cased).then(|| {
        format!(
            "the request path {path:?} could be routed differently by the provider (empty or dot segments, escapes, parameters or case); write it plainly"
        )
    })
}

/// Call ids whose findings were recorded; past the bound the set starts again (a call's
/// findings are then recorded once more, nothing is lost).
const MAX_REMEMBERED: usize = 16_384;

/// The call ids this proxy recorded findings for.
#[derive(Debug, Default)]
pub(crate) struct Recorded(Mutex<HashSet<String>>);

impl Recorded {
    /// Whether `id` is new (and now remembered).
    fn first(&self, id: &str) -> bool {
        let mut set = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if set.len() >= MAX_REMEMBERED {
            set.clear();
        }
        set.insert(id.to_owned())
    }
}

/// What became of a request.
#[derive(Debug, Default)]
pub(crate) struct Inspected {
    /// The request to forward instead of the agent's bytes; `None`: forward them as they are.
    pub body: Option<Vec<u8>>,
    /// `mcp_result_inspected` records (layer `llm`).
    pub records: Vec<Event>,
    /// Whether anything was changed.
    changed: bool,
}

/// How a request body is judged (`llm/routes.rs` names it per route).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// A request of the dialect, as its route takes it.
    Dialect(Dialect),
    /// OpenAI `/v1/conversations[/{id}/items]`: `items[]` are Responses input items the model
    /// reads once a response names the conversation.
    ConversationItems,
}

/// Why a request on an inspected route is not forwarded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    /// A body that does not parse.
    #[error(
        "the request body is not JSON toolwall can read ({0}); it is not forwarded, since what cannot be read cannot be judged"
    )]
    Unreadable(String),
    /// Hosted tools (the provider runs them) that cannot be judged, or are denied.
    #[error(transparent)]
    Hosted(#[from] hosted::Unjudgeable),
}

impl Refused {
    /// What the refusal records (an approval of a denied call: `mcp_tool_call_intercepted`).
    pub(crate) fn into_records(self) -> Vec<Event> {
        match self {
            Refused::Hosted(hosted::Unjudgeable::ApprovalDenied { record, .. }) => vec![*record],
            _ => Vec::new(),
        }
    }
}

/// Inspects the tool results of a request body on `route`, and the hosted tools it enables
/// (`hosted.rs`, `approvals.rs`). A body that does not parse is refused (a provider's parser
/// may read what ours could not — deeper nesting, say — and its model would read unjudged
/// results), and so is one enabling hosted tools toolwall cannot judge or approving a denied
/// hosted call.
pub(crate) fn inspect(
    gate: &dyn Gate,
    route: Route,
    body: &[u8],
    session: &str,
    recorded: &Recorded,
) -> Result<Inspected, Refused> {
    // Read strictly first (`mcp/canonical.rs`: no duplicate key, BOM or lone surrogate):
    // parsers disagree on which of two keys counts, and the provider's might keep the one
    // toolwall's would not.
    crate::mcp::canonical::canonical(body).map_err(|e| Refused::Unreadable(e.to_string()))?;
    let mut request =
        serde_json::from_slice::<Value>(body).map_err(|e| Refused::Unreadable(e.to_string()))?;
    let mut out = Inspected::default();
    match route {
        Route::Dialect(dialect) => {
            judge(gate, dialect, &mut request, "", session, recorded, &mut out)?;
        }
        Route::ConversationItems => {
            // `items` read as a Responses request's `input`.
            if let Some(object) = request.as_object_mut()
                && let Some(items) = object.remove("items")
            {
                let mut as_input = serde_json::json!({ "input": items });
                judge(
                    gate,
                    Dialect::OpenAiResponses,
                    &mut as_input,
                    "",
                    session,
                    recorded,
                    &mut out,
                )?;
                if let Some(items) = as_input.get_mut("input").map(Value::take) {
                    object.insert("items".to_owned(), items);
                }
            }
        }
    }
    if out.changed {
        out.body = serde_json::to_vec(&request).ok();
    }
    Ok(out)
}

/// Judges one request of `dialect` in place (`at`: its pointer in the body, for records).
fn judge(
    gate: &dyn Gate,
    dialect: Dialect,
    request: &mut Value,
    at: &str,
    session: &str,
    recorded: &Recorded,
    out: &mut Inspected,
) -> Result<(), hosted::Unjudgeable> {
    // Hosted definitions of any provider's shape, whatever the route: each shape is distinct,
    // and a provider reading one on a route toolwall took for another's must not run it.
    approvals::judge_approvals(gate, request, session)?;
    // Where the agent put its hosted servers, before denied ones are taken out.
    let hosted_urls = hosted_servers::hosted_urls(request);
    let hosted = hosted::judge_definitions(&hosted::Judge { gate }, request)?;
    if !hosted.is_empty() {
        tracing::info!(
            hidden = ?hosted,
            "denied hosted tools taken out of the request: the provider is not let run them"
        );
    }
    out.changed |= !hosted.is_empty();
    let (names, sites) = match dialect {
        Dialect::Anthropic => pairing::anthropic(request),
        Dialect::OpenAiChat => pairing::chat(request),
        Dialect::OpenAiResponses => pairing::responses(request),
        Dialect::Gemini => {
            gemini::known_shapes(request)?;
            gemini::known_tools(request)?;
            // countTokens may wrap a whole request: judged as one.
            for key in ["generateContentRequest", "generate_content_request"] {
                if let Some(inner) = request.get_mut(key) {
                    judge(
                        gate,
                        dialect,
                        inner,
                        &format!("{at}/{key}"),
                        session,
                        recorded,
                        out,
                    )?;
                }
            }
            gemini::found(request)
        }
    };
    let hidden = hide_denied(gate, dialect, request);
    if !hidden.is_empty() {
        tracing::info!(
            hidden = ?hidden,
            "denied tools taken out of the request: the model is not offered them"
        );
    }
    out.changed |= !hidden.is_empty();
    for site in sites {
        let Some(content) = request.pointer_mut(&site.pointer) else {
            continue;
        };
        // A hosted MCP result answers only a hosted call, any other result only the agent's.
        let call = names
            .get(&site.call_id)
            .filter(|call| call.hosted.is_some() == site.hosted);
        let (name, namespace) =
            call.map_or(("", None), |c| (c.name.as_str(), c.namespace.as_deref()));
        // The tool as the policy knows it (server and own name), for exemptions and the record;
        // a hosted call's only when its label is the policy's server's id, exactly, and the
        // request defines that label at the server's declared URL (`hosted_servers.rs`): not
        // another server a label holding `__` reads as, nor one of that name elsewhere.
        let identity = (!name.is_empty())
            .then(|| {
                gate.check_call(&CallQuery {
                    server_id: None,
                    name,
                    namespace,
                    stage: CallStage::Inspected,
                    arguments: None,
                })
                .tool
            })
            .flatten()
            .filter(|t| match call.and_then(|c| c.hosted.as_deref()) {
                None => true,
                Some(label) => {
                    t.server_id == label
                        && hosted_urls
                            .get(label)
                            .and_then(Option::as_deref)
                            .zip(gate.declared_url(&t.server_id))
                            .is_some_and(|(defined, declared)| {
                                crate::config::same_server_url(defined, &declared)
                            })
                }
            });
        let (server, tool) = match &identity {
            Some(t) => (t.server_id.as_str(), t.tool.as_str()),
            None => ("", name),
        };
        let Ok(text) = serde_json::to_vec(content) else {
            continue;
        };
        let Some(verdict) = gate.inspect_result(server, (!tool.is_empty()).then_some(tool), &text)
        else {
            continue;
        };
        tracing::warn!(server, tool, call = %site.call_id, action = verdict.action.as_str(), "tool result in a request to the model: {}", verdict.reason);
        if recorded.first(&format!("{}:{}", site.call_id, verdict.action.as_str())) {
            out.records.push(Event::McpResultInspected(ResultInspected {
                policy_revision: None,
                timestamp: chrono::Utc::now(),
                session_id: session.to_owned(),
                server_id: server.to_owned(),
                server_type: identity
                    .as_ref()
                    .map(|t| t.server_type.clone())
                    .unwrap_or_default(),
                tool_name: tool.to_owned(),
                jsonrpc_id: Value::String(site.call_id.clone()),
                action: match verdict.action {
                    ResultAction::Withhold => crate::decision::Action::Block,
                    _ => crate::decision::Action::Allow,
                },
                inspection: verdict.action,
                findings: verdict
                    .findings
                    .iter()
                    .cloned()
                    .map(|mut f| {
                        f.pointer = format!("{at}{}{}", site.pointer, f.pointer);
                        f
                    })
                    .collect(),
                findings_total: verdict.total,
                reason: verdict.reason.clone(),
                layer: "llm".to_owned(),
            }));
        }
        match verdict.action {
            ResultAction::Off | ResultAction::Alert => {}
            ResultAction::Redact => {
                if let Some(redacted) = verdict
                    .redacted
                    .and_then(|r| serde_json::from_slice::<Value>(&r).ok())
                {
                    *content = redacted;
                    out.changed = true;
                }
            }
            ResultAction::Withhold if dialect == Dialect::Gemini => {
                *content = gemini::withheld(&verdict.reason);
                out.changed = true;
            }
            ResultAction::Withhold => {
                *content =
                    Value::String(format!("toolwall withheld this result: {}", verdict.reason));
                if dialect == Dialect::Anthropic
                    && let Some(block) = site
                        .pointer
                        .strip_suffix("/content")
                        .and_then(|p| request.pointer_mut(p))
                        .and_then(Value::as_object_mut)
                {
                    block.insert("is_error".to_owned(), Value::Bool(true));
                }
                out.changed = true;
            }
        }
    }
    Ok(())
}

/// Takes the tools the policy refuses by name out of what the request offers the model
/// (the model is never offered what it may not call; the response side stays the
/// enforcement point): `tools[]` of every dialect (Chat's `function`/`custom` entries and
/// legacy `functions[]`; a definition holding `tools` of its own is a namespace, its name
/// the namespace of the ones inside, as Codex groups MCP tools; Anthropic `defer_loading`
/// definitions alike), and Anthropic `tool_reference` blocks (what Claude Code's
/// `ToolSearch` answers with) naming such a tool. A `tool_choice` that forces a removed tool
/// becomes `auto`; a `tools` left empty is removed with its `tool_choice`. Asked by name only
/// (no argument rule hides a tool) at the inspected stage (no rate budget is spent). Returns
/// the names taken out.
fn hide_denied(gate: &dyn Gate, dialect: Dialect, request: &mut Value) -> Vec<String> {
    let denied = |name: &str, namespace: Option<&str>| {
        !name.is_empty()
            && gate
                .check_call(&CallQuery {
                    server_id: None,
                    name,
                    namespace,
                    stage: CallStage::Inspected,
                    arguments: None,
                })
                .is_blocked()
    };
    if dialect == Dialect::Gemini {
        return gemini::hide_denied(request, &|name| denied(name, None));
    }
    let mut hidden = Vec::new();
    let Some(object) = request.as_object_mut() else {
        return hidden;
    };
    for key in ["tools", "functions"] {
        let Some(tools) = object.get_mut(key).and_then(Value::as_array_mut) else {
            continue;
        };
        prune(tools, None, &denied, &mut hidden);
        if tools.is_empty() {
            object.remove(key);
            object.remove("tool_choice");
            object.remove("function_call");
        }
    }
    if hidden.is_empty() {
        return hidden;
    }
    // A forced choice of a tool no longer offered.
    if let Some(choice) = object.get_mut("tool_choice") {
        let forced = choice
            .get("name")
            .or_else(|| choice.get("function").and_then(|f| f.get("name")))
            .and_then(Value::as_str);
        if forced.is_some_and(|n| hidden.iter().any(|h| h == n)) {
            *choice = match dialect {
                Dialect::Anthropic => serde_json::json!({"type": "auto"}),
                _ => Value::String("auto".to_owned()),
            };
        }
    }
    if dialect == Dialect::Anthropic {
        for message in object
            .get_mut("messages")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            for block in message
                .get_mut("content")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(content) = block.get_mut("content").and_then(Value::as_array_mut) {
                    content.retain(|b| {
                        str_at(b, "type") != "tool_reference"
                            || !hidden.iter().any(|h| h == str_at(b, "tool_name"))
                    });
                }
            }
        }
    }
    hidden
}

/// Removes the denied definitions of `tools` (recursing into namespaces), noting their names.
fn prune(
    tools: &mut Vec<Value>,
    namespace: Option<&str>,
    denied: &dyn Fn(&str, Option<&str>) -> bool,
    hidden: &mut Vec<String>,
) {
    tools.retain_mut(|tool| {
        let name = tool
            .get("function")
            .or_else(|| tool.get("custom"))
            .map_or_else(|| str_at(tool, "name"), |f| str_at(f, "name"))
            .to_owned();
        if let Some(inner) = tool.get_mut("tools").and_then(Value::as_array_mut) {
            prune(inner, Some(&name), denied, hidden);
            return !inner.is_empty();
        }
        if denied(&name, namespace) {
            hidden.push(name);
            return false;
        }
        true
    });
}

fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The elements of the array under `key`, with their indexes.
fn messages<'a>(request: &'a Value, key: &str) -> impl Iterator<Item = (usize, &'a Value)> {
    request
        .get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
}

mod approvals;
mod gemini;
mod hosted;
mod hosted_servers;
mod pairing;

pub(crate) use approvals::note_request as note_approval_request;

#[cfg(test)]
mod tests;
