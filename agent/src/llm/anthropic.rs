//! Anthropic Messages streaming.
//!
//! | event | action |
//! |---|---|
//! | `content_block_start`, `tool_use` | ask the gate; blocked: a text block (start, delta, stop) at the same index replaces it; allowed MCP: follow its input; one argument rules judge: held (with what follows) until its `content_block_stop`, then judged with its input |
//! | `content_block_delta` / `_stop` | suppressed for a blocked index |
//! | `message_delta` | `stop_reason` `tool_use` → `end_turn` when every tool call was blocked |
//! | any other event with a `tool_use` block (`content_block`, `message.content`) | a blocked one ends the stream (fail closed) |
//! | anything else | passed through |

use std::borrow::Cow;
use std::sync::LazyLock;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{RawObject, quote, raw_array, raw_from_json, raw_str};
use super::{Cx, Fatal, Keys, Machine, blocked_message, push_capped};
use crate::decision::Decision;
use crate::sse::{write_event, write_with_data};

/// `tool_use"` (no opening quote) also finds `"server_tool_use"` and `"mcp_tool_use"`: blocks
/// the SDKs keep as calls too, which this machine passes on for the backstop (`backstop.rs`) to
/// judge.
static TOOL_USE: LazyLock<Keys> = LazyLock::new(|| Keys::new(&["tool_use\""]));
/// What may concern a tool call in a malformed event: a block of a blocked call must not leak
/// because its event did not parse.
static TOOL_OR_BLOCK: LazyLock<Keys> =
    LazyLock::new(|| Keys::new(&["tool_use\"", "content_block"]));
/// What may matter while no call is blocked or followed: a tool use starting, a new message
/// (which resets the counts) and the stop reason (`"message_` finds both event types, and
/// `message_stop`, in one pass).
static QUIET: LazyLock<Keys> = LazyLock::new(|| Keys::new(&["tool_use\"", "\"message_"]));

/// The event types the SDKs read as message events (the SSE event name selects them).
const BLOCK_EVENTS: [&str; 6] = [
    "message_start",
    "message_delta",
    "message_stop",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
];

/// The envelope fields every Anthropic stream event may carry.
#[derive(Deserialize)]
struct Envelope<'a> {
    /// Empty when missing: such an event is no known type, not malformed JSON, and is still
    /// looked at for call items.
    #[serde(rename = "type", borrow, default)]
    ty: Cow<'a, str>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    content_block: Option<&'a RawValue>,
    #[serde(default, borrow)]
    delta: Option<&'a RawValue>,
    #[serde(default, borrow)]
    message: Option<&'a RawValue>,
}

/// The part of a message that can hold tool uses.
#[derive(Deserialize)]
struct MessageContent<'a> {
    #[serde(default, borrow)]
    content: Vec<&'a RawValue>,
}

/// A content block as far as we care.
#[derive(Deserialize)]
pub(crate) struct Block<'a> {
    #[serde(rename = "type", borrow)]
    pub ty: Cow<'a, str>,
    #[serde(default, borrow)]
    pub id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub input: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct InputDelta<'a> {
    #[serde(default, borrow)]
    partial_json: Option<Cow<'a, str>>,
}

/// An allowed MCP tool block whose input we assemble to record it.
struct Tracked {
    index: u64,
    id: String,
    name: String,
    input: String,
    start_input: Option<String>,
    decision: Decision,
}

/// A call argument rules judge, held with every event after its start until its input is
/// whole: nothing of it reaches the client before it is judged.
struct Held {
    index: u64,
    id: String,
    name: String,
    start_input: Option<String>,
    input: String,
    /// Events held, in order; `true` for the call's own (its start and input deltas).
    events: Vec<(Bytes, bool)>,
    bytes: usize,
}

/// Streaming state of one Anthropic message.
#[derive(Default)]
pub(crate) struct Anthropic {
    /// Indices of blocked blocks in this message (deltas/stops for them are dropped, also after
    /// the stop). A set: a message with thousands of blocked calls must not make every later
    /// event a linear search.
    blocked: std::collections::HashSet<u64>,
    tracked: Vec<Tracked>,
    tool_uses: u32,
    blocked_count: u32,
    held: Option<Held>,
    /// Most bytes held for one call ([`Held`]): `proxy.max_stream_buffer_bytes`.
    max_held: usize,
}

