//! The Responses API stream machine: each tool item decided at `added` (custom tool calls held
//! until `done`), blocked ones replaced by message items, later copies judged again if changed.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use serde_json::value::RawValue;

use super::judge::{judge_custom, judge_item};
use super::{
    CALL_KEYS, Envelope, Item, Judged, ResponseOutput, TEXT_PREFIXES, display_name, message_item,
    write_message_done, write_message_open,
};
use crate::decision::Decision;
use crate::llm::json::{RawObject, quote, raw_array, raw_from_json};
use crate::llm::{Cx, Fatal, Keys, Machine, blocked_message};
use crate::sse::{write_event, write_with_data};

enum ItemState {
    /// Replaced by a message item with this text.
    Blocked { message_id: String, text: String },
    /// Allowed MCP function call, recorded at its `output_item.done`.
    Tracked {
        name: String,
        decision: Decision,
        judged: Judged,
    },
    /// A custom tool call held back until its code is complete, or a function call argument
    /// rules judge (its name and namespace) held until its arguments are (issue 16).
    Held {
        events: Vec<Bytes>,
        input: String,
        bytes: usize,
        function: Option<(String, Option<String>)>,
    },
}

struct Entry {
    output_index: u64,
    item_id: String,
    state: ItemState,
}

/// Streaming state of one Responses API response.
pub(crate) struct Responses {
    items: Vec<Entry>,
    /// Where in `items` each output index and item id is (the first entry that has it): every
    /// event finds its item in O(1), however many calls the response holds (issue 12: linear
    /// searches made CPU grow with the square of the calls).
    by_output: HashMap<u64, usize>,
    by_id: HashMap<String, usize>,
    /// Tool items already decided and passed, by id, with what they were judged on: one that
    /// comes again unchanged is not re-asked; a changed one is.
    passed: HashMap<String, Judged>,
    max_held: usize,
}

impl Responses {
    pub(crate) fn new(max_held: usize) -> Self {
        Responses {
            items: Vec::new(),
            by_output: HashMap::new(),
            by_id: HashMap::new(),
            passed: HashMap::new(),
            max_held,
        }
    }

    /// Notes an item as passed, as judged (replacing an earlier entry for the same id).
    fn mark_passed(&mut self, id: String, judged: Judged) {
        self.passed.insert(id, judged);
    }

    /// Whether this exact item (same id, same fingerprint) was already passed.
    fn was_passed(&self, item: &Item<'_>) -> bool {
        let Some(id) = item.id.as_deref() else {
            return false;
        };
        self.passed.get(id) == Some(&Judged::item(item))
    }

    fn find(&self, env: &Envelope<'_>) -> Option<usize> {
        env.output_index
            .and_then(|i| self.by_output.get(&i))
            .or_else(|| env.item_id.as_deref().and_then(|id| self.by_id.get(id)))
            .copied()
    }

    fn push_item(&mut self, entry: Entry) {
        let pos = self.items.len();
        self.by_output.entry(entry.output_index).or_insert(pos);
        self.by_id.entry(entry.item_id.clone()).or_insert(pos);
        self.items.push(entry);
    }

    /// Removes the entry at `pos` (the last one moves into its place, re-indexed).
    fn remove_item(&mut self, pos: usize) -> Entry {
        let entry = self.items.swap_remove(pos);
        if self.by_output.get(&entry.output_index) == Some(&pos) {
            self.by_output.remove(&entry.output_index);
        }
        if self.by_id.get(&entry.item_id) == Some(&pos) {
            self.by_id.remove(&entry.item_id);
        }
        let moved_from = self.items.len();
        if let Some(moved) = self.items.get(pos) {
            if let Some(p) = self.by_output.get_mut(&moved.output_index)
                && *p == moved_from
            {
                *p = pos;
            }
            if let Some(p) = self.by_id.get_mut(&moved.item_id)
                && *p == moved_from
            {
                *p = pos;
            }
        }
        entry
    }
}

