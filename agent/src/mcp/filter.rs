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
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use serde_json::value::RawValue;

use crate::decision::{Decision, Gate};
use crate::events::{Event, EventSink};

use super::canonical;

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
    /// The requests passed on (or held) and not yet answered, by id (`filter/pending.rs`).
    pending: Pending,
    /// The tool the server message being judged answers, found by `filter/listing.rs`.
    answering: Option<String>,
    /// What the session may call; shared by the filters of one filter proxy.
    listing: Arc<Mutex<Listing>>,
    /// Responses the server sent so far that answered a request of this filter's: a response
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
    /// The turn the server message about to be judged took as it arrived ([`Filter::arrive`]).
    turn: Option<u64>,
}

/// The tools a session may call.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// The tools a `tools/list` result judged here let through (`None` until one did). A
    /// call of any other tool is refused, so a tool a server adds (after
    /// `notifications/tools/list_changed`, or unannounced) is judged in a listing before it
    /// can be called. A tool whose definition changed is judged against its pin when the
    /// list that shows the change passes; until then the client only knows the definition
    /// that was judged.
    names: Option<HashSet<String>>,
    /// A call before any listing is refused: the filter proxy lists on a session's behalf
    /// before its first call ([`Filter::list_first`]), because what a server lists depends on
    /// who asks (the session's capabilities, its credentials).
    required: bool,
    /// The last turn given to a server message of this session (taken as it arrives,
    /// [`Filter::arrive`], or as its first list is applied), and the turn of the last list
    /// applied: a list judged off the proxy's thread (`mcp/offload.rs`) may be done after one
    /// that came later, and must not replace it. A list older than the one applied is not
    /// applied; the lists of one message (a batch) share its turn and apply in order.
    turns: u64,
    applied: u64,
}

impl Listing {
    /// A session whose calls are judged against the list it was given, and refused before
    /// one was judged.
    pub(crate) fn required() -> Self {
        Listing {
            required: true,
            ..Listing::default()
        }
    }

    /// The next turn.
    fn turn(&mut self) -> u64 {
        self.turns += 1;
        self.turns
    }
}

/// A session's turns, taken by its server messages as they arrive ([`Filter::arrive`]).
pub(crate) struct Turns(Arc<Mutex<Listing>>);

impl Turns {
    pub(crate) fn take(&self) -> u64 {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).turn()
    }
}

/// What a session's first call needs before it is judged: its tool list, asked of the server
/// on its behalf in the call's own protocol revision.
#[derive(Debug)]
pub(crate) struct ListFirst {
    /// The call's 2026-07-28 envelope (`params._meta`'s `io.modelcontextprotocol/*` keys),
    /// for a listing at that revision; `None` for a session of the handshake revisions.
    pub meta: Option<serde_json::Map<String, Value>>,
}

/// A 2026-07-28 message's envelope: its `params._meta`'s `io.modelcontextprotocol/*` keys,
/// when it names a protocol version (who sends it, with what capabilities).
fn envelope(message: &Value) -> Option<serde_json::Map<String, Value>> {
    message
        .pointer("/params/_meta")
        .and_then(Value::as_object)
        .filter(|m| m.contains_key("io.modelcontextprotocol/protocolVersion"))
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k.starts_with("io.modelcontextprotocol/"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
}

/// What of a message's `params._meta` may say who sends it: all of it but what describes this
/// one request (its progress token, W3C trace context). At 2026-07-28 that is the envelope
/// (protocol version, client, capabilities), but a server may read any key, at any revision.
fn sender_meta(message: &Value) -> Option<serde_json::Map<String, Value>> {
    let kept: serde_json::Map<String, Value> = match message.pointer("/params/_meta")? {
        Value::Object(meta) => meta
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "progressToken" | "traceparent" | "tracestate" | "baggage"
                )
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        other => std::iter::once((String::new(), other.clone())).collect(),
    };
    (!kept.is_empty()).then_some(kept)
}