impl Anthropic {
    pub(crate) fn new(max_held: usize) -> Self {
        Anthropic {
            max_held,
            ..Anthropic::default()
        }
    }
}

impl Machine for Anthropic {
    fn on_data(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        // Hot path: while no block is blocked or followed, only a tool use, a new message or
        // the stop reason matters (text deltas are the bulk of a stream).
        if self.quiet_keys().is_some_and(|keys| !keys.any_in(body)) {
            out.extend_from_slice(raw);
            return Ok(());
        }
        let env: Envelope<'_> = match serde_json::from_slice(body) {
            Ok(env) => env,
            Err(e) => {
                cx.malformed(&e, TOOL_OR_BLOCK.any_in(body))?;
                if let Some(held) = &mut self.held {
                    return hold(held, raw, false, self.max_held);
                }
                out.extend_from_slice(raw);
                return Ok(());
            }
        };
        // The SDKs dispatch on the SSE event name and skip `ping` and nameless events: data
        // read under another name than its own type is read differently by them (a
        // `content_block_delta` named `ping` would add input only toolwall saw). Where a call
        // is concerned, the two must agree.
        if (self.held.is_some()
            || !self.tracked.is_empty()
            || !self.blocked.is_empty()
            || TOOL_USE.any_in(body))
            && BLOCK_EVENTS.contains(&env.ty.as_ref())
            && crate::sse::SseEvent::new(raw).name() != Some(env.ty.as_bytes())
        {
            return Err(Fatal::new(format!(
                "a '{}' event under the SSE event name {:?}: the SDKs would read it otherwise",
                env.ty,
                crate::sse::SseEvent::new(raw)
                    .name()
                    .map(String::from_utf8_lossy)
            )));
        }
        if self.held.is_some() {
            return self.on_held(cx, raw, &env, out);
        }
        match env.ty.as_ref() {
            // One response is one message to the SDKs: their accumulators (anthropic 0.x
            // `accumulate_event`, @anthropic-ai/sdk `MessageStream`) keep the first snapshot and
            // ignore a later `message_start`, so block indices keep pointing into the first
            // message's content. Nothing is reset: a blocked block stays blocked (a reset would
            // let the blocked call's input deltas through).
            "message_start" => self.on_message_start(cx, body, raw, out)?,
            "content_block_start" => self.on_block_start(cx, raw, &env, out)?,
            "content_block_delta" => {
                let index = env.index.unwrap_or(u64::MAX);
                if self.blocked.contains(&index) {
                    return Ok(());
                }
                blocked_in_other_event(cx, &env)?;
                if let Some(t) = self.tracked.iter_mut().find(|t| t.index == index)
                    && let Some(delta) = env.delta
                    && let Ok(d) = serde_json::from_str::<InputDelta<'_>>(delta.get())
                    && let Some(part) = d.partial_json
                {
                    push_capped(&mut t.input, &part);
                }
                out.extend_from_slice(raw);
            }
            "content_block_stop" => {
                let index = env.index.unwrap_or(u64::MAX);
                if self.blocked.contains(&index) {
                    return Ok(());
                }
                blocked_in_other_event(cx, &env)?;
                if let Some(pos) = self.tracked.iter().position(|t| t.index == index) {
                    let t = self.tracked.swap_remove(pos);
                    record_tracked(cx, t);
                }
                out.extend_from_slice(raw);
            }
            "message_delta" if self.tool_uses > 0 && self.blocked_count == self.tool_uses => {
                match rewrite_stop_reason(body) {
                    Some(new) => write_with_data(out, raw, new.as_bytes()),
                    None => out.extend_from_slice(raw),
                }
            }
            _ => {
                blocked_in_other_event(cx, &env)?;
                out.extend_from_slice(raw);
            }
        }
        Ok(())
    }

    fn on_end(&mut self, cx: &mut Cx, _out: &mut BytesMut) {
        if let Some(held) = self.held.take() {
            // Its input never completed: nothing of it was sent, nothing is.
            let decision = cx.inspect(&held.name).overruled(
                "the response ended before the call's arguments, which argument rules judge, were complete".into(),
            );
            cx.record(held.name, held.id, None, decision);
        }
        self.finish_tracked(cx);
    }

    fn write_error(&self, out: &mut BytesMut, message: &str) {
        let data = format!(
            r#"{{"type":"error","error":{{"type":"api_error","message":{}}}}}"#,
            quote(message)
        );
        write_event(out, Some("error"), data.as_bytes());
    }

    fn held_bytes(&self) -> usize {
        self.held.as_ref().map_or(0, |h| h.bytes + h.input.len())
    }

    fn quiet_keys(&self) -> Option<&'static Keys> {
        if !self.blocked.is_empty() || !self.tracked.is_empty() || self.held.is_some() {
            None
        } else if self.tool_uses == 0 {
            // Before any tool use a new message changes nothing and the stop reason is never
            // rewritten: only a tool use matters (the common text-only turn).
            Some(&TOOL_USE)
        } else {
            Some(&QUIET)
        }
    }
}

