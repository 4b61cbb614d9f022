//! Layer 1: the LLM interceptor proxy.
//!
//! An agent points its SDK at [`proxy`] (`ANTHROPIC_BASE_URL` / `OPENAI_BASE_URL`); every model
//! response passes through a dialect interceptor that asks the [`Gate`] about each tool call the
//! model makes and replaces the blocked ones with a text explanation, so the agent never sees a
//! call it may not make, while the stream stays one its SDK accepts.
//!
//! The interceptors are sans-IO ([`StreamInterceptor::feed`] bytes in, bytes and [`Record`]s
//! out; [`rewrite_buffered`] for whole bodies), so tests and fuzzers drive them directly, at any
//! chunking; [`proxy`] is the HTTP shell around them.
//!
//! Trust assumptions (documented because they bound what "blocked" means):
//! - An event that holds no tool key (such as `"tool_calls"`) and no `\u` escape (behind which a
//!   key could hide) cannot carry a tool call: the [`keys`] pre-filters pass it unparsed, and
//!   while no call is open (nothing held, blocked or followed) whole runs of such events are
//!   forwarded after one scan of their bytes, unframed and uncopied. Model output can only appear
//!   inside JSON strings, where a `"` is always escaped, so it cannot forge a key; at worst it
//!   makes an event be parsed.
//! - Events are classified by their JSON `type` (what the SDKs dispatch on), not the SSE
//!   `event:` line.

mod anthropic;
mod asking;
mod backstop;
#[cfg(feature = "bench")]
pub(crate) mod bench;
mod buffered;
mod chat;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub(crate) mod fuzzing;
pub(crate) mod json;
pub(crate) mod keys;
pub(crate) mod proxy;
mod relay;
pub(crate) use relay::RelayStats;
mod request;
mod responses;
mod upstream;

use std::borrow::Cow;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::decision::{CallQuery, CallStage, Decision, Gate};
use crate::events::{Event, ToolCallIntercepted};

pub(crate) use crate::sse::{SseDecoder, SseEvent};
pub(crate) use buffered::rewrite_buffered;
pub(crate) use keys::Keys;
pub use proxy::{LlmProxy, LlmProxySettings};

/// Which API a response speaks; chosen from the request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    OpenAiChat,
    /// OpenAI Responses (`/v1/responses`), as used by Codex.
    OpenAiResponses,
}

impl Dialect {
    /// The name stored in events.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Anthropic => "anthropic",
            Dialect::OpenAiChat => "openai-chat",
            Dialect::OpenAiResponses => "openai-responses",
        }
    }

    /// The dialect whose responses must be inspected for a request path (query string allowed);
    /// `None` for every other path (passed through untouched). Matched on the path's end so a
    /// base URL with or without `/v1`, or with a deployment prefix (Azure's
    /// `/openai/deployments/{d}/chat/completions`), is still inspected.
    pub fn from_path(path_and_query: &str) -> Option<Dialect> {
        let path = path_and_query
            .split_once('?')
            .map_or(path_and_query, |(p, _)| p);
        let path = path.trim_end_matches('/');
        if path.ends_with("/v1/messages") || path == "/messages" {
            Some(Dialect::Anthropic)
        } else if path.ends_with("/chat/completions") || path.contains("/chat/completions/") {
            // Stored completions fetched again carry the same calls.
            Some(Dialect::OpenAiChat)
        } else if path.ends_with("/responses") || path.contains("/responses/") {
            Some(Dialect::OpenAiResponses)
        } else {
            None
        }
    }
}

/// What to do with an event whose JSON does not parse.
///
pub(crate) use crate::config::OnMalformed;

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
    gate: Arc<dyn Gate>,
    dialect: Dialect,
    on_malformed: OnMalformed,
    records: Vec<Record>,
}

impl Cx {
    fn check(&self, name: &str, namespace: Option<&str>) -> Decision {
        self.check_at(name, namespace, CallStage::Proposed)
    }