/// Who a client request (one message or a batch) says it is in its `_meta` ([`sender_meta`]),
/// as the server reads it: from the canonical text the server is sent, so an escaped key is
/// found too. `Err` when its messages say different things (one body, two senders). A body
/// that cannot be read has none (the filter refuses it anyway).
pub(crate) fn request_envelope(
    msg: &[u8],
) -> Result<Option<serde_json::Map<String, Value>>, &'static str> {
    // Without the key's name or an escape that could spell it, there is no `_meta`.
    if memchr::memmem::find(msg, b"_meta").is_none() && memchr::memchr(b'\\', msg).is_none() {
        return Ok(None);
    }
    let Ok(Some(text)) = canonical::canonical(msg) else {
        return Ok(None);
    };
    let Ok(value) = serde_json::from_slice::<Value>(&text) else {
        return Ok(None);
    };
    let items = match &value {
        Value::Array(items) => items.as_slice(),
        one => std::slice::from_ref(one),
    };
    let mut metas = items.iter().map(sender_meta);
    let first = metas.next().flatten();
    match metas.all(|e| e == first) {
        true => Ok(first),
        false => Err("the messages of one request carry different _meta envelopes"),
    }
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
            pending: Pending::default(),
            answering: None,
            listing: Arc::default(),
            responses: 0,
            requests: 0,
            records: Vec::new(),
            held: Vec::new(),
            in_batch: false,
            turn: None,
        }
    }

    /// Who this filter speaks for.
    pub(crate) fn context(&self) -> &FilterContext {
        &self.ctx
    }

    /// Judge against `listing`: the list of the session this filter serves.
    pub(crate) fn with_listing(mut self, listing: Arc<Mutex<Listing>>) -> Self {
        self.listing = listing;
        self
    }

    /// How many of this filter's requests [`Filter::on_server`] saw answered (dropped
    /// answers included).
    pub(crate) fn responses(&self) -> usize {
        self.responses
    }

    /// Whether the server answered every request this filter passed on.
    pub(crate) fn all_answered(&self) -> bool {
        self.pending.is_empty()
    }

    /// The ids of the requests this filter passed on (or holds) that the server has not
    /// answered yet, as the peers compare ids.
    pub(crate) fn outstanding_ids(&self) -> Vec<IdKey> {
        self.pending.ids()
    }

    /// How many requests [`Filter::on_client`] passed on.
    pub(crate) fn requests(&self) -> usize {
        self.requests
    }

    /// Where the transport hands this filter's records ([`Outcome::record`]).
    pub(crate) fn sink(&self) -> Option<&EventSink> {
        self.ctx.events.as_ref()
    }

    /// Whether `msg` (a client message) calls a tool before this session was given a tool
    /// list that must come first ([`Listing::required`]).
    pub(crate) fn list_first(&self, msg: &[u8]) -> Option<ListFirst> {
        {
            let listing = self.listing();
            if !listing.required || listing.names.is_some() {
                return None;
            }
        }
        let text = canonical::canonical(msg).ok().flatten()?;
        let value: Value = serde_json::from_slice(&text).ok()?;
        let items = match &value {
            Value::Array(items) => items.as_slice(),
            one => std::slice::from_ref(one),
        };
        let call = items
            .iter()
            .find(|m| m.get("method").and_then(Value::as_str) == Some("tools/call"))?;
        Some(ListFirst {
            meta: envelope(call),
        })
    }

    /// Whether this session was given a tool list yet.
    pub(crate) fn listed(&self) -> bool {
        self.listing().names.is_some()
    }

    /// A listing on the session's behalf did not finish: what its first pages gave is
    /// forgotten, so the call that waited for it is refused as unlisted (and the next one
    /// listed for again), never judged against part of a list.
    pub(crate) fn listing_failed(&self) {
        let mut listing = self.listing();
        listing.names = None;
        // A list still being judged is older than this failure.
        listing.applied = listing.turn();
    }

    fn listing(&self) -> MutexGuard<'_, Listing> {
        // A poisoned lock means a filter panicked mid-update; the set is still a set.
        self.listing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The server message to be judged next arrived now: it takes its turn, so that a list
    /// it carries is applied after the lists that came before it and before those after it,
    /// wherever and whenever it is judged.
    pub(crate) fn arrive(&mut self) {
        let turn = self.turns().take();
        self.arrived(turn);
    }

    /// The server message to be judged next took `turn` as it arrived ([`Turns::take`]).
    pub(crate) fn arrived(&mut self, turn: u64) {
        self.turn = Some(turn);
    }

    /// Where this session's server messages take their turns while its filter is away.
    pub(crate) fn turns(&self) -> Turns {
        Turns(self.listing.clone())
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
        self.turn = None;
        Outcome {
            forward,
            replies: Vec::new(),
            records: std::mem::take(&mut self.records),
            held: Vec::new(),
        }
    }
}

mod client;
mod jsonrpc;
mod listing;
mod pending;

use jsonrpc::{CallParams, Probe, batch, first_token, offset_in, progress_token};
pub(crate) use jsonrpc::{
    INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, error_response, unknown_tool,
};
pub(crate) use listing::allowed_tools;
pub(crate) use pending::IdKey;
use pending::{Pending, Request};

#[cfg(test)]
mod tests;