impl Machine for Responses {
    fn on_data(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        // A text delta passes unparsed unless it names a call (a repeated `"type"` key later in
        // the object is the one most parsers keep).
        if TEXT_PREFIXES.iter().any(|p| body.starts_with(p)) && !CALL_KEYS.any_in(body) {
            out.extend_from_slice(raw);
            return Ok(());
        }
        if self.quiet_keys().is_some() && !CALL_KEYS.any_in(body) {
            out.extend_from_slice(raw);
            return Ok(());
        }
        let env: Envelope<'_> = match serde_json::from_slice(body) {
            Ok(e) => e,
            Err(e) => {
                cx.malformed(&e, CALL_KEYS.any_in(body))?;
                out.extend_from_slice(raw);
                return Ok(());
            }
        };
        let seq = env.sequence_number.map_or("0", |s| s.get()).to_owned();
        match env.ty.as_ref() {
            "response.output_item.added" => self.on_added(cx, raw, &env, &seq, out),
            "response.output_item.done" => self.on_done(cx, raw, &env, &seq, out),
            "response.function_call_arguments.delta" | "response.function_call_arguments.done" => {
                blocked_in_other_event(cx, &env)?;
                let max = self.max_held;
                match self.find(&env).map(|i| &mut self.items[i].state) {
                    Some(ItemState::Blocked { .. }) => Ok(()),
                    Some(ItemState::Held {
                        events,
                        input,
                        bytes,
                        function: Some(_),
                    }) => {
                        if env.ty == "response.function_call_arguments.delta" {
                            input.push_str(&raw_string(env.delta));
                        }
                        *bytes += raw.len();
                        if *bytes > max {
                            return Err(Fatal::new(
                                "a function call held for the argument rules passed proxy.max_stream_buffer_bytes",
                            ));
                        }
                        events.push(raw.clone());
                        Ok(())
                    }
                    _ => {
                        out.extend_from_slice(raw);
                        Ok(())
                    }
                }
            }
            "response.custom_tool_call_input.delta" | "response.custom_tool_call_input.done" => {
                blocked_in_other_event(cx, &env)?;
                let max = self.max_held;
                match self.find(&env).map(|i| &mut self.items[i].state) {
                    Some(ItemState::Held {
                        events,
                        input,
                        bytes,
                        ..
                    }) => {
                        if env.ty == "response.custom_tool_call_input.delta" {
                            input.push_str(&raw_string(env.delta));
                        } else if env.input.is_some() {
                            *input = raw_string(env.input);
                        }
                        *bytes += raw.len();
                        if *bytes > max {
                            return Err(Fatal::new(
                                "custom tool call larger than the buffer limit",
                            ));
                        }
                        events.push(raw.clone());
                        Ok(())
                    }
                    Some(ItemState::Blocked { .. }) => Ok(()),
                    _ => {
                        out.extend_from_slice(raw);
                        Ok(())
                    }
                }
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.on_completed(cx, body, raw, out)
            }
            _ => {
                // Other events about a held item (none are defined today) are held with it.
                if let Some(i) = self.find(&env)
                    && let ItemState::Held { events, .. } = &mut self.items[i].state
                {
                    events.push(raw.clone());
                    return Ok(());
                }
                blocked_in_other_event(cx, &env)?;
                out.extend_from_slice(raw);
                Ok(())
            }
        }
    }

    fn on_end(&mut self, cx: &mut Cx, _out: &mut BytesMut) {
        self.by_output.clear();
        self.by_id.clear();
        for e in self.items.drain(..) {
            match e.state {
                ItemState::Tracked { name, decision, .. } => {
                    cx.record(name, e.item_id, None, decision)
                }
                ItemState::Held {
                    function: Some((name, namespace)),
                    ..
                } => {
                    let decision = cx.check_at(&name, namespace.as_deref(), crate::decision::CallStage::Inspected).overruled(
                        "the response ended before the call's arguments, which argument rules judge, were complete".into(),
                    );
                    cx.record(
                        display_name(&name, namespace.as_deref()),
                        e.item_id,
                        None,
                        decision,
                    );
                }
                ItemState::Held { .. } => tracing::warn!(
                    item = %e.item_id,
                    "stream ended inside a custom tool call; it was not passed on"
                ),
                ItemState::Blocked { .. } => {}
            }
        }
    }

    fn write_error(&self, out: &mut BytesMut, message: &str) {
        let data = format!(
            r#"{{"type":"error","code":"toolwall_blocked","message":{},"param":null,"sequence_number":0}}"#,
            quote(message)
        );
        write_event(out, Some("error"), data.as_bytes());
    }

    fn quiet_keys(&self) -> Option<&'static Keys> {
        self.items.is_empty().then(|| &*CALL_KEYS)
    }
}

/// The item of an event and the output index it stands at. Without an index no replacement
/// can take the item's place: a blocked call in it ends the stream, anything else passes as
/// it is (`None`).
fn placed<'e>(
    cx: &mut Cx,
    raw: &Bytes,
    env: &Envelope<'e>,
    out: &mut BytesMut,
) -> Result<Option<(u64, &'e RawValue)>, Fatal> {
    match (env.output_index, env.item) {
        (Some(index), Some(item)) => Ok(Some((index, item))),
        _ => {
            blocked_in_other_event(cx, env)?;
            out.extend_from_slice(raw);
            Ok(None)
        }
    }
}

