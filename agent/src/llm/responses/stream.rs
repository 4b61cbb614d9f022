//! The Responses API stream machine: each tool item decided at `added` (custom tool calls held
//! until `done`), blocked ones replaced by message items, later copies judged again if changed.

mod completed;
mod items;

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use serde_json::value::RawValue;

use super::judge::judge_item;
use super::{CALL_KEYS, Envelope, Item, Judged, ResponseOutput, TEXT_PREFIXES, display_name};
use crate::decision::Decision;
use crate::llm::json::quote;
use crate::llm::{Cx, Fatal, Keys, Machine};
use crate::sse::write_event;

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
    /// rules judge (its name and namespace) held until its arguments are.
    Held {
        events: Vec<Bytes>,
        /// The input as its deltas build it (what the SDKs' snapshots show).
        input: String,
        /// The whole input a `….done` event stated, when one did: SDKs show that too, so a
        /// call is judged on each view that differs (`items.rs`).
        stated: Option<String>,
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
    /// event finds its item in O(1), however many calls the response holds (linear searches
    /// made CPU grow with the square of the calls).
    by_output: HashMap<u64, usize>,
    by_id: HashMap<String, usize>,
    /// Tool items already decided and passed, by id, with what they were judged on: one that
    /// comes again unchanged is not re-asked; a changed one is.
    passed: HashMap<String, Judged>,
    max_held: usize,
    /// The `bytes` of every held item, summed (the memory budget reads it after each read).
    held_total: usize,
}

impl Responses {
    pub(crate) fn new(max_held: usize) -> Self {
        Responses {
            items: Vec::new(),
            by_output: HashMap::new(),
            by_id: HashMap::new(),
            passed: HashMap::new(),
            max_held,
            held_total: 0,
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
        if let ItemState::Held { bytes, .. } = &entry.state {
            self.held_total += bytes;
        }
        self.by_output.entry(entry.output_index).or_insert(pos);
        self.by_id.entry(entry.item_id.clone()).or_insert(pos);
        self.items.push(entry);
    }

    /// Removes the entry at `pos` (the last one moves into its place, re-indexed).
    fn remove_item(&mut self, pos: usize) -> Entry {
        let entry = self.items.swap_remove(pos);
        if let ItemState::Held { bytes, .. } = &entry.state {
            self.held_total -= bytes;
        }
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
                        stated,
                        bytes,
                        function: Some(_),
                    }) => {
                        if env.ty == "response.function_call_arguments.delta" {
                            input.push_str(&raw_string(env.delta));
                        } else if env.arguments.is_some() {
                            *stated = Some(raw_string(env.arguments));
                        }
                        *bytes += raw.len();
                        self.held_total += raw.len();
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
                        stated,
                        bytes,
                        ..
                    }) => {
                        if env.ty == "response.custom_tool_call_input.delta" {
                            input.push_str(&raw_string(env.delta));
                        } else if env.input.is_some() {
                            *stated = Some(raw_string(env.input));
                        }
                        *bytes += raw.len();
                        self.held_total += raw.len();
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
        self.held_total = 0;
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

    fn held_bytes(&self) -> usize {
        self.held_total
    }

    fn quiet_keys(&self) -> Option<&'static Keys> {
        self.items.is_empty().then(|| &*CALL_KEYS)
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
