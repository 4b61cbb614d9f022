//! The sans-IO heart of the shim and the filter proxy: one JSON-RPC message in, what to pass
//! on and what to answer out.
//!
//! Security first: every client message is read strictly and written out canonically
//! (`mcp/canonical.rs`); the filter judges that text and the server gets that text, never the
//! client's bytes, so a `tools/call` hidden behind `\u` escapes, in a batch, between `\r`s or
//! behind a duplicate key is either seen as one or refused. Server messages pass as the same
//! bytes unless a `tools/list` result loses tools; the parse borrows from the input
//! (`&RawValue`, `Cow<str>`).

use std::borrow::Cow;
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::decision::{Action, CallQuery, CallStage, Decision, Gate};
use crate::events::{Event, EventSink, ToolCalled};

use super::canonical;

/// JSON-RPC "Invalid params": what MCP servers answer for a tool that does not exist, and so
/// what a refused call gets (it must be indistinguishable from a missing tool).
pub(crate) const INVALID_PARAMS: i64 = -32602;
/// JSON-RPC "Parse error".
pub(crate) const PARSE_ERROR: i64 = -32700;
/// JSON-RPC "Invalid Request".
pub(crate) const INVALID_REQUEST: i64 = -32600;

/// How many unanswered `tools/list` ids one session may have; beyond it the oldest is
/// forgotten (responses carrying `result.tools` are filtered whether tracked or not, so
/// forgetting costs nothing but a log line).
const MAX_PENDING_LISTS: usize = 256;

/// Who the filter speaks for, fixed for a session.
#[derive(Clone)]
pub(crate) struct FilterContext {
    /// The policy.
    pub gate: Arc<dyn Gate>,
    /// Server id for decisions and events.
    pub server_id: String,
    /// `stdio`, `http` or `sse`.
    pub server_type: String,
    /// `shim` or `mcp-proxy`, recorded in `mcp_tool_called`.
    pub layer: &'static str,
    /// The agent session (see `cgroup::current_session`), or empty.
    pub session_id: String,
    /// Where the transport hands the records the filter returns (`mcp_tool_seen`,
    /// `mcp_tool_called`: [`Outcome::record`]); `None` records nothing.
    pub events: Option<EventSink>,
    /// Who is asked about calls an argument rule asks about (`approval.rs`); the transport
    /// then waits for each [`Outcome::held`] call. `None`: such calls are refused.
    pub approvals: Option<crate::approval::Asker>,
}

/// What to do with one message.
#[derive(Debug, Default)]
pub(crate) struct Outcome<'a> {
    /// The message to pass on in its direction: borrowed (the same bytes) when untouched,
    /// owned when denied tools or calls were taken out; `None` when nothing is left to send.
    pub forward: Option<Cow<'a, [u8]>>,
    /// Complete JSON-RPC messages to send back to the sender (errors for refused calls,
    /// cached `tools/list` results), without line terminators.
    pub replies: Vec<Vec<u8>>,
    /// What was judged (`mcp_tool_called`, `mcp_tool_seen`): the filter touches no sink; the
    /// transport hands these to its own ([`Outcome::record`]), as the LLM layer's proxy does
    /// with its interceptors' records (`llm/mod.rs`).
    pub records: Vec<Event>,
    /// Calls waiting for a person (only with [`FilterContext::approvals`]): neither forwarded
    /// nor answered yet; the transport asks, then hands the answer to [`Filter::settle`].
    pub held: Vec<Held>,
}

/// A `tools/call` that waits for a person's answer.
#[derive(Debug)]
pub(crate) struct Held {
    /// The request's id (JSON text).
    pub id: String,
    /// What the server gets if it is approved: the canonical text that was judged.
    message: Vec<u8>,
    name: String,
    /// The arguments as judged.
    pub arguments: Option<Value>,
    /// The policy's decision (a block with `ask`).
    pub decision: Decision,
    /// `params._meta.progressToken` (JSON text), when the client asked for progress: the
    /// transport tells it the call waits, so it does not give up.
    pub progress_token: Option<String>,
}