impl Responses {
    fn on_added(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        env: &Envelope<'_>,
        seq: &str,
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        let Some((index, item_raw)) = placed(cx, raw, env, out)? else {
            return Ok(());
        };
        let item: Item<'_> = match serde_json::from_str(item_raw.get()) {
            Ok(i) => i,
            Err(e) => {
                cx.malformed(&e, true)?;
                out.extend_from_slice(raw);
                return Ok(());
            }
        };
        let item_id = item.id.as_deref().unwrap_or_default().to_owned();
        match item.ty.as_ref() {
            "function_call" => {
                let name = item.name.as_deref().unwrap_or_default();
                let namespace = item.namespace.as_deref();
                // One argument rules judge: its name asked now (spending nothing), the call
                // held with its events and decided on its arguments at `done`.
                let held = cx.needs_arguments(name, namespace);
                let decision = if held {
                    cx.check_at(name, namespace, crate::decision::CallStage::Inspected)
                } else {
                    cx.check(name, namespace)
                };
                let shown = display_name(name, namespace);
                let call_id = item.call_id.as_deref().unwrap_or(&item_id).to_owned();
                if held && !decision.is_blocked() {
                    if raw.len() > self.max_held {
                        return Err(Fatal::new(
                            "a function call held for the argument rules passed proxy.max_stream_buffer_bytes",
                        ));
                    }
                    self.push_item(Entry {
                        output_index: index,
                        item_id,
                        state: ItemState::Held {
                            events: vec![raw.clone()],
                            input: item.arguments.as_deref().unwrap_or_default().to_owned(),
                            bytes: raw.len(),
                            function: Some((name.to_owned(), namespace.map(str::to_owned))),
                        },
                    });
                    return Ok(());
                }
                if decision.is_blocked() {
                    let text = blocked_message(&shown, &decision.reason);
                    let message_id = format!("msg_toolwall_{item_id}");
                    write_message_open(out, seq, index, &message_id, &text);
                    cx.record(shown, call_id, None, decision);
                    self.push_item(Entry {
                        output_index: index,
                        item_id,
                        state: ItemState::Blocked { message_id, text },
                    });
                } else {
                    self.mark_passed(item_id.clone(), Judged::item(&item));
                    let judged = Judged::named(&item);
                    if decision.tool.is_some() {
                        self.push_item(Entry {
                            output_index: index,
                            item_id,
                            state: ItemState::Tracked {
                                name: shown,
                                decision,
                                judged,
                            },
                        });
                    }
                    out.extend_from_slice(raw);
                }
            }
            "custom_tool_call" => {
                let input = item.input.as_deref().unwrap_or_default().to_owned();
                self.push_item(Entry {
                    output_index: index,
                    item_id,
                    state: ItemState::Held {
                        events: vec![raw.clone()],
                        input,
                        bytes: raw.len(),
                        function: None,
                    },
                });
            }
            _ => out.extend_from_slice(raw),
        }
        Ok(())
    }

    fn on_done(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        env: &Envelope<'_>,
        seq: &str,
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        let item: Option<Item<'_>> = match env.item.map(|i| serde_json::from_str(i.get())) {
            Some(Ok(i)) => Some(i),
            Some(Err(e)) => {
                cx.malformed(&e, true)?;
                None
            }
            None => None,
        };
        let Some(pos) = self.find(env) else {
            if item.as_ref().is_some_and(|i| self.was_passed(i)) {
                // Passed at `added` as it is now (an allowed call that is not MCP).
                out.extend_from_slice(raw);
                return Ok(());
            }
            // An item we never saw added, or one that changed since: inspect it whole (a
            // stream may skip `added`).
            return self.on_done_unseen(cx, raw, env, seq, out);
        };
        let index = self.items[pos].output_index;
        match &mut self.items[pos].state {
            ItemState::Blocked { message_id, text } => {
                write_message_done(out, seq, index, message_id, text);
            }
            ItemState::Tracked { judged, .. }
                if item.as_ref().is_some_and(|i| Judged::named(i) != *judged) =>
            {
                // Allowed at `added` under another name (or type): what the agent's SDK
                // keeps is this item, so it is judged again as it is now. The decision taken
                // at `added` is dropped unrecorded; this one is recorded.
                let entry = self.remove_item(pos);
                let Some(item) = &item else {
                    return Ok(());
                };
                tracing::warn!(
                    item = %entry.item_id,
                    "tool item changed between output_item.added and .done; judged again"
                );
                let item_id = item.id.as_deref().unwrap_or(&entry.item_id).to_owned();
                match judge_item(cx, item, true) {
                    Some((text, _)) => {
                        let message_id = format!("msg_toolwall_{}", entry.item_id);
                        write_message_done(out, seq, index, &message_id, &text);
                        self.push_item(Entry {
                            output_index: index,
                            item_id,
                            state: ItemState::Blocked { message_id, text },
                        });
                    }
                    None => {
                        self.mark_passed(item_id, Judged::item(item));
                        out.extend_from_slice(raw);
                    }
                }
            }
            ItemState::Tracked { .. } => {
                let entry = self.remove_item(pos);
                if let ItemState::Tracked { name, decision, .. } = entry.state {
                    if let Some(item) = &item {
                        // Passed with these arguments: a final copy with others is judged again.
                        self.mark_passed(entry.item_id.clone(), Judged::item(item));
                    }
                    let input = item
                        .as_ref()
                        .and_then(|i| i.arguments.as_deref())
                        .and_then(|a| serde_json::from_str(a).ok());
                    let call_id = item
                        .as_ref()
                        .and_then(|i| i.call_id.as_deref())
                        .unwrap_or(&entry.item_id)
                        .to_owned();
                    cx.record(name, call_id, input, decision);
                }
                out.extend_from_slice(raw);
            }
            ItemState::Held {
                function: Some(_), ..
            } => {
                let entry = self.remove_item(pos);
                let ItemState::Held {
                    events,
                    input,
                    function: Some((name, namespace)),
                    ..
                } = entry.state
                else {
                    return Ok(());
                };
                let arguments = item
                    .as_ref()
                    .and_then(|i| i.arguments.as_deref())
                    .map_or(input, str::to_owned);
                let decision = cx.check_complete(&name, namespace.as_deref(), Some(&arguments));
                let shown = display_name(&name, namespace.as_deref());
                let call_id = item
                    .as_ref()
                    .and_then(|i| i.call_id.as_deref())
                    .unwrap_or(&entry.item_id)
                    .to_owned();
                let input = serde_json::from_str(&arguments).ok();
                if decision.is_blocked() {
                    let text = blocked_message(&shown, &decision.reason);
                    self.replace_held(out, seq, index, entry.item_id, text);
                } else {
                    if let Some(item) = &item {
                        self.mark_passed(entry.item_id, Judged::item(item));
                    }
                    for e in events {
                        out.extend_from_slice(&e);
                    }
                    out.extend_from_slice(raw);
                }
                cx.record(shown, call_id, input, decision);
            }
            ItemState::Held { .. } => {
                let entry = self.remove_item(pos);
                let ItemState::Held { events, input, .. } = entry.state else {
                    return Ok(());
                };
                let (input, name, call_id) = match &item {
                    Some(i) => (
                        i.input.as_deref().map_or(input, str::to_owned),
                        i.name.as_deref().unwrap_or_default().to_owned(),
                        i.call_id.as_deref().unwrap_or(&entry.item_id).to_owned(),
                    ),
                    None => (input, String::new(), entry.item_id.clone()),
                };
                match judge_custom(cx, &name, &call_id, &input) {
                    Some(text) => self.replace_held(out, seq, index, entry.item_id, text),
                    None => {
                        let judged = Judged::of("custom_tool_call", &name, None, &input);
                        self.mark_passed(entry.item_id, judged);
                        for e in events {
                            out.extend_from_slice(&e);
                        }
                        out.extend_from_slice(raw);
                    }
                }
            }
        }
        Ok(())
    }

    /// A held item refused at its `done`: none of its events left, so a whole message item
    /// (opened and done) takes its place.
    fn replace_held(
        &mut self,
        out: &mut BytesMut,
        seq: &str,
        index: u64,
        item_id: String,
        text: String,
    ) {
        let message_id = format!("msg_toolwall_{item_id}");
        write_message_open(out, seq, index, &message_id, &text);
        write_message_done(out, seq, index, &message_id, &text);
        self.push_item(Entry {
            output_index: index,
            item_id,
            state: ItemState::Blocked { message_id, text },
        });
    }

    fn on_done_unseen(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        env: &Envelope<'_>,
        seq: &str,
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        let Some((index, item_raw)) = placed(cx, raw, env, out)? else {
            return Ok(());
        };
        let Ok(item) = serde_json::from_str::<Item<'_>>(item_raw.get()) else {
            out.extend_from_slice(raw);
            return Ok(());
        };
        let item_id = item.id.as_deref().unwrap_or_default().to_owned();
        if let Some((text, _)) = judge_item(cx, &item, true) {
            let message_id = format!("msg_toolwall_{item_id}");
            write_message_done(out, seq, index, &message_id, &text);
            self.push_item(Entry {
                output_index: index,
                item_id,
                state: ItemState::Blocked { message_id, text },
            });
        } else {
            self.mark_passed(item_id, Judged::item(&item));
            out.extend_from_slice(raw);
        }
        Ok(())
    }

    /// Rewrites the final response: blocked items become their message items, and tool items
    /// never seen in the stream, or seen under another name or code, are decided here (a
    /// stream may carry them only in the final object, which SDK helpers return as the result).
    fn on_completed(
        &mut self,
        cx: &mut Cx,
        body: &[u8],
        raw: &Bytes,
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        let bad = |_| Fatal::new("malformed response.completed after a blocked call");
        let text = std::str::from_utf8(body).map_err(|_| Fatal::new("SSE data is not UTF-8"))?;
        let mut top = RawObject::parse(text).map_err(bad)?;
        let Some(resp_raw) = top.get("response") else {
            out.extend_from_slice(raw);
            return Ok(());
        };
        let mut resp = RawObject::from_raw(resp_raw).map_err(bad)?;
        let Some(output_raw) = resp.get("output") else {
            out.extend_from_slice(raw);
            return Ok(());
        };
        let output: Vec<&RawValue> = serde_json::from_str(output_raw.get()).map_err(bad)?;
        let mut new_output: Vec<Box<RawValue>> = Vec::with_capacity(output.len());
        let mut changed = false;
        for (i, item_raw) in output.iter().enumerate() {
            let item = serde_json::from_str::<Item<'_>>(item_raw.get()).ok();
            let id = item.as_ref().and_then(|it| it.id.as_deref());
            let pos = match id {
                Some(id) => self.by_id.get(id),
                None => self.by_output.get(&(i as u64)),
            };
            let blocked = pos
                .and_then(|&p| self.items.get(p))
                .filter(|e| matches!(e.state, ItemState::Blocked { .. }));
            if let Some(Entry {
                state: ItemState::Blocked { message_id, text },
                ..
            }) = blocked
            {
                new_output.push(raw_from_json(message_item(message_id, text, true)));
                changed = true;
                continue;
            }
            if let Some(item) = &item
                && matches!(item.ty.as_ref(), "function_call" | "custom_tool_call")
                && !self.was_passed(item)
                && let Some((text, id)) = judge_item(cx, item, true)
            {
                let message_id = format!("msg_toolwall_{id}");
                new_output.push(raw_from_json(message_item(&message_id, &text, true)));
                changed = true;
                continue;
            }
            new_output.push((*item_raw).to_owned());
        }
        if !changed {
            out.extend_from_slice(raw);
            return Ok(());
        }
        resp.set("output", raw_array(new_output.iter().map(|b| b.as_ref())));
        let resp = resp.to_raw();
        top.set("response", resp);
        write_with_data(out, raw, top.to_json().as_bytes());
        Ok(())
    }
}

