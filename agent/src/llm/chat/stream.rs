//! The Chat Completions stream machine: calls tracked per choice, events held until every
//! call of theirs is decided, then released (verbatim, or edited by [`super::edit`]).

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use bytes::{Bytes, BytesMut};
use serde_json::value::RawValue;

use super::edit::{ChoiceEdit, rewrite, template_of};
use super::{CallView, ChoiceView, DeltaView, TOOL_KEYS};
use crate::decision::{CallStage, Decision};
use crate::llm::json::{RawObject, quote, raw_from_json};
use crate::llm::{Cx, Fatal, Keys, Machine, blocked_message, push_capped};
use crate::sse::write_event;

/// Fixed bytes charged per tracked call against the buffer limit.
const CALL_COST: usize = 64;

#[derive(Clone, Copy)]
enum State {
    /// Its choice has not finished: entries held back.
    Pending,
    /// Kept, under this (dense) index.
    Allowed(u64),
    Blocked,
}

/// One name as the SDKs accumulate it: every fragment appended (Python) and the last non-empty
/// fragment (TypeScript), which is a suffix of the first.
#[derive(Default)]
struct NameView {
    joined: String,
    last_start: usize,
}

impl NameView {
    fn push(&mut self, part: &str) -> usize {
        if part.is_empty() {
            return 0;
        }
        self.last_start = self.joined.len();
        self.joined.push_str(part);
        part.len()
    }

    fn last(&self) -> &str {
        &self.joined[self.last_start..]
    }
}

struct Call {
    state: State,
    id: String,
    function: NameView,
    /// Names of a `custom` object, if one came.
    custom: Option<NameView>,
    /// A name fragment came since the names were last judged.
    dirty: bool,
    /// The first blocked name found for this call, with its decision.
    blocked: Option<(String, Decision)>,
    /// Arguments assembled to record an allowed MCP call.
    args: String,
}

impl Call {
    fn new() -> Self {
        Call {
            state: State::Pending,
            id: String::new(),
            function: NameView::default(),
            custom: None,
            dirty: true,
            blocked: None,
            args: String::new(),
        }
    }

    /// Bytes this call holds against the buffer limit.
    fn held(&self) -> usize {
        CALL_COST
            + self.id.len()
            + self.function.joined.len()
            + self.custom.as_ref().map_or(0, |c| c.joined.len())
    }

