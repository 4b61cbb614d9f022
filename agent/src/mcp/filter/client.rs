//! The client's side of the filter: each message read strictly and passed on canonically,
//! each `tools/call` judged (refused, held for a person, or passed on and recorded), and a
//! held call settled once a person answered.

use std::borrow::Cow;

use serde_json::Value;
use serde_json::value::RawValue;

use super::{
    CallParams, Filter, Held, INVALID_PARAMS, INVALID_REQUEST, IdKey, Outcome, PARSE_ERROR, Probe,
    Request, batch, canonical, error_response, first_token, progress_token, unknown_tool,
};
use crate::decision::{Action, CallQuery, CallStage, Decision};
use crate::events::{Event, ToolCalled};

/// The params of `notifications/cancelled`.
#[derive(serde::Deserialize)]
struct Cancelled<'a> {
    #[serde(rename = "requestId", borrow)]
    request_id: &'a RawValue,
}

impl Filter {
    /// A message (one line without `\n`, or one HTTP body / SSE `data`) from the client.
    ///
    /// What is forwarded is never the client's bytes: the message is read strictly and
    /// written out canonically (`mcp/canonical.rs`), and that text is what the filter judges and
    /// what the server gets. A message that cannot be read that way gets a parse error and is
    /// not forwarded; one of only whitespace is dropped.
    pub(crate) fn on_client(&mut self, msg: &[u8]) -> Outcome<'static> {
        let mut out = Outcome::default();
        let text = match canonical::canonical(msg) {
            Ok(Some(text)) => text,
            Ok(None) => return out,
            Err(error) => {
                tracing::warn!(%error, "refused a client message that cannot be read strictly");
                out.replies.push(error_response(
                    "null",
                    PARSE_ERROR,
                    &format!("Parse error: {error}"),
                ));
                return out;
            }
        };
        // `Some(None)`: forward the canonical text as it is; `Some(Some(v))`: what is left of
        // it once refused calls were taken out.
        let kept = match self.judge_client(&text, &mut out.replies) {
            None => None,
            Some(Cow::Borrowed(_)) => Some(None),
            Some(Cow::Owned(v)) => Some(Some(v)),
        };
        out.forward = kept.map(|k| Cow::Owned(k.unwrap_or(text)));
        out.records = std::mem::take(&mut self.records);
        out.held = std::mem::take(&mut self.held);
        out
    }

    /// A held call's end: forwarded (recorded as allowed) when approved, else refused with
    /// the reason; `approval` is the question's id.
    pub(crate) fn settle(
        &mut self,
        held: Held,
        approval: Option<crate::approval::QuestionId>,
        answer: &crate::approval::Answer,
    ) -> Outcome<'static> {
        let decision = answer.settle(approval.as_ref(), held.decision);
        let mut out = Outcome::default();
        let arguments = held
            .arguments
            .as_ref()
            .map(serde_json::value::to_raw_value)
            .transpose()
            .ok()
            .flatten();
        let params = CallParams {
            name: Cow::Borrowed(&held.name),
            arguments: arguments.as_deref(),
        };
        self.record_call(&params, Some(&held.id), &decision, held.arguments.as_ref());
        if decision.is_blocked() || *answer == crate::approval::Answer::Withdrawn {
            // Noted as outstanding while it was held; answered here, or by no one.
            if let Some(key) = IdKey::of(&held.id) {
                self.pending.end(&key);
            }
        }
        if *answer == crate::approval::Answer::Withdrawn {
            // No one is left to tell.
        } else if decision.is_blocked() {
            tracing::info!(tool = %held.name, reason = %decision.reason, "refused tools/call");
            out.replies.push(error_response(
                &held.id,
                INVALID_PARAMS,
                &format!("toolwall: {}", decision.reason),
            ));
        } else {
            self.requests += 1;
            out.forward = Some(Cow::Owned(held.message));
        }
        out.records = std::mem::take(&mut self.records);
        out
    }

    /// Judges a canonical client message (`mcp/canonical.rs`); `Borrowed` means all of it passes.
    fn judge_client<'a>(
        &mut self,
        msg: &'a [u8],
        replies: &mut Vec<Vec<u8>>,
    ) -> Option<Cow<'a, [u8]>> {
        match msg.first() {
            Some(b'{') => self.client_one(msg, replies),
            Some(b'[') => match serde_json::from_slice::<Vec<&RawValue>>(msg) {
                Ok(items) if !items.is_empty() => {
                    self.in_batch = true;
                    let kept = batch(msg, &items, |item| self.client_one(item, replies));
                    self.in_batch = false;
                    kept
                }
                Ok(_) => {
                    replies.push(error_response("null", INVALID_REQUEST, "Invalid Request"));
                    None
                }
                Err(_) => {
                    replies.push(error_response("null", PARSE_ERROR, "Parse error"));
                    None
                }
            },
            _ => {
                replies.push(error_response("null", INVALID_REQUEST, "Invalid Request"));
                None
            }
        }
    }

    fn client_one<'a>(
        &mut self,
        msg: &'a [u8],
        replies: &mut Vec<Vec<u8>>,
    ) -> Option<Cow<'a, [u8]>> {
        let probe = match serde_json::from_slice::<Probe<'_>>(msg) {
            Ok(p) if first_token(msg) == Some(b'{') => p,
            // Refused, not forwarded: the server's parser might accept what ours did not
            // (duplicate keys, an array element that is not an object) and find a call in it.
            _ => {
                replies.push(error_response("null", PARSE_ERROR, "Parse error"));
                return None;
            }
        };
        let id = probe.id.map(RawValue::get);
        // A request (a method and an id): its id one JSON-RPC allows, and not that of a request
        // still outstanding (`filter/pending.rs`).
        let key = match (&probe.method, id) {
            (Some(_), Some(raw)) => {
                let Some(key) = IdKey::of(raw) else {
                    replies.push(error_response(
                        "null",
                        INVALID_REQUEST,
                        "Invalid Request: an id is a string or a number",
                    ));
                    return None;
                };
                if let Some(why) = self.pending.refusal(&key, raw) {
                    tracing::warn!(id = raw, "refused a request: {why}");
                    replies.push(error_response(raw, INVALID_REQUEST, &why));
                    return None;
                }
                Some(key)
            }
            _ => None,
        };
        // What the request is to the results that answer it.
        let mut request = Request::Other;
        let forward = match probe.method.as_deref() {
            Some("tools/call") => {
                let params = probe
                    .params
                    .and_then(|p| serde_json::from_str::<CallParams<'_>>(p.get()).ok());
                let Some(params) = params else {
                    if let Some(id) = id {
                        replies.push(error_response(id, INVALID_PARAMS, "Invalid params"));
                    }
                    return None;
                };
                let unlisted = {
                    let listing = self.listing();
                    match &listing.names {
                        Some(names) => !names.contains(params.name.as_ref()),
                        None => listing.required,
                    }
                };
                // An unlisted tool is asked of the policy without spending its budget, so a
                // denied one is recorded with the rule that denies it.
                let ctx = self.ctx.clone();
                let mut query = CallQuery {
                    server_id: Some(&ctx.server_id),
                    name: &params.name,
                    namespace: None,
                    stage: match unlisted {
                        true => CallStage::Inspected,
                        false => CallStage::Executing,
                    },
                    arguments: None,
                };
                // Parsed only when a rule reads them (the text is canonical JSON already,
                // `mcp/canonical.rs`, so what is judged is what the server gets); absent, they
                // are judged as `{}`.
                let (arguments, unreadable) = if ctx.gate.needs_arguments(&query) {
                    match params
                        .arguments
                        .map(|a| serde_json::from_str::<Value>(a.get()))
                    {
                        None => (Some(Value::Object(Default::default())), None),
                        Some(Ok(value)) => (Some(value), None),
                        Some(Err(e)) => (None, Some(e)),
                    }
                } else {
                    (None, None)
                };
                query.arguments = arguments.as_ref();
                let mut decision = ctx.gate.check_call(&query);
                if let Some(error) = unreadable
                    && !decision.is_blocked()
                {
                    decision = decision.overruled(format!(
                        "argument rules apply to this tool and its arguments could not be read ({error}): refused, fail closed"
                    ));
                }
                if unlisted && !decision.is_blocked() {
                    decision.action = Action::Block;
                    decision.reason = match self.listed() {
                        true => format!(
                            "tool {:?} is not in the tool list toolwall judged for this session (a tool is listed before it is called)",
                            params.name
                        ),
                        false => format!(
                            "tool {:?} was called before this session was given a tool list, and none could be asked for on its behalf",
                            params.name
                        ),
                    };
                }
                if let Some(ask) = decision.ask.take() {
                    match (id, &ctx.approvals, self.in_batch, unlisted) {
                        (Some(id), Some(_), false, false) => {
                            decision.ask = Some(ask);
                            if let Some(key) = key {
                                self.pending
                                    .add(key, Request::Call(params.name.to_string()));
                            }
                            self.held.push(Held {
                                id: id.to_owned(),
                                message: msg.to_vec(),
                                name: params.name.into_owned(),
                                arguments,
                                decision,
                                progress_token: progress_token(probe.params),
                            });
                            return None;
                        }
                        (_, None, ..) => {
                            decision.reason = format!(
                                "{ask}; no one can be asked here (only the daemon's layers ask: run the server through the daemon, `toolwall exec`): refused"
                            )
                        }
                        (None, ..) => {
                            decision.reason =
                                format!("{ask}; a notification cannot wait for an answer: refused")
                        }
                        _ => {
                            decision.reason = format!(
                                "{ask}; a call inside a batch cannot wait alone for an answer: refused (send it on its own)"
                            )
                        }
                    }
                }
                self.record_call(&params, id, &decision, arguments.as_ref());
                if decision.is_blocked() {
                    tracing::info!(tool = %params.name, reason = %decision.reason, "refused tools/call");
                    // A tool the session may call, refused for what this call asks: the
                    // client is told why (the name alone is asked again, spending nothing),
                    // so the model can ask differently; a refused name stays unknown.
                    // (At the inspected stage no budget is spent: a rate limit is no
                    // refusal of the arguments.)
                    query.stage = CallStage::Inspected;
                    let for_arguments = arguments.is_some()
                        && ctx.gate.check_call(&query).is_blocked()
                        && !ctx
                            .gate
                            .check_call(&CallQuery {
                                arguments: None,
                                ..query
                            })
                            .is_blocked();
                    if let Some(id) = id {
                        replies.push(if for_arguments {
                            error_response(
                                id,
                                INVALID_PARAMS,
                                &format!("toolwall: {}", decision.reason),
                            )
                        } else {
                            unknown_tool(id, &params.name)
                        });
                    }
                    return None;
                }
                request = Request::Call(params.name.into_owned());
                Some(Cow::Borrowed(msg))
            }
            Some("notifications/cancelled") => {
                // The server may still answer a cancelled request: its id stays taken, and
                // its answer is no tool's (inspected whole).
                if let Some(key) = probe
                    .params
                    .and_then(|p| serde_json::from_str::<Cancelled<'_>>(p.get()).ok())
                    .and_then(|c| IdKey::of(c.request_id.get()))
                {
                    self.pending.cancelled(&key);
                }
                Some(Cow::Borrowed(msg))
            }
            Some("tools/list") => {
                // A cursor that is absent, null or empty asks for the first page.
                let cursor = probe
                    .params
                    .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
                    .is_some_and(|p| {
                        p.get("cursor")
                            .is_some_and(|c| !c.is_null() && c.as_str() != Some(""))
                    });
                request = Request::List { first: !cursor };
                Some(Cow::Borrowed(msg))
            }
            _ => Some(Cow::Borrowed(msg)),
        };
        if forward.is_some()
            && let Some(key) = key
        {
            self.pending.add(key, request);
            self.requests += 1;
        }
        forward
    }

    /// `parsed`: the arguments as judged, when a rule read them — a record that hides some
    /// of them is made from these, never from the text (whose hash, past the record's bound,
    /// would give a short secret away).
    fn record_call(
        &mut self,
        params: &CallParams<'_>,
        id: Option<&str>,
        decision: &Decision,
        parsed: Option<&Value>,
    ) {
        if self.ctx.events.is_none() {
            return;
        }
        self.records.push(Event::McpToolCalled(ToolCalled {
            policy_revision: None,
            timestamp: chrono::Utc::now(),
            session_id: self.ctx.session_id.clone(),
            server_id: self.ctx.server_id.clone(),
            server_type: self.ctx.server_type.clone(),
            tool_name: params.name.to_string(),
            jsonrpc_id: id
                .and_then(|id| serde_json::from_str(id).ok())
                .unwrap_or(Value::Null),
            // Over the record's bound, the text is not parsed at all (`events/bound.rs`).
            input: match (decision.redact.as_slice(), parsed) {
                ([], _) | (_, None) => params.arguments.map(|a| {
                    crate::events::bound::marker_for_text(a.get()).unwrap_or_else(|| {
                        serde_json::from_str(a.get()).unwrap_or_else(|why| {
                            crate::events::bound::marker_for_unreadable(a.get(), &why)
                        })
                    })
                }),
                (pointers, Some(value)) => Some(crate::policy::redacted(value, pointers)),
            },
            action: decision.action,
            reason: decision.reason.clone(),
            layer: self.ctx.layer.to_owned(),
        }));
    }
}
