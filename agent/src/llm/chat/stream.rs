//! The Chat Completions stream machine: calls tracked per choice, events held until every
//! call of theirs is decided, then released (verbatim, or edited by [`super::edit`]).

mod call;
mod release;

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use bytes::{Bytes, BytesMut};
use serde_json::value::RawValue;

use super::edit::template_of;
use super::{CallView, ChoiceView, DeltaView, TOOL_KEYS};
use crate::llm::json::{RawObject, quote};
use crate::llm::{Cx, Fatal, Keys, Machine, push_capped};
use crate::sse::write_event;
use call::{Call, NameView, State};

/// The calls of one choice.
#[derive(Default)]
struct ChoiceState {
    calls: HashMap<u64, Call>,
    /// Upstream indices in the order they first came.
    order: Vec<u64>,
    /// The index of the last entry seen (the SDKs' current call).
    current: Option<u64>,
    /// Its calls are judged (`finish_reason`, or the stream ended).
    decided: bool,
    blocked: usize,
    /// Explanations of its blocked calls, for its finishing chunk.
    messages: Vec<String>,
}

/// An event held back, with where its tool call entries are.
struct Held {
    raw: Bytes,
    choices: Vec<HeldChoice>,
}

struct HeldChoice {
    /// Position in the chunk's `choices`.
    pos: usize,
    choice: u64,
    /// (position in `tool_calls`, upstream index) of each entry read.
    entries: Vec<(usize, u64)>,
    /// The chunk finishes the choice: whether with `tool_calls`.
    finish: Option<bool>,
}

/// Streaming state of one chat completion.
pub(crate) struct Chat {
    max_buffer: usize,
    /// Choices that have had a tool call, by index.
    choices: HashMap<u64, ChoiceState>,
    /// Choices with calls not decided yet.
    pending: usize,
    /// Events held back, in order.
    queue: Vec<Held>,
    queued_bytes: usize,
    /// What calls hold (names, ids, a fixed cost each).
    state_bytes: usize,
    /// Top-level fields (id, model, ...) to build synthetic chunks with.
    template: Option<String>,
    /// Name of each choice's legacy `function_call`, as assembled so far (by choice index:
    /// with `n > 1` the choices' fragments interleave).
    legacy_names: HashMap<u64, String>,
    /// Every choice index seen in a chunk this machine read.
    seen_choices: std::collections::HashSet<u64>,
}

impl Machine for Chat {
    fn on_dataless(&mut self, _cx: &mut Cx, raw: &Bytes, out: &mut BytesMut) -> Result<(), Fatal> {
        // Behind a held event it must wait its turn.
        self.pass(raw, Vec::new(), out);
        Ok(())
    }

    fn on_data(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        if body.starts_with(b"[DONE]") {
            self.finish_all(cx, out)?;
            out.extend_from_slice(raw);
            return Ok(());
        }
        let has_tool_key = TOOL_KEYS.any_in(body);
        if self.queue.is_empty() && !has_tool_key {
            out.extend_from_slice(raw);
            return Ok(());
        }
        let text = match std::str::from_utf8(body) {
            Ok(t) => t,
            Err(_) => return Err(Fatal::new("SSE data is not UTF-8")),
        };
        let top = match RawObject::parse(text) {
            Ok(t) => t,
            Err(e) => {
                cx.malformed(&e, has_tool_key)?;
                self.pass(raw, Vec::new(), out);
                return Ok(());
            }
        };
        let Some(choices_raw) = top.get("choices") else {
            self.pass(raw, Vec::new(), out);
            return Ok(());
        };
        let choices: Vec<&RawValue> = match serde_json::from_str(choices_raw.get()) {
            Ok(c) => c,
            Err(e) => {
                cx.malformed(&e, has_tool_key)?;
                self.pass(raw, Vec::new(), out);
                return Ok(());
            }
        };
        let mut held: Vec<HeldChoice> = Vec::new();
        let mut has_entries = false;
        for (pos, choice) in choices.iter().enumerate() {
            let view: ChoiceView<'_> = match serde_json::from_str(choice.get()) {
                Ok(v) => v,
                Err(e) => {
                    cx.malformed(&e, has_tool_key)?;
                    continue;
                }
            };
            let hc = self.on_choice(cx, pos, &view)?;
            has_entries |= !hc.entries.is_empty();
            if !hc.entries.is_empty() || hc.finish.is_some() {
                held.push(hc);
            }
        }
        if has_entries && self.template.is_none() {
            self.template = Some(template_of(&top));
        }
        if has_entries || !self.queue.is_empty() {
            self.queued_bytes += raw.len();
            self.queue.push(Held {
                raw: raw.clone(),
                choices: held,
            });
        } else {
            out.extend_from_slice(raw);
        }
        if self.queued_bytes + self.state_bytes > self.max_buffer {
            return Err(Fatal::new(
                "tool calls held back exceed the stream buffer limit (max_stream_buffer_bytes)",
            ));
        }
        if self.pending == 0 {
            self.flush(out)?;
        }
        Ok(())
    }

    fn on_end(&mut self, cx: &mut Cx, out: &mut BytesMut) {
        // The stream ended: every name is final. Decide, and release what is held (the client
        // would have had the allowed calls had we not held them).
        if let Err(f) = self.finish_all(cx, out) {
            tracing::warn!(why = %f.0, "chat stream ended with calls that could not be released");
        }
    }

    fn held_bytes(&self) -> usize {
        self.queued_bytes + self.state_bytes
    }

    fn write_error(&self, out: &mut BytesMut, message: &str) {
        let data = format!(
            r#"{{"error":{{"message":{},"type":"toolwall_error","code":"toolwall_blocked"}}}}"#,
            quote(message)
        );
        write_event(out, None, data.as_bytes());
    }

    fn quiet_keys(&self) -> Option<&'static Keys> {
        self.queue.is_empty().then(|| &*TOOL_KEYS)
    }
}

