//! The server's side of the filter: `tools/list` results lose their denied tools (each tool
//! judged and recorded as `mcp_tool_seen`), bounded in how many tools one result may hold.

use std::borrow::Cow;
use std::collections::HashSet;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::{Filter, FilterContext, IdKey, Probe, Request, error_response, first_token, offset_in};
use crate::decision::{Action, Decision, ResultAction, ResultVerdict};
use crate::events::{Event, ResultInspected, ToolSeen};
use crate::registry::tool_hash;

/// Most tools one `tools/list` result may hold: each new one is registered (a write) and
/// recorded, so a server listing 100,000 kept the daemon busy for an hour. The largest real
/// servers list a few hundred; a result above it is answered with an error, judged nothing.
pub(crate) const MAX_LISTED_TOOLS: usize = 2048;

/// JSON-RPC "Internal error": what a client gets for a tool list too large to judge.
const INTERNAL_ERROR: i64 = -32603;

/// What the client gets for a withheld response: a tool's result becomes a tool error (the
/// model reads why, as it reads any failed call), any other response a JSON-RPC error.
pub(super) fn withheld(id: &str, tool_result: bool, reason: &str) -> Vec<u8> {
    let text = format!("toolwall withheld this result: {reason}");
    if !tool_result {
        return error_response(id, INTERNAL_ERROR, &text);
    }
    let result = serde_json::json!({
        "content": [{"type": "text", "text": text}],
        "isError": true,
    });
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#).into_bytes()
}

#[derive(Deserialize)]
struct ListResult<'a> {
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
}