    /// Judges every view of the names as they are now; returns the allowed decisions about MCP
    /// tools (to record), and notes the first blocked name. `last` is the final decision: its
    /// first view (the appended name) is asked as a proposed call, once, spending rate-limit
    /// budget; every other view, and every look before the last, is an inspection.
    fn judge(&mut self, cx: &Cx, last: bool) -> Vec<(String, Decision)> {
        self.dirty = false;
        let mut names: Vec<&str> = vec![self.function.joined.as_str(), self.function.last()];
        if let Some(c) = &self.custom {
            names.push(c.joined.as_str());
            names.push(c.last());
        }
        let mut allowed: Vec<(String, Decision)> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            if self.blocked.is_some() {
                break;
            }
            if names[..i].contains(name) {
                continue;
            }
            // The choice finished: the arguments are whole, and the function's names are
            // judged on them too (argument rules; issue 16) — the events were held till now.
            let decision = match (last, i) {
                (true, 0) => cx.check_complete(name, None, Some(&self.args)),
                (true, 1) => cx.complete_at(name, None, Some(&self.args), CallStage::Inspected),
                _ => cx.inspect(name),
            };
            if decision.is_blocked() {
                self.blocked = Some(((*name).to_owned(), decision));
            } else if decision.tool.is_some() {
                allowed.push(((*name).to_owned(), decision));
            }
        }
        allowed
    }
}

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
    fn on_dataless(&mut self, raw: &Bytes, out: &mut BytesMut) {
        // Behind a held event it must wait its turn.
        self.pass(raw, Vec::new(), out);
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
                        // come in this form (helper-30), it ends the stream.
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
                // judged by no one, yet the SDKs append them (helper-30: `{"a":500}` after
                // `finish_reason` reached the SDK past an argument rule).
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

    /// Judges every call of a finished choice (every name is final now), numbering the kept
    /// ones densely in the order they came; records every decision.
    fn decide_choice(&mut self, cx: &mut Cx, choice: u64) {
        let Some(cs) = self.choices.get_mut(&choice) else {
            return;
        };
        if cs.decided {
            return;
        }
        cs.decided = true;
        if !cs.calls.is_empty() {
            self.pending -= 1;
        }
        let mut dense = 0u64;
        let mut allowed_records = Vec::new();
        let mut freed = 0usize;
        for index in std::mem::take(&mut cs.order) {
            let Some(c) = cs.calls.get_mut(&index) else {
                continue;
            };
            let allowed = c.judge(cx, true);
            let id = std::mem::take(&mut c.id);
            if let Some((name, decision)) = c.blocked.take() {
                cs.messages.push(blocked_message(&name, &decision.reason));
                cx.record(name, id.clone(), None, decision);
                c.state = State::Blocked;
                cs.blocked += 1;
            } else {
                c.state = State::Allowed(dense);
                dense += 1;
                if !allowed.is_empty() {
                    let input: Option<serde_json::Value> = serde_json::from_str(&c.args).ok();
                    for (name, decision) in allowed {
                        allowed_records.push((name, id.clone(), input.clone(), decision));
                    }
                }
            }
            freed += c.held() - CALL_COST + id.len();
            c.function = NameView::default();
            c.custom = None;
            c.args = String::new();
        }
        self.state_bytes -= freed;
        for (name, id, input, decision) in allowed_records {
            cx.record(name, id, input, decision);
        }
    }

    /// Releases the held events, edited where a call was blocked or renumbered.
    fn flush(&mut self, out: &mut BytesMut) -> Result<(), Fatal> {
        self.queued_bytes = 0;
        for held in std::mem::take(&mut self.queue) {
            let mut edits: Vec<(usize, ChoiceEdit)> = Vec::new();
            for hc in held.choices {
                let Some(cs) = self.choices.get_mut(&hc.choice) else {
                    continue;
                };
                let mut edit = ChoiceEdit::default();
                for (epos, index) in hc.entries {
                    match cs.calls.get(&index).map(|c| c.state) {
                        Some(State::Allowed(dense)) if dense != index => {
                            edit.entries.push((epos, Some(dense)));
                        }
                        Some(State::Blocked) => edit.entries.push((epos, None)),
                        _ => {}
                    }
                }
                if let Some(tool_calls) = hc.finish {
                    edit.messages = std::mem::take(&mut cs.messages);
                    edit.finish_stop =
                        tool_calls && !cs.calls.is_empty() && cs.blocked == cs.calls.len();
                }
                if !edit.entries.is_empty() || !edit.messages.is_empty() || edit.finish_stop {
                    edits.push((hc.pos, edit));
                }
            }
            if edits.is_empty() {
                out.extend_from_slice(&held.raw);
            } else {
                rewrite(&held.raw, edits, out)?;
            }
        }
        Ok(())
    }

    /// At `[DONE]` or the end of the stream: every name is final. Decides the choices still
    /// open, releases what is held, and explains their blocked calls in chunks of their own.
    fn finish_all(&mut self, cx: &mut Cx, out: &mut BytesMut) -> Result<(), Fatal> {
        let mut open: Vec<u64> = self
            .choices
            .iter()
            .filter(|(_, cs)| !cs.decided)
            .map(|(i, _)| *i)
            .collect();
        open.sort_unstable();
        for &choice in &open {
            self.decide_choice(cx, choice);
        }
        self.flush(out)?;
        let template = self.template.clone().unwrap_or_else(|| "{}".to_owned());
        let top = RawObject::parse(&template).map_err(|_| Fatal::new("bad template"))?;
        for choice in open {
            let Some(cs) = self.choices.get_mut(&choice) else {
                continue;
            };
            for m in std::mem::take(&mut cs.messages) {
                let mut chunk = top.clone();
                chunk.set(
                    "choices",
                    raw_from_json(format!(
                        r#"[{{"index":{choice},"delta":{{"content":{}}},"finish_reason":null}}]"#,
                        quote(&m)
                    )),
                );
                write_event(out, None, chunk.to_json().as_bytes());
            }
        }
        Ok(())
    }
}