impl Anthropic {
    fn on_block_start(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        env: &Envelope<'_>,
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        let Some(block) = env.content_block else {
            out.extend_from_slice(raw);
            return Ok(());
        };
        let block: Block<'_> = match serde_json::from_str(block.get()) {
            Ok(b) => b,
            Err(e) => {
                cx.malformed(&e, true)?;
                out.extend_from_slice(raw);
                return Ok(());
            }
        };
        if block.ty != "tool_use" {
            out.extend_from_slice(raw);
            return Ok(());
        }
        // Without an index we could not suppress its deltas: refuse rather than guess.
        let index = env
            .index
            .ok_or_else(|| Fatal::new("tool call block without an index"))?;
        let name = block.name.as_deref().unwrap_or_default();
        let id = block.id.as_deref().unwrap_or_default();
        self.tool_uses += 1;
        // A call argument rules judge is asked about its name now (spending nothing) and
        // decided, spending its budget, once its input is whole.
        let held = cx.needs_arguments(name, None);
        let decision = if held {
            cx.inspect(name)
        } else {
            cx.check(name, None)
        };
        if held && !decision.is_blocked() {
            let mut call = Held {
                index,
                id: id.to_owned(),
                name: name.to_owned(),
                start_input: block.input.map(|i| i.get().to_owned()),
                input: String::new(),
                events: Vec::new(),
                bytes: 0,
            };
            hold(&mut call, raw, true, self.max_held)?;
            self.held = Some(call);
            return Ok(());
        }
        if decision.is_blocked() {
            self.blocked_count += 1;
            self.blocked.insert(index);
            write_text_block(out, index, &blocked_message(name, &decision.reason));
            cx.record(name.to_owned(), id.to_owned(), None, decision);
        } else {
            if decision.tool.is_some() {
                self.tracked.push(Tracked {
                    index,
                    id: id.to_owned(),
                    name: name.to_owned(),
                    input: String::new(),
                    start_input: block.input.map(|i| i.get().to_owned()),
                    decision,
                });
            }
            out.extend_from_slice(raw);
        }
        Ok(())
    }

    /// The message a stream opens with is the SDKs' starting snapshot, kept in the final
    /// message: `tool_use` blocks in its `content` (empty in practice) are judged like a whole
    /// body's, and blocked ones replaced by text blocks.
    fn on_message_start(
        &mut self,
        cx: &mut Cx,
        body: &[u8],
        raw: &Bytes,
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        if !TOOL_USE.any_in(body) {
            out.extend_from_slice(raw);
            return Ok(());
        }
        let text = std::str::from_utf8(body).map_err(|_| Fatal::new("SSE data is not UTF-8"))?;
        let judged = RawObject::parse(text).and_then(|mut top| {
            let Some(message_raw) = top.parsed("message") else {
                return Ok(None);
            };
            let mut message = RawObject::from_raw(message_raw)?;
            let counts = rewrite_content(cx, &mut message)?;
            if counts.1 > 0 {
                top.set("message", message.to_raw());
            }
            Ok(Some((counts, top.to_json())))
        });
        match judged {
            Ok(Some(((total, blocked), new))) => {
                self.tool_uses += total as u32;
                self.blocked_count += blocked as u32;
                if blocked > 0 {
                    write_with_data(out, raw, new.as_bytes());
                    return Ok(());
                }
            }
            Ok(None) => {}
            Err(e) => cx.malformed(&e, true)?,
        }
        out.extend_from_slice(raw);
        Ok(())
    }

    /// An event while a call is held: its input deltas are gathered, its stop decides it;
    /// anything else that may concern a call cannot be ordered around it and ends the stream.
    fn on_held(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        env: &Envelope<'_>,
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        let Some(held) = self.held.as_mut() else {
            return Ok(());
        };
        let own = env.index == Some(held.index);
        match env.ty.as_ref() {
            "content_block_delta" if own => {
                if let Some(delta) = env.delta
                    && let Ok(d) = serde_json::from_str::<InputDelta<'_>>(delta.get())
                    && let Some(part) = d.partial_json
                {
                    held.input.push_str(&part);
                }
                hold(held, raw, true, self.max_held)
            }
            "content_block_stop" if own => {
                let Some(held) = self.held.take() else {
                    return Ok(());
                };
                self.release(cx, held, raw, out);
                Ok(())
            }
            "ping" => hold(held, raw, false, self.max_held),
            other => Err(Fatal::new(format!(
                "a '{other}' event came while a tool call's arguments were held for the argument rules (its block had not stopped)"
            ))),
        }
    }

    /// Decides a held call on its whole input: allowed, everything held goes out as it came;
    /// blocked, a text block replaces the call's own events.
    fn release(&mut self, cx: &mut Cx, held: Held, stop: &Bytes, out: &mut BytesMut) {
        let text = if held.input.is_empty() {
            held.start_input.unwrap_or_default()
        } else {
            held.input
        };
        let decision = cx.check_complete(&held.name, None, Some(&text));
        let input = serde_json::from_str(&text).ok();
        if decision.is_blocked() {
            self.blocked_count += 1;
            self.blocked.insert(held.index);
            write_text_block(
                out,
                held.index,
                &blocked_message(&held.name, &decision.reason),
            );
            for (event, own) in held.events {
                if !own {
                    out.extend_from_slice(&event);
                }
            }
        } else {
            for (event, _) in held.events {
                out.extend_from_slice(&event);
            }
            out.extend_from_slice(stop);
        }
        cx.record(held.name, held.id, input, decision);
    }

    fn finish_tracked(&mut self, cx: &mut Cx) {
        for t in self.tracked.drain(..) {
            record_tracked(cx, t);
        }
    }
}

