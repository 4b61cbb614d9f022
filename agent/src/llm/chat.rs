//! OpenAI Chat Completions streaming (seed 000's array filtering, made chunking-proof).
//!
//! Each `tool_calls` entry is tracked by (choice index, tool index). A call is decided as soon
//! as its name is known to be complete: when an entry carries `arguments` (OpenAI sends the whole
//! name with `"arguments":""` in the first chunk, so standard streams are decided at once and
//! pass byte-identical). A name that arrives in pieces without `arguments` is held back (those
//! entries are taken out of their chunks) until the name is complete, `finish_reason` arrives
//! or the stream ends; an allowed held call is then re-emitted in one synthetic chunk just
//! before the chunk that completed it. Blocked entries are removed from every chunk, the
//! choice's `content` gets the explanation, and `finish_reason` `tool_calls` becomes `stop` when
//! every call of the choice was blocked. A name that grows after its call was decided is
//! re-checked; if it turns into a blocked one the stream is ended (fail closed).

use std::borrow::Cow;
use std::sync::LazyLock;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{RawObject, quote, raw_array, raw_from_json, raw_str};
use super::sse::{write_event, write_with_data};
use super::{Cx, Fatal, Keys, Machine, blocked_message, push_capped, trim_ws};
use crate::decision::Decision;

/// The keys a tool call comes under (the legacy `function_call` too).
static TOOL_KEYS: LazyLock<Keys> =
    LazyLock::new(|| Keys::new(&["\"tool_calls\"", "\"function_call\""]));

#[derive(Deserialize)]
struct ChoiceView<'a> {
    #[serde(default)]
    index: u64,
    #[serde(default, borrow)]
    delta: Option<&'a RawValue>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct DeltaView<'a> {
    #[serde(default, borrow)]
    tool_calls: Option<Vec<&'a RawValue>>,
    /// The deprecated single `function_call` (the `functions` request parameter).
    #[serde(default, borrow)]
    function_call: Option<FunctionView<'a>>,
}

#[derive(Deserialize)]
pub(crate) struct CallView<'a> {
    #[serde(default)]
    pub index: u64,
    #[serde(default, borrow)]
    pub id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub function: Option<FunctionView<'a>>,
    /// A custom tool call (`"type":"custom"`): free-form `input` instead of JSON arguments.
    #[serde(default, borrow)]
    pub custom: Option<CustomView<'a>>,
}

#[derive(Deserialize)]
pub(crate) struct CustomView<'a> {
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub input: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
pub(crate) struct FunctionView<'a> {
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub arguments: Option<Cow<'a, str>>,
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum State {
    /// Name not known to be complete; entries held back.
    Pending,
    Allowed,
    Blocked,
}

struct Call {
    choice: u64,
    index: u64,
    state: State,
    id: String,
    name: String,
    /// Arguments held back (Pending) or assembled to record (Allowed MCP).
    args: String,
    /// Allowed MCP call to record at the end of its choice.
    decision: Option<Decision>,
}

/// Streaming state of one chat completion.
#[derive(Default)]
pub(crate) struct Chat {
    calls: Vec<Call>,
    /// Top-level fields (id, model, ...) to build synthetic chunks with.
    template: Option<String>,
    /// Name of each choice's legacy `function_call`, as assembled so far (by choice index:
    /// with `n > 1` the choices' fragments interleave).
    legacy_names: Vec<(u64, String)>,
}

/// What one chunk's choice needs changed.
#[derive(Default)]
struct ChoiceEdit {
    /// Keep only these tool_calls entries (positions), when some were removed.
    removed_any: bool,
    keep: Vec<usize>,
    messages: Vec<String>,
    finish_stop: bool,
}