impl Filter {
    /// One server message: tool lists filtered, then what the result rules find in it
    /// (`policy/results.rs`) alerted, redacted or withheld.
    pub(super) fn server_one<'a>(&mut self, msg: &'a [u8]) -> Option<Cow<'a, [u8]>> {
        self.answering = None;
        let forward = self.server_lists(msg)?;
        let tool = self.answering.take();
        let ctx = self.ctx.clone();
        let Some(verdict) = ctx
            .gate
            .inspect_result(&ctx.server_id, tool.as_deref(), &forward)
        else {
            return Some(forward);
        };
        self.inspected(forward, tool, verdict)
    }

    /// Applies and records a result verdict on the (list-filtered) message `forward`.
    fn inspected<'a>(
        &mut self,
        forward: Cow<'a, [u8]>,
        tool: Option<String>,
        verdict: ResultVerdict,
    ) -> Option<Cow<'a, [u8]>> {
        #[derive(Deserialize)]
        struct Head<'a> {
            #[serde(borrow, default)]
            method: Option<&'a RawValue>,
            #[serde(borrow, default)]
            id: Option<&'a RawValue>,
        }
        let head = serde_json::from_slice::<Head<'_>>(&forward).ok();
        let id = head
            .as_ref()
            .and_then(|h| h.id)
            .map(|id| id.get().to_owned());
        let is_response = head.as_ref().is_some_and(|h| h.method.is_none());
        tracing::warn!(
            server = %self.ctx.server_id,
            tool = tool.as_deref().unwrap_or(""),
            action = verdict.action.as_str(),
            "{}",
            verdict.reason
        );
        if self.ctx.events.is_some() {
            self.records
                .push(Event::McpResultInspected(ResultInspected {
                    policy_revision: None,
                    timestamp: chrono::Utc::now(),
                    session_id: self.ctx.session_id.clone(),
                    server_id: self.ctx.server_id.clone(),
                    server_type: self.ctx.server_type.clone(),
                    tool_name: tool.clone().unwrap_or_default(),
                    jsonrpc_id: match verdict.id_holds_finding {
                        true => Value::String("[toolwall:redacted]".to_owned()),
                        false => id
                            .as_deref()
                            .and_then(|id| serde_json::from_str(id).ok())
                            .unwrap_or(Value::Null),
                    },
                    action: match verdict.action {
                        ResultAction::Withhold => Action::Block,
                        _ => Action::Allow,
                    },
                    inspection: verdict.action,
                    findings: verdict.findings,
                    findings_total: verdict.total,
                    reason: verdict.reason.clone(),
                    layer: self.ctx.layer.to_owned(),
                }));
        }
        match verdict.action {
            ResultAction::Off | ResultAction::Alert => Some(forward),
            ResultAction::Redact => Some(verdict.redacted.map_or(forward, Cow::Owned)),
            // A notification or a server's request is dropped (the server's request then
            // meets its own time-out); a response becomes an error the model can read.
            ResultAction::Withhold => match (is_response, id) {
                (true, Some(id)) => {
                    Some(Cow::Owned(withheld(&id, tool.is_some(), &verdict.reason)))
                }
                _ => None,
            },
        }
    }

    fn server_lists<'a>(&mut self, msg: &'a [u8]) -> Option<Cow<'a, [u8]>> {
        let probe = match serde_json::from_slice::<Probe<'_>>(msg) {
            Ok(p) if first_token(msg) == Some(b'{') => p,
            _ => {
                tracing::warn!("dropping an unparseable message from the MCP server");
                return None;
            }
        };
        if let Some(method) = probe.method.as_deref() {
            if method == "notifications/tools/list_changed" {
                tracing::info!(
                    "server says its tool list changed: new tools are callable once a tools/list judged them"
                );
            }
            return Some(Cow::Borrowed(msg));
        }
        // The request this response answers (its id parsed only while one is outstanding);
        // a call's result is known as its tool's. Only an answer to one of this filter's own
        // requests counts toward the responses its stream owes: one that answers another
        // request (a server routing by an id it takes for another) completes nothing.
        let mut anew = false;
        if !self.pending.is_empty()
            && let Some(key) = probe.id.and_then(|id| IdKey::of(id.get()))
            && let Some(request) = self.pending.end(&key)
        {
            self.responses += 1;
            match request {
                Request::Call(tool) => self.answering = Some(tool),
                Request::List { first } => anew = first,
                Request::Other => {}
            }
        }
        // Every result with a top-level `tools` field is treated as a tool list, tracked or
        // not: the client decides what a response means by its id, and ids can be spelled in
        // ways (`1` vs `1.0`) that an exact match would miss.
        let Some(result) = probe
            .result
            .filter(|r| first_token(r.get().as_bytes()) == Some(b'{'))
        else {
            return Some(Cow::Borrowed(msg));
        };
        let tools = match serde_json::from_str::<ListResult<'_>>(result.get()) {
            Ok(ListResult { tools: Some(tools) }) => tools,
            Ok(ListResult { tools: None }) => return Some(Cow::Borrowed(msg)),
            Err(_) => {
                tracing::warn!("dropping a response whose result cannot be parsed");
                return None;
            }
        };
        self.filter_list(msg, probe.id, tools, anew)
    }

    fn filter_list<'a>(
        &mut self,
        msg: &'a [u8],
        id: Option<&RawValue>,
        tools: &RawValue,
        anew: bool,
    ) -> Option<Cow<'a, [u8]>> {
        let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(tools.get()) else {
            tracing::warn!("dropping a tools/list result whose tools are not an array");
            return None;
        };
        if items.len() > MAX_LISTED_TOOLS {
            let why = format!(
                "toolwall: the server listed {} tools in one result; at most {MAX_LISTED_TOOLS} are judged (none of these were)",
                items.len()
            );
            tracing::warn!(server = %self.ctx.server_id, "{why}");
            return Some(Cow::Owned(error_response(
                id.map_or("null", RawValue::get),
                INTERNAL_ERROR,
                &why,
            )));
        }
        let mut kept: Vec<&str> = Vec::with_capacity(items.len());
        let mut listed = HashSet::new();
        for item in &items {
            let value: Value = serde_json::from_str(item.get()).unwrap_or(Value::Null);
            let decision =
                self.ctx
                    .gate
                    .check_listed(&self.ctx.server_id, &self.ctx.server_type, &value);
            if !decision.is_blocked() {
                kept.push(item.get());
                if let Some(name) = value.get("name").and_then(Value::as_str) {
                    listed.insert(name.to_owned());
                }
            }
            self.record_seen(&value, &decision);
        }
        // The message's turn: taken as it arrived, else now (by its first list; the others of
        // a batch share it).
        let turn = match self.turn {
            Some(turn) => turn,
            None => {
                let turn = self.listing().turn();
                self.turn = Some(turn);
                turn
            }
        };
        let mut listing = self.listing();
        // A list that came before the one applied (judged off the proxy's thread, done later)
        // does not replace it: the session keeps the newer one. A listing's first page begins
        // the session's list anew (a tool the server no longer lists is no longer callable);
        // its later pages add to it.
        if turn >= listing.applied {
            listing.applied = turn;
            match (anew, &mut listing.names) {
                (false, Some(names)) => names.extend(listed),
                _ => listing.names = Some(listed),
            }
        }
        drop(listing);
        if kept.len() == items.len() {
            return Some(Cow::Borrowed(msg));
        }
        let Some(start) = offset_in(msg, tools.get()) else {
            tracing::error!("tools array is not inside its message; dropping the message");
            return None;
        };
        let end = start + tools.get().len();
        let mut out = Vec::with_capacity(msg.len());
        out.extend_from_slice(&msg[..start]);
        out.push(b'[');
        for (i, tool) in kept.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(tool.as_bytes());
        }
        out.push(b']');
        out.extend_from_slice(&msg[end..]);
        Some(Cow::Owned(out))
    }

    fn record_seen(&mut self, tool: &Value, decision: &Decision) {
        if self.ctx.events.is_some() {
            self.records.push(seen(&self.ctx, tool, decision));
        }
    }
}

/// The `mcp_tool_seen` record of a listed tool.
fn seen(ctx: &FilterContext, tool: &Value, decision: &Decision) -> Event {
    let hash = decision
        .tool
        .as_ref()
        .map(|t| t.tool_hash.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| tool_hash(tool));
    Event::McpToolSeen(ToolSeen {
        policy_revision: None,
        timestamp: chrono::Utc::now(),
        session_id: ctx.session_id.clone(),
        server_id: ctx.server_id.clone(),
        server_type: ctx.server_type.clone(),
        tool_name: tool
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        tool_hash: hash,
        action: decision.action,
        reason: decision.reason.clone(),
    })
}

/// Filters a tool list fetched by toolwall itself (the proxy's start-up list, discovery):
/// registers each tool with the gate; returns the allowed ones and the `mcp_tool_seen`
/// records (for the caller's sink).
pub(crate) fn allowed_tools(ctx: &FilterContext, tools: Vec<Value>) -> (Vec<Value>, Vec<Event>) {
    let mut records = Vec::new();
    let allowed = tools
        .into_iter()
        .filter(|tool| {
            let decision = ctx
                .gate
                .check_listed(&ctx.server_id, &ctx.server_type, tool);
            if ctx.events.is_some() {
                records.push(seen(ctx, tool, &decision));
            }
            decision.action == Action::Allow
        })
        .collect();
    (allowed, records)
}
