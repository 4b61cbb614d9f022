//! A batch of stored events correlated in store order, closing records as the events' time
//! moves on: what `/api/calls` pages (`page.rs`) and the tests' whole-store reads run.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{CallRecord, Correlator, SWEEP_EVERY, minus};
use crate::events::StoredEvent;

impl Correlator {
    /// Correlates a whole ordered list of stored events (a batch over the database).
    pub fn batch(
        window: std::time::Duration,
        hash: fn(&Value) -> String,
        events: &[StoredEvent],
    ) -> Vec<CallRecord> {
        Correlator::new(window, hash).run(events)
    }

    /// [`Correlator::batch`] on this correlator. Records close as the events' time moves on, so
    /// the open set stays as small as a live one ([`Sweep`]). The output is in the order of
    /// pushing everything and flushing: by first sighting; on a tie, blocked intercepts as they
    /// came, then by arrival.
    pub(super) fn run(&mut self, events: &[StoredEvent]) -> Vec<CallRecord> {
        let mut out: Vec<(Order, CallRecord)> = Vec::new();
        let mut sweep = Sweep::default();
        for event in events {
            sweep.push(self, event, |order, r| out.push((order, r)));
        }
        sweep.finish(self, |order, r| out.push((order, r)));
        out.sort_unstable_by_key(|(order, _)| *order);
        out.into_iter().map(|(_, r)| r).collect()
    }
}

/// Where a record stands in a batch's output: first sighting; on a tie, blocked intercepts as
/// they came, then by arrival.
type Order = (DateTime<Utc>, bool, u64);

/// A batch in progress over events in store order, handing records out as they close: a record
/// closes once the latest event is two windows past its last sighting (one window of slack for
/// events stored a little out of time order; one that late could have joined it). Its memory
/// is what is open, however many events pass through.
#[derive(Default)]
pub(crate) struct Sweep {
    blocked: u64,
    since: usize,
    swept: Option<DateTime<Utc>>,
}

impl Sweep {
    /// Pushes one event; `out` takes the records that closed.
    pub(crate) fn push(
        &mut self,
        c: &mut Correlator,
        event: &StoredEvent,
        mut out: impl FnMut(Order, CallRecord),
    ) {
        for r in c.push(event) {
            self.blocked += 1;
            out((r.first_seen(), false, self.blocked), r);
        }
        self.since += 1;
        let Some(latest) = c.latest else { return };
        let now = minus(latest, c.window);
        if self.since >= SWEEP_EVERY.max(c.len / 4) && self.swept.is_none_or(|s| now > s) {
            self.since = 0;
            self.swept = Some(now);
            for (seq, r) in c.close(Some(now)) {
                out((r.first_seen(), true, seq), r);
            }
        }
    }

    /// Closes everything still open.
    pub(crate) fn finish(self, c: &mut Correlator, mut out: impl FnMut(Order, CallRecord)) {
        for (seq, r) in c.close(None) {
            out((r.first_seen(), true, seq), r);
        }
    }
}