impl Machine for Chat {
    fn on_event(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        data: Option<Cow<'_, [u8]>>,
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        let Some(data) = data else {
            out.extend_from_slice(raw);
            return Ok(());
        };
        let body = trim_ws(&data);
        if body.starts_with(b"[DONE]") {
            self.resolve_all(cx, out)?;
            self.record_all(cx, None);
            out.extend_from_slice(raw);
            return Ok(());
        }
        let has_tool_key = TOOL_KEYS.any_in(body);
        if self.quiet_keys().is_some() && !has_tool_key {
            out.extend_from_slice(raw);
            return Ok(());
        }
        let text = match std::str::from_utf8(body) {
            Ok(t) => t,
            Err(_) => return Err(Fatal::new("SSE data is not UTF-8")),
        };
        let mut top = match RawObject::parse(text) {
            Ok(t) => t,
            Err(e) => {
                cx.malformed(&e, has_tool_key)?;
                out.extend_from_slice(raw);
                return Ok(());
            }
        };
        let Some(choices_raw) = top.get("choices") else {
            out.extend_from_slice(raw);
            return Ok(());
        };
        let choices: Vec<&RawValue> = match serde_json::from_str(choices_raw.get()) {
            Ok(c) => c,
            Err(e) => {
                cx.malformed(&e, has_tool_key)?;
                out.extend_from_slice(raw);
                return Ok(());
            }
        };
        let mut edits: Vec<Option<ChoiceEdit>> = Vec::with_capacity(choices.len());
        let mut synthetic: Vec<String> = Vec::new();
        for choice in &choices {
            let view: ChoiceView<'_> = match serde_json::from_str(choice.get()) {
                Ok(v) => v,
                Err(e) => {
                    cx.malformed(&e, has_tool_key)?;
                    edits.push(None);
                    continue;
                }
            };
            let edit = self.on_choice(cx, &view, &top, &mut synthetic)?;
            edits.push(edit);
        }
        for s in &synthetic {
            write_event(out, None, s.as_bytes());
        }
        if edits.iter().all(Option::is_none) {
            out.extend_from_slice(raw);
            return Ok(());
        }
        let mut new_choices: Vec<Box<RawValue>> = Vec::with_capacity(choices.len());
        for (choice, edit) in choices.iter().zip(edits) {
            match edit {
                None => new_choices.push((*choice).to_owned()),
                Some(edit) => new_choices.push(apply_edit(choice, edit)?),
            }
        }
        top.set("choices", raw_array(new_choices.iter().map(|c| c.as_ref())));
        write_with_data(out, raw, top.to_json().as_bytes());
        Ok(())
    }

    fn on_end(&mut self, cx: &mut Cx, out: &mut BytesMut) {
        // A held call whose stream ended: decide, and pass it if allowed (the client would
        // have had it had we not held it).
        if let Err(f) = self.resolve_all(cx, out) {
            tracing::warn!(why = %f.0, "chat stream ended with an undecidable call");
        }
        self.record_all(cx, None);
    }

    fn write_error(&self, out: &mut BytesMut, message: &str) {
        let data = format!(
            r#"{{"error":{{"message":{},"type":"toolwall_error","code":"toolwall_blocked"}}}}"#,
            quote(message)
        );
        write_event(out, None, data.as_bytes());
    }

    fn quiet_keys(&self) -> Option<&'static Keys> {
        self.calls.is_empty().then(|| &*TOOL_KEYS)
    }
}

impl Chat {
    fn call_mut(&mut self, choice: u64, index: u64) -> &mut Call {
        let pos = match self
            .calls
            .iter()
            .position(|c| c.choice == choice && c.index == index)
        {
            Some(p) => p,
            None => {
                self.calls.push(Call {
                    choice,
                    index,
                    state: State::Pending,
                    id: String::new(),
                    name: String::new(),
                    args: String::new(),
                    decision: None,
                });
                self.calls.len() - 1
            }
        };
        &mut self.calls[pos]
    }