impl Outcome<'_> {
    /// Hands the records to `sink` (recording is off without one).
    pub(crate) fn record(mut self, sink: Option<&EventSink>) -> Self {
        if let Some(sink) = sink {
            for record in self.records.drain(..) {
                sink.emit(record);
            }
        }
        self
    }
}

/// One session's filter. Client messages go through [`Filter::on_client`], server messages
/// through [`Filter::on_server`]; it remembers which requests were `tools/list`.
pub(crate) struct Filter {
    /// Shared by the filters of one filter proxy: a request's filter costs no copy of it.
    ctx: Arc<FilterContext>,
    pending_lists: VecDeque<Value>,
    /// Ids and tools of the `tools/call`s passed on and not yet answered, so the result
    /// rules know which tool a result is of (per-tool exemptions); bounded like the lists.
    pending_calls: VecDeque<(Value, String)>,
    /// The tool the server message being judged answers, found by `filter/listing.rs`.
    answering: Option<String>,
    /// What the session may call; shared by the filters of one filter proxy.
    listing: Arc<Mutex<Listing>>,
    /// Responses (messages with an `id` and no `method`) the server sent so far: a response
    /// stream that carried one per request of its POST is complete (`mcp/filtered_sse.rs`).
    responses: usize,
    /// Requests (messages with a `method` and an `id`) [`Filter::on_client`] passed on so
    /// far: the responses a POST's stream owes, counted without parsing the message again.
    requests: usize,
    /// Records made since the last [`Outcome`] took them.
    records: Vec<Event>,
    /// Calls held since the last [`Outcome`] took them.
    held: Vec<Held>,
    /// Judging the items of a batch: a call there cannot wait alone, so it is not held.
    in_batch: bool,
}

/// The tools a session may call, and the filter proxy's cached list.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// The filtered tool array (JSON text) to answer `tools/list` with instead of asking the
    /// server: the filter proxy lists once at start-up. Dropped when the server
    /// says its list changed: later lists are asked of the server and filtered.
    cached: Option<Arc<str>>,
    /// The tools a `tools/list` result judged here let through (`None` until one did). A
    /// call of any other tool is refused, so a tool a server adds (after
    /// `notifications/tools/list_changed`, or unannounced) is judged in a listing before it
    /// can be called. A tool whose definition changed is judged against its pin when the
    /// list that shows the change passes; until then the client only knows the definition
    /// that was judged.
    names: Option<HashSet<String>>,
}

impl Listing {
    /// A listing answered from `tools_json` (a JSON array of allowed tools).
    pub(crate) fn cached(tools_json: Arc<str>) -> Self {
        Listing {
            names: Some(tool_names(&tools_json)),
            cached: Some(tools_json),
        }
    }
}

#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct CallParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

/// The first byte that is not JSON whitespace.
fn first_token(msg: &[u8]) -> Option<u8> {
    msg.iter()
        .copied()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

/// A JSON-RPC error response; `id` is the raw id text of the request (`null` if unknown), so
/// the client sees its own id exactly as it wrote it.
pub(crate) fn error_response(id: &str, code: i64, message: &str) -> Vec<u8> {
    let message = serde_json::to_string(message).unwrap_or_else(|_| "\"\"".to_owned());
    format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":{code},"message":{message}}}}}"#)
        .into_bytes()
}

/// The error a refused call gets: the MCP spec's unknown-tool error.
pub(crate) fn unknown_tool(id: &str, name: &str) -> Vec<u8> {
    error_response(id, INVALID_PARAMS, &format!("Unknown tool: {name}"))
}

/// Byte offset of `inner` inside `outer` (both from the same parse; `RawValue` borrows).
fn offset_in(outer: &[u8], inner: &str) -> Option<usize> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    (start + inner.len() <= outer.len()).then_some(start)
}

impl Filter {
    /// A fresh session.
    pub(crate) fn new(ctx: FilterContext) -> Self {
        Self::shared(Arc::new(ctx))
    }

