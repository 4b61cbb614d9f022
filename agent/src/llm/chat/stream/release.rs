//! Releasing what a choice held back once its calls are decided: the held events passed on
//! verbatim or edited (blocked calls taken out, explanations added), in the order they came.

use bytes::BytesMut;

use super::call::{CALL_COST, NameView};
use super::{Chat, State};
use crate::llm::chat::edit::{ChoiceEdit, rewrite};
use crate::llm::json::{RawObject, quote, raw_from_json};
use crate::llm::{Cx, Fatal, blocked_message};
use crate::sse::write_event;

impl Chat {
    /// Judges every call of a finished choice (every name is final now), numbering the kept
    /// ones densely in the order they came; records every decision.
    pub(super) fn decide_choice(&mut self, cx: &mut Cx, choice: u64) {
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
    pub(super) fn flush(&mut self, out: &mut BytesMut) -> Result<(), Fatal> {
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
    pub(super) fn finish_all(&mut self, cx: &mut Cx, out: &mut BytesMut) -> Result<(), Fatal> {
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