    fn on_choice(
        &mut self,
        cx: &mut Cx,
        view: &ChoiceView<'_>,
        top: &RawObject<'_>,
        synthetic: &mut Vec<String>,
    ) -> Result<Option<ChoiceEdit>, Fatal> {
        let mut edit = ChoiceEdit::default();
        let mut changed = false;
        let entries: Vec<&RawValue> = match view.delta {
            Some(d) => match serde_json::from_str::<DeltaView<'_>>(d.get()) {
                Ok(dv) => {
                    if let Some(name) = dv.function_call.as_ref().and_then(|f| f.name.as_deref()) {
                        let pos = match self.legacy_names.iter().position(|(c, _)| *c == view.index)
                        {
                            Some(pos) => pos,
                            None => {
                                self.legacy_names.push((view.index, String::new()));
                                self.legacy_names.len() - 1
                            }
                        };
                        let legacy = &mut self.legacy_names[pos].1;
                        legacy.push_str(name);
                        let decision = cx.check(legacy, None);
                        if decision.is_blocked() {
                            // Rare legacy form: no replacement protocol, so end the stream.
                            let name = legacy.clone();
                            cx.record(name.clone(), String::new(), None, decision);
                            return Err(Fatal::new(format!("blocked function_call '{name}'")));
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
        for (pos, entry) in entries.iter().enumerate() {
            let call: CallView<'_> = match serde_json::from_str(entry.get()) {
                Ok(c) => c,
                Err(e) => {
                    cx.malformed(&e, true)?;
                    edit.keep.push(pos);
                    continue;
                }
            };
            let (name_part, args_part) = match &call.function {
                Some(f) => (f.name.as_deref(), f.arguments.as_deref()),
                None => (None, None),
            };
            let choice = view.index;
            let c = self.call_mut(choice, call.index);
            match c.state {
                State::Pending => {
                    let held_name = c.name.clone();
                    let held_args = std::mem::take(&mut c.args);
                    let held_id = c.id.clone();
                    if let Some(id) = &call.id {
                        c.id.push_str(id);
                    }
                    if let Some(n) = name_part {
                        c.name.push_str(n);
                    }
                    if args_part.is_some() && !c.name.is_empty() {
                        // Name complete: decide now.
                        let was_held = !held_name.is_empty() || !held_id.is_empty();
                        // This entry leaves verbatim after the synthetic one carrying the held
                        // name: a client that replaces a name instead of appending to it ends
                        // up with this part alone, so it is judged alone as well.
                        let alone = name_part.filter(|_| !held_name.is_empty());
                        let allowed =
                            self.decide(cx, choice, call.index, alone, &mut edit.messages);
                        if allowed {
                            if was_held {
                                synthetic.push(synthetic_chunk(
                                    top, choice, call.index, &held_id, &held_name, &held_args,
                                ));
                            }
                            let c = self.call_mut(choice, call.index);
                            if c.decision.is_some() {
                                push_capped(&mut c.args, &held_args);
                                push_capped(&mut c.args, args_part.unwrap_or_default());
                            }
                            edit.keep.push(pos);
                        } else {
                            edit.removed_any = true;
                            changed = true;
                        }
                    } else {
                        // Hold this entry back.
                        let c = self.call_mut(choice, call.index);
                        // Held arguments are re-emitted verbatim: never capped (no `arguments`
                        // key reached here, so this stays empty in practice).
                        c.args = held_args;
                        c.args.push_str(args_part.unwrap_or_default());
                        if self.template.is_none() {
                            self.template = Some(template_of(top));
                        }
                        edit.removed_any = true;
                        changed = true;
                    }
                }
                State::Allowed => {
                    if let Some(n) = name_part.filter(|n| !n.is_empty()) {
                        // Some providers (Gemini's OpenAI-compatible endpoint) leave `index`
                        // out or repeat it, so a new call with its own id can land on an
                        // allowed one. Judge the new name on its own as well as joined: a
                        // blocked tool must never ride in on another call's slot.
                        let new_call = call
                            .id
                            .as_deref()
                            .is_some_and(|id| !id.is_empty() && !c.id.is_empty() && id != c.id);
                        if cx.check(n, None).is_blocked() {
                            return Err(Fatal::new(format!(
                                "blocked tool '{n}' arrived on the slot of an allowed call (index {})",
                                call.index
                            )));
                        }
                        if !new_call {
                            c.name.push_str(n);
                            let name = c.name.clone();
                            if cx.check(&name, None).is_blocked() {
                                return Err(Fatal::new(format!(
                                    "tool name grew into blocked '{name}' after it was allowed"
                                )));
                            }
                        }
                    }
                    if c.decision.is_some() {
                        push_capped(&mut c.args, args_part.unwrap_or_default());
                    }
                    edit.keep.push(pos);
                }
                State::Blocked => {
                    edit.removed_any = true;
                    changed = true;
                }
            }
        }
        if let Some(reason) = view.finish_reason.as_deref() {
            // Finish for this choice: decide every call still held.
            let pending: Vec<u64> = self
                .calls
                .iter()
                .filter(|c| c.choice == view.index && c.state == State::Pending)
                .map(|c| c.index)
                .collect();
            for index in pending {
                self.release(cx, top, view.index, index, &mut edit.messages, synthetic);
            }
            let (total, blocked) = self.counts(view.index);
            if total > 0 && total == blocked && reason == "tool_calls" {
                edit.finish_stop = true;
                changed = true;
            }
            self.record_all(cx, Some(view.index));
        }
        if !edit.messages.is_empty() {
            changed = true;
        }
        Ok(changed.then_some(edit))
    }

    /// Decides a call whose name is complete; returns whether it is allowed. `alone` is a last
    /// name fragment that clients replacing names (rather than appending) would keep: the call
    /// is blocked if either the whole name or that fragment is.
    fn decide(
        &mut self,
        cx: &mut Cx,
        choice: u64,
        index: u64,
        alone: Option<&str>,
        messages: &mut Vec<String>,
    ) -> bool {
        let c = self.call_mut(choice, index);
        let mut name = c.name.clone();
        let id = c.id.clone();
        let mut decision = cx.check(&name, None);
        if !decision.is_blocked()
            && let Some(part) = alone.filter(|p| !p.is_empty() && *p != name)
        {
            let own = cx.check(part, None);
            if own.is_blocked() {
                name = part.to_owned();
                decision = own;
            }
        }
        if decision.is_blocked() {
            messages.push(blocked_message(&name, &decision.reason));
            let c = self.call_mut(choice, index);
            c.state = State::Blocked;
            c.args.clear();
            cx.record(name, id, None, decision);
            false
        } else {
            let c = self.call_mut(choice, index);
            c.state = State::Allowed;
            c.args.clear();
            if decision.tool.is_some() {
                c.decision = Some(decision);
            }
            true
        }
    }

    /// Decides a held call at the end of its choice or stream, emitting it if allowed.
    fn release(
        &mut self,
        cx: &mut Cx,
        top: &RawObject<'_>,
        choice: u64,
        index: u64,
        messages: &mut Vec<String>,
        synthetic: &mut Vec<String>,
    ) {
        let c = self.call_mut(choice, index);
        let (id, name, args) = (c.id.clone(), c.name.clone(), c.args.clone());
        if self.decide(cx, choice, index, None, messages) {
            synthetic.push(synthetic_chunk(top, choice, index, &id, &name, &args));
            if let Some(c) = self
                .calls
                .iter_mut()
                .find(|c| c.choice == choice && c.index == index && c.decision.is_some())
            {
                c.args = args;
            }
        }
    }

    /// At `[DONE]` or end of stream: held calls of unfinished choices are decided; blocked ones
    /// get their explanation in a chunk of their own.
    fn resolve_all(&mut self, cx: &mut Cx, out: &mut BytesMut) -> Result<(), Fatal> {
        let pending: Vec<(u64, u64)> = self
            .calls
            .iter()
            .filter(|c| c.state == State::Pending)
            .map(|c| (c.choice, c.index))
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        let template = self.template.clone().unwrap_or_else(|| "{}".to_owned());
        let top = RawObject::parse(&template).map_err(|_| Fatal::new("bad template"))?;
        for (choice, index) in pending {
            let mut messages = Vec::new();
            let mut synthetic = Vec::new();
            self.release(cx, &top, choice, index, &mut messages, &mut synthetic);
            for s in synthetic {
                write_event(out, None, s.as_bytes());
            }
            for m in messages {
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

    fn counts(&self, choice: u64) -> (usize, usize) {
        let mine = self.calls.iter().filter(|c| c.choice == choice);
        let total = mine.clone().count();
        let blocked = mine.filter(|c| c.state == State::Blocked).count();
        (total, blocked)
    }

    /// Records the allowed MCP calls of `choice` (or of every choice), now that their
    /// arguments are complete.
    fn record_all(&mut self, cx: &mut Cx, choice: Option<u64>) {
        for c in self.calls.iter_mut() {
            if choice.is_some_and(|ch| ch != c.choice) {
                continue;
            }
            if let Some(decision) = c.decision.take() {
                let input = serde_json::from_str(&c.args).ok();
                cx.record(c.name.clone(), c.id.clone(), input, decision);
            }
        }
    }
}

/// The top-level fields of a chunk except `choices`, as JSON, for synthetic chunks.
fn template_of(top: &RawObject<'_>) -> String {
    let mut t = top.clone();
    t.remove("choices");
    t.to_json()
}

fn synthetic_chunk(
    top: &RawObject<'_>,
    choice: u64,
    index: u64,
    id: &str,
    name: &str,
    args: &str,
) -> String {
    let mut t = top.clone();
    let id = if id.is_empty() {
        String::new()
    } else {
        format!(r#""id":{},"#, quote(id))
    };
    t.set(
        "choices",
        raw_from_json(format!(
            r#"[{{"index":{choice},"delta":{{"tool_calls":[{{"index":{index},{id}"type":"function","function":{{"name":{},"arguments":{}}}}}]}},"finish_reason":null}}]"#,
            quote(name),
            quote(args)
        )),
    );
    t.to_json()
}

/// Applies one choice's edit: filtered `tool_calls`, explanation in `content`, finish reason.
fn apply_edit(choice: &RawValue, edit: ChoiceEdit) -> Result<Box<RawValue>, Fatal> {
    let bad = |_| Fatal::new("chunk changed under us");
    let mut obj = RawObject::from_raw(choice).map_err(bad)?;
    if let Some(delta_raw) = obj.get("delta") {
        let mut delta = RawObject::from_raw(delta_raw).map_err(bad)?;
        if edit.removed_any
            && let Some(tc) = delta.get("tool_calls")
        {
            let entries: Vec<&RawValue> = serde_json::from_str(tc.get()).map_err(bad)?;
            let kept: Vec<&RawValue> = edit
                .keep
                .iter()
                .filter_map(|&i| entries.get(i).copied())
                .collect();
            if kept.is_empty() {
                delta.remove("tool_calls");
            } else {
                let arr = raw_array(kept);
                delta.set("tool_calls", arr);
            }
        }
        if !edit.messages.is_empty() {
            let mut content = delta.get_str("content").unwrap_or_default();
            for m in &edit.messages {
                content.push_str(m);
            }
            delta.set("content", raw_str(&content));
        }
        let delta = delta.to_raw();
        obj.set("delta", delta);
    } else if !edit.messages.is_empty() {
        let mut content = String::new();
        for m in &edit.messages {
            content.push_str(m);
        }
        obj.set(
            "delta",
            raw_from_json(format!(r#"{{"content":{}}}"#, quote(&content))),
        );
    }
    if edit.finish_stop {
        obj.set("finish_reason", raw_str("stop"));
    }
    Ok(obj.to_raw())
}

#[cfg(test)]
pub(crate) mod tests;