    /// A fresh session of a context shared with other sessions.
    pub(crate) fn shared(ctx: Arc<FilterContext>) -> Self {
        Self {
            ctx,
            pending_lists: VecDeque::new(),
            pending_calls: VecDeque::new(),
            answering: None,
            listing: Arc::default(),
            responses: 0,
            requests: 0,
            records: Vec::new(),
            held: Vec::new(),
            in_batch: false,
        }
    }

    /// Who this filter speaks for.
    pub(crate) fn context(&self) -> &FilterContext {
        &self.ctx
    }

    /// Share what may be called (and the cached list) with other filters of one server.
    pub(crate) fn with_listing(mut self, listing: Arc<Mutex<Listing>>) -> Self {
        self.listing = listing;
        self
    }

    /// How many responses passed [`Filter::on_server`] (dropped ones included).
    pub(crate) fn responses(&self) -> usize {
        self.responses
    }

    /// How many requests [`Filter::on_client`] passed on.
    pub(crate) fn requests(&self) -> usize {
        self.requests
    }

    /// Where the transport hands this filter's records ([`Outcome::record`]).
    pub(crate) fn sink(&self) -> Option<&EventSink> {
        self.ctx.events.as_ref()
    }

    fn listing(&self) -> MutexGuard<'_, Listing> {
        // A poisoned lock means a filter panicked mid-update; the set is still a set.
        self.listing.lock().unwrap_or_else(PoisonError::into_inner)
    }

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
    /// the reason; `approval` is the question's number.
    pub(crate) fn settle(
        &mut self,
        held: Held,
        approval: Option<u64>,
        answer: &crate::approval::Answer,
    ) -> Outcome<'static> {
        let decision = answer.settle(approval, held.decision);
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
            self.pass_call(&held.id, held.name);
            self.requests += 1;
            out.forward = Some(Cow::Owned(held.message));
        }
        out.records = std::mem::take(&mut self.records);
        out
    }

    /// A `tools/call` passed on: its result is known as this tool's.
    fn pass_call(&mut self, id: &str, name: String) {
        if let Ok(id) = serde_json::from_str::<Value>(id) {
            if self.pending_calls.len() == MAX_PENDING_LISTS {
                self.pending_calls.pop_front();
            }
            self.pending_calls.push_back((id, name));
        }
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

    /// A message from the server: `tools/list` results lose their denied tools, everything
    /// else (responses, server-to-client requests, notifications) passes as is.
    pub(crate) fn on_server<'a>(&mut self, msg: &'a [u8]) -> Outcome<'a> {
        let forward = match first_token(msg) {
            None => Some(Cow::Borrowed(msg)),
            Some(b'{') => self.server_one(msg),
            Some(b'[') => match serde_json::from_slice::<Vec<&RawValue>>(msg) {
                Ok(items) => batch(msg, &items, |item| self.server_one(item)),
                Err(error) => {
                    tracing::warn!(%error, "dropping unparseable batch from the MCP server");
                    None
                }
            },
            Some(_) => {
                tracing::warn!("dropping a non-JSON-RPC message from the MCP server");
                None
            }
        };
        Outcome {
            forward,
            replies: Vec::new(),
            records: std::mem::take(&mut self.records),
            held: Vec::new(),
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
                let unlisted = self
                    .listing()
                    .names
                    .as_ref()
                    .is_some_and(|names| !names.contains(params.name.as_ref()));
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
                    decision.reason = format!(
                        "tool {:?} is not in any tool list toolwall judged for this server (a tool is listed before it is called)",
                        params.name
                    );
                }
                if let Some(ask) = decision.ask.take() {
                    match (id, &ctx.approvals, self.in_batch, unlisted) {
                        (Some(id), Some(_), false, false) => {
                            decision.ask = Some(ask);
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
                if let Some(id) = id {
                    self.pass_call(id, params.name.into_owned());
                }
                Some(Cow::Borrowed(msg))
            }
            Some("tools/list") => {
                // A 2026-07-28 request (its version in `_meta`) is asked of the server: its
                // result carries fields (`ttlMs`, `cacheScope`, `resultType`) a cached 2025
                // list lacks, and the server judges the version.
                let cached = match modern(probe.params) {
                    true => None,
                    false => self.listing().cached.clone(),
                };
                if let Some(cached) = cached {
                    self.listing().names = Some(tool_names(&cached));
                    if let Some(id) = id {
                        // Listed by the server at start-up: inspected like its messages.
                        let reply = format!(
                            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":{cached}}}}}"#
                        );
                        replies.extend(self.inspect_reply(reply.into_bytes()));
                    }
                    return None;
                }
                if let Some(id) = id.and_then(|id| serde_json::from_str::<Value>(id).ok()) {
                    if self.pending_lists.len() == MAX_PENDING_LISTS {
                        tracing::warn!(
                            "too many unanswered tools/list requests; forgetting the oldest"
                        );
                        self.pending_lists.pop_front();
                    }
                    self.pending_lists.push_back(id);
                }
                Some(Cow::Borrowed(msg))
            }
            _ => Some(Cow::Borrowed(msg)),
        };
        if probe.method.is_some() && id.is_some() {
            self.requests += 1;
        }
        forward
    }

    /// `parsed`: the arguments as judged, when a rule read them — a record that hides some
    /// of them is made from these, never from the text (whose hash, past the record's bound,
    /// would give a short secret away; helper-28).
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
                ([], _) | (_, None) => params.arguments.and_then(|a| {
                    crate::events::bound::marker_for_text(a.get())
                        .or_else(|| serde_json::from_str(a.get()).ok())
                }),
                (pointers, Some(value)) => Some(crate::policy::redacted(value, pointers)),
            },
            action: decision.action,
            reason: decision.reason.clone(),
            layer: self.ctx.layer.to_owned(),
        }));
    }
}

