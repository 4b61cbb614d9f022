//! The response's last event (`response.completed`, `.incomplete`, `.failed`): its `output`
//! carries every item again, so blocked items are replaced there too and an item not passed
//! exactly as it stands is judged again.

use bytes::{Bytes, BytesMut};
use serde_json::value::RawValue;

use super::{Entry, ItemState, Responses};
use crate::llm::json::{RawObject, raw_array, raw_from_json};
use crate::llm::responses::judge::judge_item;
use crate::llm::responses::{Item, message_item};
use crate::llm::{Cx, Fatal};
use crate::sse::write_with_data;

impl Responses {
    /// Rewrites the final response: blocked items become their message items, and tool items
    /// never seen in the stream, or seen under another name or code, are decided here (a
    /// stream may carry them only in the final object, which SDK helpers return as the result).
    pub(super) fn on_completed(
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
                && matches!(
                    item.ty.as_ref(),
                    "function_call" | "custom_tool_call" | "mcp_approval_request"
                )
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