/// An event of a type that carries no block starts (or one unknown to us) may still hold a
/// `tool_use` block, in `content_block` or `message.content`: a client that reads events raw
/// would see it, so a blocked one ends the stream (fail closed).
fn blocked_in_other_event(cx: &mut Cx, env: &Envelope<'_>) -> Result<(), Fatal> {
    let content = env
        .message
        .and_then(|m| serde_json::from_str::<MessageContent<'_>>(m.get()).ok())
        .map(|m| m.content)
        .unwrap_or_default();
    for raw in env.content_block.into_iter().chain(content) {
        if let Ok(block) = serde_json::from_str::<Block<'_>>(raw.get())
            && block.ty == "tool_use"
            && cx
                .check(block.name.as_deref().unwrap_or_default(), None)
                .is_blocked()
        {
            return Err(Fatal::new(format!(
                "a blocked tool use in a '{}' event",
                env.ty
            )));
        }
    }
    Ok(())
}

/// Adds an event to a held call, within `max` bytes (then the stream ends: fail closed).
fn hold(held: &mut Held, raw: &Bytes, own: bool, max: usize) -> Result<(), Fatal> {
    held.bytes += raw.len();
    if held.bytes > max {
        return Err(Fatal::new(format!(
            "a tool call held for the argument rules passed {max} bytes (proxy.max_stream_buffer_bytes)"
        )));
    }
    held.events.push((raw.clone(), own));
    Ok(())
}

fn record_tracked(cx: &mut Cx, t: Tracked) {
    let text = if t.input.is_empty() {
        t.start_input.unwrap_or_default()
    } else {
        t.input
    };
    let input = serde_json::from_str(&text).ok();
    cx.record(t.name, t.id, input, t.decision);
}

/// The three events of a replacement text block at `index`.
pub(crate) fn write_text_block(out: &mut BytesMut, index: u64, text: &str) {
    let start = format!(
        r#"{{"type":"content_block_start","index":{index},"content_block":{{"type":"text","text":""}}}}"#
    );
    write_event(out, Some("content_block_start"), start.as_bytes());
    let delta = format!(
        r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"text_delta","text":{}}}}}"#,
        quote(text)
    );
    write_event(out, Some("content_block_delta"), delta.as_bytes());
    let stop = format!(r#"{{"type":"content_block_stop","index":{index}}}"#);
    write_event(out, Some("content_block_stop"), stop.as_bytes());
}

