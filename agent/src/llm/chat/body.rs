//! A whole (non-streaming) Chat Completions body.

use serde_json::value::RawValue;

use super::{CallView, FunctionView};
use crate::llm::json::{RawObject, raw_array, raw_str};
use crate::llm::{Cx, blocked_message};

/// A whole (non-streaming) Chat Completions body: blocked calls removed and their messages
/// appended to `content`; `None` when nothing was blocked.
pub(in crate::llm) fn rewrite_body(cx: &mut Cx, text: &str) -> serde_json::Result<Option<String>> {
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
                let decision = cx.check_complete(name, None, f.arguments.as_deref());
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
            // (name, recorded input, the arguments' JSON text when they are a function's).
            let mut judged: Vec<(&str, Option<serde_json::Value>, Option<&str>)> =
                Vec::with_capacity(1);
            if let Some(f) = &call.function {
                let input = f
                    .arguments
                    .as_deref()
                    .and_then(|a| serde_json::from_str(a).ok());
                judged.push((
                    f.name.as_deref().unwrap_or_default(),
                    input,
                    f.arguments.as_deref(),
                ));
            }
            if let Some(c) = &call.custom {
                let input = c
                    .input
                    .as_deref()
                    .map(|i| serde_json::Value::from(i.to_owned()));
                judged.push((c.name.as_deref().unwrap_or_default(), input, None));
            }
            if judged.is_empty() {
                judged.push(("", None, None));
            }
            let mut blocked = false;
            for (name, input, arguments) in judged {
                let decision = cx.check_complete(name, None, arguments);
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
