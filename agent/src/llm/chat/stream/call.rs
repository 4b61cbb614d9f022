//! One streamed tool call of a choice: its names as the SDKs accumulate them, its arguments
//! assembled to record, what it holds against the buffer limit, and its decision.

use crate::decision::{CallStage, Decision};
use crate::llm::Cx;

/// Fixed bytes charged per tracked call against the buffer limit.
pub(super) const CALL_COST: usize = 64;

#[derive(Clone, Copy)]
pub(super) enum State {
    /// Its choice has not finished: entries held back.
    Pending,
    /// Kept, under this (dense) index.
    Allowed(u64),
    Blocked,
}

/// One name as the SDKs accumulate it: every fragment appended (Python) and the last non-empty
/// fragment (TypeScript), which is a suffix of the first.
#[derive(Default)]
pub(super) struct NameView {
    pub(super) joined: String,
    last_start: usize,
}

impl NameView {
    pub(super) fn push(&mut self, part: &str) -> usize {
        if part.is_empty() {
            return 0;
        }
        self.last_start = self.joined.len();
        self.joined.push_str(part);
        part.len()
    }

    pub(super) fn last(&self) -> &str {
        &self.joined[self.last_start..]
    }
}

pub(super) struct Call {
    pub(super) state: State,
    pub(super) id: String,
    pub(super) function: NameView,
    /// Names of a `custom` object, if one came.
    pub(super) custom: Option<NameView>,
    /// A name fragment came since the names were last judged.
    pub(super) dirty: bool,
    /// The first blocked name found for this call, with its decision.
    pub(super) blocked: Option<(String, Decision)>,
    /// Arguments assembled to record an allowed MCP call.
    pub(super) args: String,
}

impl Call {
    pub(super) fn new() -> Self {
        Call {
            state: State::Pending,
            id: String::new(),
            function: NameView::default(),
            custom: None,
            dirty: true,
            blocked: None,
            args: String::new(),
        }
    }

    /// Bytes this call holds against the buffer limit.
    pub(super) fn held(&self) -> usize {
        CALL_COST
            + self.id.len()
            + self.function.joined.len()
            + self.custom.as_ref().map_or(0, |c| c.joined.len())
    }

    /// Judges every view of the names as they are now; returns the allowed decisions about MCP
    /// tools (to record), and notes the first blocked name. `last` is the final decision: its
    /// first view (the appended name) is asked as a proposed call, once, spending rate-limit
    /// budget; every other view, and every look before the last, is an inspection.
    pub(super) fn judge(&mut self, cx: &Cx, last: bool) -> Vec<(String, Decision)> {
        self.dirty = false;
        let mut names: Vec<&str> = vec![self.function.joined.as_str(), self.function.last()];
        if let Some(c) = &self.custom {
            names.push(c.joined.as_str());
            names.push(c.last());
        }
        let mut allowed: Vec<(String, Decision)> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            if self.blocked.is_some() {
                break;
            }
            if names[..i].contains(name) {
                continue;
            }
            // The choice finished: the arguments are whole, and the function's names are
            // judged on them too (argument rules) — the events were held till now.
            let decision = match (last, i) {
                (true, 0) => cx.check_complete(name, None, Some(&self.args)),
                (true, 1) => cx.complete_at(name, None, Some(&self.args), CallStage::Inspected),
                _ => cx.inspect(name),
            };
            if decision.is_blocked() {
                self.blocked = Some(((*name).to_owned(), decision));
            } else if decision.tool.is_some() {
                allowed.push(((*name).to_owned(), decision));
            }
        }
        allowed
    }
}