/// `message_delta` data with `delta.stop_reason` `tool_use` turned into `end_turn`; `None` when
/// there is nothing to change.
fn rewrite_stop_reason(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let mut top = RawObject::parse(text).ok()?;
    let mut delta = RawObject::from_raw(top.get("delta")?).ok()?;
    if delta.get_str("stop_reason").as_deref() != Some("tool_use") {
        return None;
    }
    delta.set("stop_reason", raw_str("end_turn"));
    let delta = delta.to_raw();
    top.set("delta", delta);
    Some(top.to_json())
}

/// A whole (non-streaming) Messages body: blocked `tool_use` blocks replaced by text blocks,
/// `stop_reason` `tool_use` → `end_turn` when every call was blocked; `None` when nothing was.
pub(super) fn rewrite_body(cx: &mut Cx, text: &str) -> serde_json::Result<Option<String>> {
    let mut top = RawObject::parse(text)?;
    let (total, blocked) = rewrite_content(cx, &mut top)?;
    if blocked == 0 {
        return Ok(None);
    }
    if blocked == total && top.get_str("stop_reason").as_deref() == Some("tool_use") {
        top.set("stop_reason", raw_str("end_turn"));
    }
    Ok(Some(top.to_json()))
}

/// Judges every `tool_use` block in a message object's `content` (a whole body, or the message
/// a stream's `message_start` opens with, which SDKs keep in the final message), replacing the
/// blocked ones by text blocks in place. Returns (tool uses, blocked); records every decision.
fn rewrite_content(cx: &mut Cx, top: &mut RawObject<'_>) -> serde_json::Result<(usize, usize)> {
    let Some(content_raw) = top.get("content") else {
        return Ok((0, 0));
    };
    let content: Vec<&RawValue> = serde_json::from_str(content_raw.get())?;
    let (mut total, mut blocked) = (0usize, 0usize);
    let mut new: Vec<Box<RawValue>> = Vec::with_capacity(content.len());
    for raw in &content {
        let block: Block<'_> = serde_json::from_str(raw.get())?;
        if block.ty == "tool_use" {
            total += 1;
            let name = block.name.as_deref().unwrap_or_default();
            let id = block.id.as_deref().unwrap_or_default().to_owned();
            let input = block.input.and_then(|i| serde_json::from_str(i.get()).ok());
            let decision = cx.check_complete(name, None, block.input.map(RawValue::get));
            if decision.is_blocked() {
                blocked += 1;
                let text = blocked_message(name, &decision.reason);
                new.push(raw_from_json(format!(
                    r#"{{"type":"text","text":{}}}"#,
                    quote(&text)
                )));
                cx.record(name.to_owned(), id, input, decision);
                continue;
            }
            cx.record(name.to_owned(), id, input, decision);
        }
        new.push((*raw).to_owned());
    }
    if blocked > 0 {
        top.set("content", raw_array(new.iter().map(|b| b.as_ref())));
    }
    Ok((total, blocked))
}

#[cfg(test)]
pub(crate) mod tests;
