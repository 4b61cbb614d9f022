//! A whole (non-streaming) Responses body.

use serde_json::value::RawValue;

use super::judge::judge_item;
use super::{Item, message_item};
use crate::llm::Cx;
use crate::llm::json::{RawObject, raw_array, raw_from_json};

/// A whole (non-streaming) Responses body: blocked call items replaced by message items;
/// `None` when nothing was blocked.
pub(in crate::llm) fn rewrite_body(cx: &mut Cx, text: &str) -> serde_json::Result<Option<String>> {
    let mut top = RawObject::parse(text)?;
    let Some(output_raw) = top.get("output") else {
        return Ok(None);
    };
    let output: Vec<&RawValue> = serde_json::from_str(output_raw.get())?;
    let mut changed = false;
    let mut new: Vec<Box<RawValue>> = Vec::with_capacity(output.len());
    for raw in &output {
        let item: Item<'_> = serde_json::from_str(raw.get())?;
        match judge_item(cx, &item, true) {
            Some((text, id)) => {
                changed = true;
                new.push(raw_from_json(message_item(
                    &format!("msg_toolwall_{id}"),
                    &text,
                    true,
                )));
            }
            None => new.push((*raw).to_owned()),
        }
    }
    if !changed {
        return Ok(None);
    }
    top.set("output", raw_array(new.iter().map(|b| b.as_ref())));
    Ok(Some(top.to_json()))
}
