//! What the filter proxy records of a request's calls, once the request's fate is known.

use crate::decision::Action;
use crate::events::{Event, EventSink};

/// What a filter judged of a passthrough request, recorded once the request's fate is known
/// ([`Verdicts::settle`]); when the client leaves first (the request's future is dropped),
/// as far as it went: once it was being forwarded, its calls as judged (the upstream may run
/// them), before that refused.
pub(super) struct Verdicts {
    sink: Option<EventSink>,
    events: Vec<Event>,
    forwarded: bool,
}

impl Verdicts {
    pub(super) fn new(sink: Option<&EventSink>) -> Self {
        Verdicts {
            sink: sink.cloned(),
            events: Vec::new(),
            forwarded: false,
        }
    }

    pub(super) fn add(&mut self, events: &mut Vec<Event>) {
        self.events.append(events);
    }

    /// From here on the upstream may have the request.
    pub(super) fn forwarding(&mut self) {
        self.forwarded = true;
    }

    /// Records them; with `refused`, the calls let through are recorded refused for it.
    pub(super) fn settle(mut self, refused: Option<&dyn std::fmt::Display>) {
        record_judged(
            self.sink.as_ref(),
            std::mem::take(&mut self.events),
            refused,
        );
    }

    /// Records them as judged, for a request the upstream had but never answered (`why`: what
    /// came instead): the calls let through may have run, and their records say that no
    /// answer came.
    pub(super) fn settle_unanswered(mut self, why: &dyn std::fmt::Display) {
        record_unanswered(self.sink.as_ref(), std::mem::take(&mut self.events), why);
    }
}

impl Drop for Verdicts {
    fn drop(&mut self) {
        let refused: Option<&dyn std::fmt::Display> = match self.forwarded {
            true => None,
            false => Some(&"the client left before the request was forwarded"),
        };
        record_judged(
            self.sink.as_ref(),
            std::mem::take(&mut self.events),
            refused,
        );
    }
}

/// Records what a filter judged of a request; with `refused`, the calls it let through are
/// recorded refused for that reason (the upstream never took them): a call is recorded
/// `allow` only once it was forwarded.
pub(super) fn record_judged(
    sink: Option<&EventSink>,
    judged: Vec<Event>,
    refused: Option<&dyn std::fmt::Display>,
) {
    let Some(sink) = sink else { return };
    for mut event in judged {
        if let (Some(why), Event::McpToolCalled(call)) = (refused, &mut event)
            && call.action == Action::Allow
        {
            call.action = Action::Block;
            call.reason = why.to_string();
        }
        sink.emit(event);
    }
}

/// Records what a filter judged of a request the upstream had but never answered (`why`: what
/// came instead): as judged, for the calls it let through may have run, and their records say
/// that no answer came.
pub(super) fn record_unanswered(
    sink: Option<&EventSink>,
    mut judged: Vec<Event>,
    why: &dyn std::fmt::Display,
) {
    for event in &mut judged {
        if let Event::McpToolCalled(call) = event
            && call.action == Action::Allow
        {
            let unanswered = format!("forwarded, but {why}: it may have run");
            call.reason = match call.reason.is_empty() {
                true => unanswered,
                false => format!("{}; {unanswered}", call.reason),
            };
        }
    }
    record_judged(sink, judged, None);
}