/// `params._meta.progressToken` of a request (JSON text), if it has one.
fn progress_token(params: Option<&RawValue>) -> Option<String> {
    let params: Value = serde_json::from_str(params?.get()).ok()?;
    let token = params.get("_meta")?.get("progressToken")?;
    (token.is_string() || token.is_number()).then(|| token.to_string())
}

/// Whether a request's params carry a 2026-07-28 envelope (its protocol version in `_meta`);
/// the params are canonical text (`mcp/canonical.rs`), so the key has one spelling.
fn modern(params: Option<&RawValue>) -> bool {
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(borrow, default, rename = "_meta")]
        meta: Option<Meta<'a>>,
    }
    #[derive(Deserialize)]
    struct Meta<'a> {
        #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion")]
        version: Option<&'a RawValue>,
    }
    params
        .and_then(|p| serde_json::from_str::<Params<'_>>(p.get()).ok())
        .and_then(|p| p.meta)
        .is_some_and(|m| m.version.is_some())
}

/// Applies `one` to each batch element and reassembles the batch: the original bytes when
/// every element came back untouched, a new array of what is left otherwise, nothing when
/// nothing is left (an empty array is not a valid batch).
fn batch<'a>(
    msg: &'a [u8],
    items: &[&'a RawValue],
    mut one: impl FnMut(&'a [u8]) -> Option<Cow<'a, [u8]>>,
) -> Option<Cow<'a, [u8]>> {
    let mut parts = Vec::with_capacity(items.len());
    let mut untouched = true;
    for item in items {
        let bytes = item.get().as_bytes();
        let part = one(bytes);
        untouched &= matches!(&part, Some(Cow::Borrowed(b)) if b.as_ptr() == bytes.as_ptr() && b.len() == bytes.len());
        parts.extend(part);
    }
    if untouched {
        return Some(Cow::Borrowed(msg));
    }
    if parts.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(msg.len());
    out.push(b'[');
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(part);
    }
    out.push(b']');
    Some(Cow::Owned(out))
}

mod listing;

pub(crate) use listing::allowed_tools;
use listing::tool_names;

#[cfg(test)]
mod tests;
