//! A tool item's `response.output_item.added` and `.done` events: decided when it is added
//! (a custom tool call, or a call argument rules judge, held until done), judged again at
//! `done` when it changed, and a blocked one replaced by a message item at the same index.

use bytes::{Bytes, BytesMut};
use serde_json::value::RawValue;

use super::{Entry, ItemState, Responses, blocked_in_other_event};
use crate::llm::responses::judge::{judge_custom, judge_item};
use crate::llm::responses::{
    Envelope, Item, Judged, display_name, write_message_done, write_message_open,
};
use crate::llm::{Cx, Fatal, blocked_message};

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
    pub(super) fn on_added(
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
                            stated: None,
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
            // Complete when added (no argument events follow): decided and recorded now; an
            // unchanged copy at `done` passes, a changed one is judged again.
            "mcp_approval_request" => match judge_item(cx, &item, true) {
                Some((text, _)) => {
                    let message_id = format!("msg_toolwall_{item_id}");
                    write_message_open(out, seq, index, &message_id, &text);
                    self.push_item(Entry {
                        output_index: index,
                        item_id,
                        state: ItemState::Blocked { message_id, text },
                    });
                }
                None => {
                    self.mark_passed(item_id, Judged::item(&item));
                    out.extend_from_slice(raw);
                }
            },
            "custom_tool_call" => {
                let input = item.input.as_deref().unwrap_or_default().to_owned();
                self.push_item(Entry {
                    output_index: index,
                    item_id,
                    state: ItemState::Held {
                        events: vec![raw.clone()],
                        input,
                        stated: None,
                        bytes: raw.len(),
                        function: None,
                    },
                });
            }
            _ => out.extend_from_slice(raw),
        }
        Ok(())
    }

    pub(super) fn on_done(
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
                    stated,
                    function: Some((name, namespace)),
                    ..
                } = entry.state
                else {
                    return Ok(());
                };
                let done = item.as_ref().and_then(|i| i.arguments.as_deref());
                // What the deltas built, what `.done` stated, what the done item holds: the
                // SDKs show each, so each that differs is judged, and any refusal refuses.
                let views = distinct([Some(input.as_str()), stated.as_deref(), done]);
                let arguments = done.map_or_else(|| views[0].to_owned(), str::to_owned);
                let mut decision = cx.check_complete(&name, namespace.as_deref(), Some(&arguments));
                for view in views.iter().filter(|v| **v != arguments) {
                    if decision.is_blocked() {
                        break;
                    }
                    let other = cx.complete_at(
                        &name,
                        namespace.as_deref(),
                        Some(view),
                        crate::decision::CallStage::Inspected,
                    );
                    if other.is_blocked() {
                        decision = other;
                    }
                }
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
                let ItemState::Held {
                    events,
                    input: built,
                    stated,
                    ..
                } = entry.state
                else {
                    return Ok(());
                };
                let done = item.as_ref().and_then(|i| i.input.as_deref());
                let views = distinct([Some(built.as_str()), stated.as_deref(), done]);
                let input = done.map_or_else(|| views[0].to_owned(), str::to_owned);
                let (name, call_id) = match &item {
                    Some(i) => (
                        i.name.as_deref().unwrap_or_default().to_owned(),
                        i.call_id.as_deref().unwrap_or(&entry.item_id).to_owned(),
                    ),
                    None => (String::new(), entry.item_id.clone()),
                };
                // Every view of the code is judged (as for a function's arguments above).
                let refused = views
                    .iter()
                    .filter(|v| **v != input)
                    .find_map(|v| judge_custom(cx, &name, &call_id, v));
                match refused.or_else(|| judge_custom(cx, &name, &call_id, &input)) {
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

    pub(super) fn on_done_unseen(
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
}

/// The views of one input that are there, each once, the first first (an empty one, which no
/// SDK reads as arguments, only when there is no other).
fn distinct(views: [Option<&str>; 3]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::with_capacity(3);
    for view in views.into_iter().flatten().filter(|v| !v.trim().is_empty()) {
        if !out.contains(&view) {
            out.push(view);
        }
    }
    if out.is_empty() {
        out.push("");
    }
    out
}
