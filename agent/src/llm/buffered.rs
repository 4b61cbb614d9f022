//! Whole (non-streaming) response bodies: blocked calls replaced, everything else verbatim.
//!
//! Every tool call in the body is looked at, whatever the stop/finish reason says (a forced tool
//! call can come with `stop`). Only the objects on the path to a changed value are rebuilt
//! ([`RawObject`]); all other bytes are upstream's.

use std::sync::Arc;

use serde_json::value::RawValue;

use super::anthropic::Block;
use super::chat::{CallView, FunctionView};
use super::json::{RawObject, quote, raw_array, raw_from_json, raw_str};
use super::responses::{Item, judge_item, message_item};
use super::{Cx, Dialect, OnMalformed, Record, blocked_message};
use crate::decision::Gate;

/// Why a buffered body could not be inspected.
#[derive(Debug, thiserror::Error)]
pub enum BufferedError {
    /// The body is not the JSON the dialect defines, and the policy is to fail closed.
    #[error("response body is not valid {dialect} JSON: {source}")]
    Malformed {
        /// The dialect expected.
        dialect: &'static str,
        /// The parse error.
        source: serde_json::Error,
    },
}

/// Inspects a complete response body. Returns the new body when something was blocked (`None`:
/// send the original bytes), and the decisions made, to record.
pub fn rewrite_buffered(
    dialect: Dialect,
    body: &[u8],
    gate: Arc<dyn Gate>,
    on_malformed: OnMalformed,
) -> Result<(Option<Vec<u8>>, Vec<Record>), BufferedError> {
    let mut cx = Cx {
        gate,
        dialect,
        on_malformed,
        records: Vec::new(),
    };
    let text = std::str::from_utf8(body).map_err(|_| BufferedError::Malformed {
        dialect: dialect.as_str(),
        source: serde::de::Error::custom("body is not UTF-8"),
    });
    let result = text.and_then(|text| {
        let r = match dialect {
            Dialect::Anthropic => anthropic(&mut cx, text),
            Dialect::OpenAiChat => chat(&mut cx, text),
            Dialect::OpenAiResponses => responses(&mut cx, text),
        };
        r.map_err(|source| BufferedError::Malformed {
            dialect: dialect.as_str(),
            source,
        })
    });
    match result {
        Ok(new) => Ok((new.map(String::into_bytes), cx.records)),
        Err(e) if on_malformed == OnMalformed::FailOpen => {
            tracing::warn!(error = %e, "passing a malformed body (fail_open)");
            Ok((None, cx.records))
        }
        Err(e) => Err(e),
    }
}

fn anthropic(cx: &mut Cx, text: &str) -> serde_json::Result<Option<String>> {
    let mut top = RawObject::parse(text)?;
    let (total, blocked) = anthropic_content(cx, &mut top)?;
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
pub(super) fn anthropic_content(
    cx: &mut Cx,
    top: &mut RawObject<'_>,
) -> serde_json::Result<(usize, usize)> {
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
            let decision = cx.check(name, None);
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

fn chat(cx: &mut Cx, text: &str) -> serde_json::Result<Option<String>> {
    let mut top = RawObject::parse(text)?;
    let Some(choices_raw) = top.get("choices") else {
        return Ok(None);
    };
    let choices: Vec<&RawValue> = serde_json::from_str(choices_raw.get())?;
    let mut changed = false;
    let mut new_choices: Vec<Box<RawValue>> = Vec::with_capacity(choices.len());
    for choice_raw in &choices {
        let mut choice = RawObject::from_raw(choice_raw)?;
        let Some(message_raw) = choice.parsed("message") else {
            new_choices.push((*choice_raw).to_owned());
            continue;
        };
        let mut message = RawObject::from_raw(message_raw)?;
        let calls: Vec<&RawValue> = match message.parsed("tool_calls") {
            Some(tc) => {
                serde_json::from_str::<Option<Vec<&RawValue>>>(tc.get())?.unwrap_or_default()
            }
            None => Vec::new(),
        };
        let mut kept: Vec<&RawValue> = Vec::with_capacity(calls.len());
        let mut messages = String::new();
        // The deprecated single `function_call`.
        let mut legacy_blocked = false;
        if let Some(fc) = message.parsed("function_call") {
            let f: Option<FunctionView<'_>> = serde_json::from_str(fc.get())?;
            if let Some(f) = f {
                let name = f.name.as_deref().unwrap_or_default();
                let input = f
                    .arguments
                    .as_deref()
                    .and_then(|a| serde_json::from_str(a).ok());
                let decision = cx.check(name, None);
                if decision.is_blocked() {
                    messages.push_str(&blocked_message(name, &decision.reason));
                    legacy_blocked = true;
                }
                cx.record(name.to_owned(), String::new(), input, decision);
            }
        }
        for raw in &calls {
            let call: CallView<'_> = serde_json::from_str(raw.get())?;
            let id = call.id.as_deref().unwrap_or_default().to_owned();
            // A function call, a custom one (`"type":"custom"`), or an entry with both objects
            // (each SDK reads the one its `type` names): every name present is judged, and the
            // entry goes if any is blocked.
            let mut judged: Vec<(&str, Option<serde_json::Value>)> = Vec::with_capacity(1);
            if let Some(f) = &call.function {
                let input = f
                    .arguments
                    .as_deref()
                    .and_then(|a| serde_json::from_str(a).ok());
                judged.push((f.name.as_deref().unwrap_or_default(), input));
            }
            if let Some(c) = &call.custom {
                let input = c
                    .input
                    .as_deref()
                    .map(|i| serde_json::Value::from(i.to_owned()));
                judged.push((c.name.as_deref().unwrap_or_default(), input));
            }
            if judged.is_empty() {
                judged.push(("", None));
            }
            let mut blocked = false;
            for (name, input) in judged {
                let decision = cx.check(name, None);
                if decision.is_blocked() && !blocked {
                    blocked = true;
                    messages.push_str(&blocked_message(name, &decision.reason));
                }
                cx.record(name.to_owned(), id.clone(), input, decision);
            }
            if !blocked {
                kept.push(raw);
            }
        }
        if messages.is_empty() {
            new_choices.push((*choice_raw).to_owned());
            continue;
        }
        changed = true;
        let mut content = message.get_str("content").unwrap_or_default();
        content.push_str(&messages);
        message.set("content", raw_str(&content));
        let all_blocked = kept.is_empty();
        if legacy_blocked {
            message.remove("function_call");
            if choice.get_str("finish_reason").as_deref() == Some("function_call") {
                choice.set("finish_reason", raw_str("stop"));
            }
        }
        if calls.is_empty() {
            // Only the legacy call was there.
        } else if all_blocked {
            message.remove("tool_calls");
        } else {
            let arr = raw_array(kept);
            message.set("tool_calls", arr);
        }
        let message = message.to_raw();
        choice.set("message", message);
        if !calls.is_empty()
            && all_blocked
            && choice.get_str("finish_reason").as_deref() == Some("tool_calls")
        {
            choice.set("finish_reason", raw_str("stop"));
        }
        new_choices.push(choice.to_raw());
    }
    if !changed {
        return Ok(None);
    }
    top.set("choices", raw_array(new_choices.iter().map(|b| b.as_ref())));
    Ok(Some(top.to_json()))
}

fn responses(cx: &mut Cx, text: &str) -> serde_json::Result<Option<String>> {
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

#[cfg(test)]
mod tests;