    /// A second look at a name (another view of a call already asked about): same rules, no
    /// rate-limit budget spent.
    fn inspect(&self, name: &str) -> Decision {
        self.check_at(name, None, CallStage::Inspected)
    }

    /// Whether argument rules may judge this call: a stream holds it until its arguments are
    /// whole, then asks [`Cx::check_complete`].
    fn needs_arguments(&self, name: &str, namespace: Option<&str>) -> bool {
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
    fn check_complete(
        &self,
        name: &str,
        namespace: Option<&str>,
        arguments: Option<&str>,
    ) -> Decision {
        self.complete_at(name, namespace, arguments, CallStage::Proposed)
    }

    /// [`Cx::check_complete`] at `stage` (an inspection spends no budget).
    fn complete_at(
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

    fn check_at(&self, name: &str, namespace: Option<&str>, stage: CallStage) -> Decision {
        self.gate.check_call(&CallQuery {
            server_id: None,
            name,
            namespace,
            stage,
            arguments: None,
        })
    }

    /// Records a decision unless it is about a tool that is not MCP (allowed, no identity).
    fn record(&mut self, name: String, id: String, input: Option<Value>, decision: Decision) {
        if decision.tool.is_none() && !decision.is_blocked() {
            return;
        }
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
    fn malformed(&self, err: &serde_json::Error, mentions_tool: bool) -> Result<(), Fatal> {
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

/// A condition under which the stream must end (fail closed), with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fatal(String);

impl Fatal {
    fn new(why: impl Into<String>) -> Self {
        Fatal(why.into())
    }
}

/// The text that replaces a blocked call.
pub(crate) fn blocked_message(name: &str, reason: &str) -> String {
    if reason.is_empty() {
        format!("[toolwall] Tool '{name}' blocked by policy")
    } else {
        format!("[toolwall] Tool '{name}' blocked by policy: {reason}")
    }
}

/// A dialect's streaming state machine: one complete SSE event in, output written.
pub(crate) trait Machine {
    /// Handles one event with data (`raw`: its bytes, line ends included; `body`: its data,
    /// JSON whitespace trimmed).
    fn on_data(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), Fatal>;
    /// An event without data (a comment, a bare `event:`): passes as it is unless a dialect
    /// must keep it in order with what it holds.
    fn on_dataless(&mut self, raw: &Bytes, out: &mut BytesMut) {
        out.extend_from_slice(raw);
    }
    /// The stream ended (cleanly or not): release or drop what is held, record what is open.
    fn on_end(&mut self, cx: &mut Cx, out: &mut BytesMut);
    /// Writes a terminal error event the dialect's SDKs understand.
    fn write_error(&self, out: &mut BytesMut, message: &str);
    /// While `Some`: an event in which none of these keys occurs passes verbatim and changes
    /// nothing, so a run of such events may skip [`Machine::on_event`]. `None` while a call is
    /// open (held, blocked or followed): then every event is looked at.
    fn quiet_keys(&self) -> Option<&'static Keys>;
}

enum AnyMachine {
    Anthropic(anthropic::Anthropic),
    Chat(chat::Chat),
    Responses(responses::Responses),
}

impl AnyMachine {
    fn get(&mut self) -> &mut dyn Machine {
        match self {
            AnyMachine::Anthropic(m) => m,
            AnyMachine::Chat(m) => m,
            AnyMachine::Responses(m) => m,
        }
    }
}

/// Whether the stream goes on after a [`StreamInterceptor::feed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Keep feeding.
    Continue,
    /// The interceptor ended the stream (fail closed); stop reading upstream and close the
    /// response after writing the output.
    Closed,
}

/// What an interceptor passes on, in order: runs of the input forwarded as they came (slices of
/// the reads, not copies) and the bytes it wrote itself.
#[derive(Debug, Default)]
pub(crate) struct Output {
    ready: Vec<Bytes>,
    /// Which of `ready` a machine wrote (the others are runs forwarded unparsed, which hold no
    /// tool key).
    machine_written: Vec<bool>,
    /// How many of `ready` the backstop has read.
    checked: usize,
    written: BytesMut,
}

impl Output {
    fn run(&mut self, run: Bytes) {
        self.seal();
        self.ready.push(run);
        self.machine_written.push(false);
    }

    fn seal(&mut self) {
        if !self.written.is_empty() {
            self.ready.push(self.written.split().freeze());
            self.machine_written.push(true);
        }
    }

    /// Takes everything produced so far, in order.
    pub(crate) fn drain(&mut self) -> std::vec::Drain<'_, Bytes> {
        self.seal();
        self.machine_written.clear();
        self.checked = 0;
        self.ready.drain(..)
    }

    /// Takes everything produced so far as one buffer (for callers that want bytes, not
    /// chunks: tests, fuzzers).
    #[cfg(any(test, feature = "bench", feature = "fuzzing"))]
    pub(crate) fn take_all(&mut self) -> Vec<u8> {
        self.drain().flat_map(|b| b.to_vec()).collect()
    }
}

/// Inspects one streamed (SSE) response: feed upstream bytes in any chunking, write the output
/// to the client as soon as `feed` returns. Events with nothing blocked leave byte-identical.
pub(crate) struct StreamInterceptor {
    decoder: SseDecoder,
    machine: AnyMachine,
    cx: Cx,
    closed: bool,
    /// The last event's output ended with a CR (so a split-off LF completes it).
    last_ended_cr: bool,
}

impl StreamInterceptor {
    /// An interceptor for one response; `max_buffer` bounds the memory held for one incomplete
    /// event or one held-back tool call.
    pub(crate) fn new(
        dialect: Dialect,
        gate: Arc<dyn Gate>,
        on_malformed: OnMalformed,
        max_buffer: usize,
    ) -> Self {
        let machine = match dialect {
            Dialect::Anthropic => AnyMachine::Anthropic(anthropic::Anthropic::new(max_buffer)),
            Dialect::OpenAiChat => AnyMachine::Chat(chat::Chat::new(max_buffer)),
            Dialect::OpenAiResponses => {
                AnyMachine::Responses(responses::Responses::new(max_buffer))
            }
        };
        StreamInterceptor {
            decoder: SseDecoder::new(max_buffer),
            machine,
            cx: Cx {
                gate,
                dialect,
                on_malformed,
                records: Vec::new(),
            },
            closed: false,
            last_ended_cr: false,
        }
    }

    /// Feeds a read from upstream; appends what the client must receive to `out`.
    pub(crate) fn feed(&mut self, input: Bytes, out: &mut Output) -> Flow {
        let flow = self.feed_events(input, out);
        if self.backstop(out) {
            return Flow::Closed;
        }
        flow
    }

    fn feed_events(&mut self, input: Bytes, out: &mut Output) -> Flow {
        if self.closed {
            return Flow::Closed;
        }
        self.decoder.feed(input);
        loop {
            if let Some(keys) = self.machine.get().quiet_keys()
                && let Some(run) = self.decoder.take_run(|b| keys.find(b))
            {
                out.run(run);
                self.last_ended_cr = false;
            }
            let out = &mut out.written;
            match self.decoder.next_event() {
                Ok(Some(raw)) => {
                    if self.decoder.is_crlf_tail() {
                        if self.last_ended_cr {
                            out.extend_from_slice(&raw);
                        }
                        self.last_ended_cr = false;
                        continue;
                    }
                    let before = out.len();
                    let data = self.decoder.last_data().data(&raw);
                    if let Err(fatal) = self.on_event(&raw, data, out) {
                        return self.close(out, &fatal.0);
                    }
                    // Verbatim output ends as the input did; our own events end in LF.
                    self.last_ended_cr = out.len() > before && out.last() == Some(&b'\r');
                }
                Ok(None) => return Flow::Continue,
                Err(e) => return self.close(out, &e.to_string()),
            }
        }
    }

    /// Upstream ended: inspects an unterminated last event like any other, then closes the
    /// dialect state. Call once.
    pub(crate) fn finish(&mut self, out: &mut Output) {
        self.finish_events(out);
        self.backstop(out);
    }

    /// The second line (`backstop.rs`): the events a machine wrote since the last look are
    /// read again by call shape; one that presents a blocked call is dropped with everything
    /// after it, and the stream ends (fail closed) — an item the dialect's typed reading could
    /// not take must not pass unjudged. Runs are not read again: they hold no tool key.
    fn backstop(&mut self, out: &mut Output) -> bool {
        out.seal();
        while out.checked < out.ready.len() {
            let i = out.checked;
            out.checked += 1;
            if !out.machine_written[i] || !backstop::may_hold_a_call(&out.ready[i]) {
                continue;
            }
            let Some(found) = backstop::scan_sse(&out.ready[i], self.cx.gate.as_ref()) else {
                continue;
            };
            out.ready.truncate(i);
            out.machine_written.truncate(i);
            let why = format!(
                "a blocked tool call ({}) that the {} reading missed",
                found.name,
                self.cx.dialect.as_str()
            );
            self.cx
                .record(found.name, String::new(), None, found.decision);
            self.close(&mut out.written, &why);
            out.seal();
            out.checked = out.ready.len();
            return true;
        }
        false
    }

    fn finish_events(&mut self, out: &mut Output) {
        if self.closed {
            return;
        }
        let out = &mut out.written;
        let rest = self.decoder.finish();
        if !rest.is_empty() {
            tracing::debug!(bytes = rest.len(), "stream ended inside an event");
            let data = SseEvent::new(&rest).data();
            if let Err(fatal) = self.on_event(&rest, data, out) {
                self.close(out, &fatal.0);
                return;
            }
        }
        self.machine.get().on_end(&mut self.cx, out);
        self.closed = true;
    }

    /// One event to the dialect: its data trimmed, or as an event without data.
    fn on_event(
        &mut self,
        raw: &Bytes,
        data: Option<Cow<'_, [u8]>>,
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        match data {
            Some(data) => self
                .machine
                .get()
                .on_data(&mut self.cx, raw, trim_ws(&data), out),
            None => {
                self.machine.get().on_dataless(raw, out);
                Ok(())
            }
        }
    }

    fn close(&mut self, out: &mut BytesMut, why: &str) -> Flow {
        tracing::warn!(
            dialect = self.cx.dialect.as_str(),
            why,
            "ending the stream (fail closed)"
        );
        let machine = self.machine.get();
        machine.write_error(out, &format!("[toolwall] response stopped: {why}"));
        machine.on_end(&mut self.cx, &mut BytesMut::new());
        self.closed = true;
        Flow::Closed
    }

    /// Takes the decisions made so far (to emit them as soon as they are made).
    pub(crate) fn drain_records(&mut self) -> std::vec::Drain<'_, Record> {
        self.cx.records.drain(..)
    }
}

#[cfg(test)]
#[test]
fn dialect_by_path() {
    let cases = [
        ("/v1/messages?beta=true", Some(Dialect::Anthropic)),
        ("/v1/messages/count_tokens", None),
        ("/v1/chat/completions", Some(Dialect::OpenAiChat)),
        ("/chat/completions", Some(Dialect::OpenAiChat)),
        (
            "/openai/deployments/gpt/chat/completions?api-version=1",
            Some(Dialect::OpenAiChat),
        ),
        ("/v1/responses", Some(Dialect::OpenAiResponses)),
        ("/v1/responses/resp_1", Some(Dialect::OpenAiResponses)),
        ("/", None),
        ("/v1/models", None),
    ];
    for (path, want) in cases {
        assert_eq!(Dialect::from_path(path), want, "{path}");
    }
}

/// Strips leading JSON whitespace.
fn trim_ws(data: &[u8]) -> &[u8] {
    let start = data
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
        .unwrap_or(data.len());
    &data[start..]
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
