//! Edits to a held Chat Completions chunk: blocked entries removed, kept ones renumbered,
//! explanations in `content`, the finish reason changed.

use bytes::{Bytes, BytesMut};
use serde_json::value::RawValue;

use crate::llm::json::{RawObject, quote, raw_array, raw_from_json, raw_str};
use crate::llm::{Fatal, trim_ws};
use crate::sse::{SseEvent, write_with_data};

/// What one held chunk's choice needs changed.
#[derive(Default)]
pub(super) struct ChoiceEdit {
    /// By position in `tool_calls`, ascending: `None` to remove the entry, `Some(i)` to give it
    /// index `i`.
    pub(super) entries: Vec<(usize, Option<u64>)>,
    pub(super) messages: Vec<String>,
    pub(super) finish_stop: bool,
}

/// The top-level fields of a chunk except `choices`, as JSON, for synthetic chunks.
pub(super) fn template_of(top: &RawObject<'_>) -> String {
    let mut t = top.clone();
    t.remove("choices");
    t.to_json()
}

/// Writes a held event with its choices edited.
pub(super) fn rewrite(
    raw: &Bytes,
    edits: Vec<(usize, ChoiceEdit)>,
    out: &mut BytesMut,
) -> Result<(), Fatal> {
    let bad = || Fatal::new("held chunk no longer reads as it did");
    let data = SseEvent::new(raw).data().ok_or_else(bad)?;
    let text = std::str::from_utf8(trim_ws(&data)).map_err(|_| bad())?;
    let mut top = RawObject::parse(text).map_err(|_| bad())?;
    let choices_raw = top.parsed("choices").ok_or_else(bad)?;
    let choices: Vec<&RawValue> = serde_json::from_str(choices_raw.get()).map_err(|_| bad())?;
    let mut new_choices: Vec<Box<RawValue>> = choices.iter().map(|c| (*c).to_owned()).collect();
    for (pos, edit) in edits {
        let choice = choices.get(pos).ok_or_else(bad)?;
        new_choices[pos] = apply_edit(choice, edit)?;
    }
    top.set("choices", raw_array(new_choices.iter().map(|c| c.as_ref())));
    write_with_data(out, raw, top.to_json().as_bytes());
    Ok(())
}

/// Applies one choice's edit: filtered `tool_calls`, explanation in `content`, finish reason.
fn apply_edit(choice: &RawValue, edit: ChoiceEdit) -> Result<Box<RawValue>, Fatal> {
    let bad = |_| Fatal::new("chunk changed under us");
    let mut obj = RawObject::from_raw(choice).map_err(bad)?;
    if let Some(delta_raw) = obj.get("delta") {
        let mut delta = RawObject::from_raw(delta_raw).map_err(bad)?;
        if !edit.entries.is_empty()
            && let Some(tc) = delta.get("tool_calls")
        {
            let entries: Vec<&RawValue> = serde_json::from_str(tc.get()).map_err(bad)?;
            let mut kept: Vec<Box<RawValue>> = Vec::with_capacity(entries.len());
            let mut edits = edit.entries.iter().peekable();
            for (pos, entry) in entries.iter().enumerate() {
                match edits.next_if(|(p, _)| *p == pos) {
                    None => kept.push((*entry).to_owned()),
                    Some((_, None)) => {}
                    Some((_, Some(index))) => {
                        let mut e = RawObject::from_raw(entry).map_err(bad)?;
                        e.set("index", raw_from_json(index.to_string()));
                        kept.push(e.to_raw());
                    }
                }
            }
            if kept.is_empty() {
                delta.remove("tool_calls");
            } else {
                delta.set("tool_calls", raw_array(kept.iter().map(|k| k.as_ref())));
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