/// A raw value that should be a string, as one ("" otherwise). Envelope fields stay raw so
/// an event type we do not know, with an object where we expect text, is not "malformed".
fn raw_string(v: Option<&RawValue>) -> String {
    v.and_then(|v| serde_json::from_str::<String>(v.get()).ok())
        .unwrap_or_default()
}

/// An event of a type the SDKs do not build output from (a delta, `response.created`, or one
/// unknown to us) may still carry a call item, in `item` or `response.output`: a client that reads events
/// raw would see it, so a blocked one ends the stream (fail closed); allowed ones pass (they
/// are recorded where the SDKs take them from: `output_item.done`, `response.completed`).
fn blocked_in_other_event(cx: &mut Cx, env: &Envelope<'_>) -> Result<(), Fatal> {
    let output = env
        .response
        .and_then(|r| serde_json::from_str::<ResponseOutput<'_>>(r.get()).ok())
        .map(|r| r.output)
        .unwrap_or_default();
    for raw in env.item.into_iter().chain(output) {
        if let Ok(item) = serde_json::from_str::<Item<'_>>(raw.get())
            && judge_item(cx, &item, false).is_some()
        {
            return Err(Fatal::new(format!(
                "a blocked tool call in a '{}' event",
                env.ty
            )));
        }
    }
    Ok(())
}