impl Chat {
    pub(crate) fn new(max_buffer: usize) -> Self {
        Chat {
            max_buffer,
            choices: HashMap::new(),
            seen_choices: std::collections::HashSet::new(),
            pending: 0,
            queue: Vec::new(),
            queued_bytes: 0,
            state_bytes: 0,
            template: None,
            legacy_names: HashMap::new(),
        }
    }

    /// An event that changes nothing: held behind the queue if there is one, else written.
    fn pass(&mut self, raw: &Bytes, choices: Vec<HeldChoice>, out: &mut BytesMut) {
        if self.queue.is_empty() {
            out.extend_from_slice(raw);
        } else {
            self.queued_bytes += raw.len();
            self.queue.push(Held {
                raw: raw.clone(),
                choices,
            });
        }
    }

    /// Reads one choice of a chunk: its entries into their calls, its finish.
    fn on_choice(
        &mut self,
        cx: &mut Cx,
        pos: usize,
        view: &ChoiceView<'_>,
    ) -> Result<HeldChoice, Fatal> {
        let choice = view.index;
        let mut hc = HeldChoice {
            pos,
            choice,
            entries: Vec::new(),
            finish: None,
        };
        let entries: Vec<&RawValue> = match view.delta {
            Some(d) => match serde_json::from_str::<DeltaView<'_>>(d.get()) {
                Ok(dv) => {
                    if let Some(name) = dv.function_call.as_ref().and_then(|f| f.name.as_deref()) {
                        let legacy = self.legacy_names.entry(choice).or_default();
                        legacy.push_str(name);
                        if legacy.len() > self.max_buffer {
                            return Err(Fatal::new("function_call name exceeds the buffer limit"));
                        }
                        let decision = cx.check(legacy, None);
                        if decision.is_blocked() {
                            // Rare legacy form: no replacement protocol, so end the stream.
                            let name = legacy.clone();
                            cx.record(name.clone(), String::new(), None, decision);
                            return Err(Fatal::new(format!("blocked function_call '{name}'")));
                        }
                        // Its arguments are not held here: a tool argument rules judge cannot
                        // come in this form, it ends the stream
                        // (`arguments_after_the_finish_and_legacy_calls_of_judged_tools_end_the_stream`).
                        if cx.needs_arguments(legacy, None) {
                            let name = legacy.clone();
                            let refused = decision.overruled(
                                "a legacy function_call of a tool argument rules judge: its arguments are not held for judging in this form; refused".into(),
                            );
                            cx.record(name.clone(), String::new(), None, refused);
                            return Err(Fatal::new(format!(
                                "function_call '{name}' of a tool argument rules judge"
                            )));
                        }
                    }
                    dv.tool_calls.unwrap_or_default()
                }
                Err(e) => {
                    cx.malformed(&e, true)?;
                    Vec::new()
                }
            },
            None => Vec::new(),
        };
        // The SDKs keep choices in a list: Python's `openai` files a choice whose `index` is
        // past the end of the list at the end, so a later `index` can name that same entry and
        // join its calls' names with another's. Calls are judged per choice index, so they are
        // accepted only in a choice whose lower indices all came before it (streams of one
        // choice, and n > 1 streams that send the choices in order; a stream with tool calls
        // only in a later choice whose earlier ones held only text is ended, fail closed).
        self.seen_choices.insert(choice);
        if (!entries.is_empty() || self.legacy_names.contains_key(&choice))
            && ((self.seen_choices.len() as u64) <= choice
                || (0..choice).any(|c| !self.seen_choices.contains(&c)))
        {
            return Err(Fatal::new(format!(
                "tool calls in choice {choice} before every lower choice index was seen: an SDK could file them under another choice"
            )));
        }
        // Calls the SDKs consider done after this chunk (they switched away from them).
        let mut switched: Vec<u64> = Vec::new();
        for (epos, entry) in entries.iter().enumerate() {
            let call: CallView<'_> = match serde_json::from_str(entry.get()) {
                Ok(c) => c,
                Err(e) => {
                    // Valid JSON we cannot read as a call: this ends the stream.
                    cx.malformed(&e, true)?;
                    continue;
                }
            };
            self.on_entry(choice, &call, &mut switched)?;
            hc.entries.push((epos, call.index));
        }
        if let Some(cs) = self.choices.get_mut(&choice) {
            for index in switched {
                if let Some(c) = cs.calls.get_mut(&index)
                    && c.dirty
                    && matches!(c.state, State::Pending)
                {
                    c.judge(cx, false);
                }
            }
        }
        if let Some(reason) = view.finish_reason.as_deref() {
            hc.finish = Some(reason == "tool_calls");
            self.decide_choice(cx, choice);
        }
        Ok(hc)
    }

    /// Adds one entry to its call (created at its first entry).
    fn on_entry(
        &mut self,
        choice: u64,
        call: &CallView<'_>,
        switched: &mut Vec<u64>,
    ) -> Result<(), Fatal> {
        let index = call.index;
        let function_name = call.function.as_ref().and_then(|f| f.name.as_deref());
        let custom_name = call.custom.as_ref().and_then(|c| c.name.as_deref());
        let names_something = function_name.is_some_and(|n| !n.is_empty())
            || custom_name.is_some_and(|n| !n.is_empty());
        let cs = self.choices.entry(choice).or_default();
        if cs.decided {
            return match cs.calls.get(&index).map(|c| c.state) {
                // Dropped when released.
                Some(State::Blocked) => Ok(()),
                // Nothing more of a kept call after its choice finished: arguments then were
                // judged by no one, yet the SDKs append them (`{"a":500}` after `finish_reason`
                // would reach the SDK past an argument rule).
                Some(State::Allowed(_))
                    if !names_something
                        && call
                            .function
                            .as_ref()
                            .and_then(|f| f.arguments.as_deref())
                            .is_none_or(str::is_empty) =>
                {
                    Ok(())
                }
                Some(State::Allowed(_)) if !names_something => Err(Fatal::new(format!(
                    "arguments for tool call {index} of choice {choice} after the choice finished"
                ))),
                Some(_) => Err(Fatal::new(format!(
                    "tool call {index} of choice {choice} renamed after its choice finished"
                ))),
                None => Err(Fatal::new(format!(
                    "tool call {index} started after choice {choice} finished"
                ))),
            };
        }
        if cs.current != Some(index) {
            if let Some(previous) = cs.current {
                switched.push(previous);
            }
            cs.current = Some(index);
        }
        if cs.calls.is_empty() {
            self.pending += 1;
        }
        let c = match cs.calls.entry(index) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                cs.order.push(index);
                v.insert(Call::new())
            }
        };
        let before = c.held();
        if let Some(id) = call.id.as_deref() {
            c.id.push_str(id);
        }
        if let Some(n) = function_name {
            c.dirty |= c.function.push(n) > 0;
        }
        if let Some(n) = custom_name {
            c.dirty |= c.custom.get_or_insert_with(NameView::default).push(n) > 0;
        }
        if let Some(a) = call.function.as_ref().and_then(|f| f.arguments.as_deref()) {
            push_capped(&mut c.args, a);
        }
        self.state_bytes += c.held() - before;
        Ok(())
    }
}
