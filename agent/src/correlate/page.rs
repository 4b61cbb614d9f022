//! A page of call records read from the store, in time and memory that do not grow with the
//! store: the events read are the page's time span plus the correlator's own reach on each side
//! (two windows), streamed through a [`Sweep`] that holds only what is open, and the page keeps
//! at most `limit` records. `/api/calls`, the web view and `toolwall mcp calls` read this way.
//!
//! Records are ordered by [`Key`] (first sighting of the call, then the lowest event id among
//! those sightings, which no other record shares), and a page ends with the key to go on from.
//!
//! A page is correlated from two windows before its span, not from the store's beginning. The
//! joins are the same but for a kernel connection near the edge, which may join a neighbouring
//! call rather than the one the whole store would give it (a connection goes to the nearest
//! call without one, and which is free depends on everything before); the tests compare pages
//! with the whole store call by call.

use std::collections::BinaryHeap;
use std::ops::ControlFlow;

use thiserror::Error;

use super::{CallRecord, Correlator, Sweep};
use crate::events::{EventQuery, Store, StoreError};

/// The event types a call record is made of.
pub(crate) const CALL_TYPES: [&str; 6] = [
    "mcp_tool_call_intercepted",
    "mcp_tool_called",
    "mcp_network_connection",
    // Records of their own, shown among the calls (`RecordKind::Alert`).
    "kernel_alert",
    "mcp_result_inspected",
    "unreadable_row",
];

/// Most records a page holds.
pub(crate) const MAX_LIMIT: usize = 5000;

/// Most events one page request reads (its span and margins, every widening counted): past it,
/// the page ends where it got to, with a key to go on from. A filter few calls match reads back
/// this far per request (well under a second on 10M events, `cargo xtask bench views`), and
/// the reader asks for the next piece if it wants more.
const MAX_SCANNED: usize = 50_000;

/// Where a record stands among records: its first sighting (unix ns), then the lowest event id
/// among its sightings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    at_ns: i64,
    id: i64,
}

impl Key {
    /// The record's key: its call's sightings (the LLM's, the execution's) when it has any,
    /// else its connection. A connection joins whichever call is nearest when it comes, so a
    /// key made from it would move between two reads that began at different points, and a
    /// record could then fall between two pages or into both.
    pub(crate) fn of(r: &CallRecord) -> Key {
        let call = [&r.intercept, &r.execution];
        let sightings: Vec<&super::Sighting> = match call.iter().any(|s| s.is_some()) {
            true => call.into_iter().flatten().collect(),
            false => r.connection.iter().collect(),
        };
        Key {
            at_ns: sightings
                .iter()
                .map(|s| crate::events::time_ns(s.at))
                .min()
                .unwrap_or(i64::MAX),
            id: sightings
                .iter()
                .map(|s| s.event_id)
                .min()
                .unwrap_or(i64::MAX),
        }
    }

    /// The key below every record first seen at `at_ns` or later.
    #[cfg(test)]
    pub(crate) fn of_time(at_ns: i64) -> Key {
        Key::before_time(at_ns)
    }

    /// Every record at or after `at_ns` is past this key.
    fn before_time(at_ns: i64) -> Key {
        Key {
            at_ns,
            id: i64::MIN,
        }
    }
}

impl std::fmt::Display for Key {
    /// `NS_ID`, what the `before` and `after` parameters take.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}_{}", self.at_ns, self.id)
    }
}

/// Why a cursor was not understood.
#[derive(Debug, Error)]
#[error("a page cursor is NS_ID as a page's `next` gave it, not {0:?}")]
pub(crate) struct BadCursor(String);

impl std::str::FromStr for Key {
    type Err = BadCursor;
    fn from_str(s: &str) -> Result<Key, BadCursor> {
        let bad = || BadCursor(s.chars().take(64).collect());
        let (at, id) = s.rsplit_once('_').ok_or_else(bad)?;
        Ok(Key {
            at_ns: at.parse().map_err(|_| bad())?,
            id: id.parse().map_err(|_| bad())?,
        })
    }
}

/// Which way a page goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// The newest records before the cursor (or `until`); a first page is the latest calls.
    Older,
    /// The oldest records after the cursor (or from `since`).
    Newer,
}

/// What page to read.
#[derive(Clone, Debug)]
pub(crate) struct PageQuery {
    /// Session, server, tool and action filters, and `since_ns`/`until_ns` on first sightings.
    pub filters: EventQuery,
    /// Records at most ([`MAX_LIMIT`] at most).
    pub limit: usize,
    /// Which way from the cursor.
    pub direction: Direction,
    /// Exclusive: the `next` of the page before.
    pub cursor: Option<Key>,
}

/// A page: records oldest first, and where the next page in the same direction starts (`None`
/// when there is nothing more that way).
#[derive(Debug)]
pub(crate) struct Page {
    pub records: Vec<CallRecord>,
    pub next: Option<Key>,
    /// Why the page holds only part of its span (it read as many events as a request may):
    /// calls near where it stopped may be joined short, and the next page goes on past them.
    pub partial: Option<String>,
}

/// A record in the page's heap: the worst-placed one on top, to be dropped first.
struct Ranked(Key, CallRecord, Direction);

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        match self.2 {
            // Keeping the newest: the oldest is worst.
            Direction::Older => other.0.cmp(&self.0),
            Direction::Newer => self.0.cmp(&other.0),
        }
    }
}

/// Reads one page of call records.
///
/// The span of events is chosen by count — the `n` call events nearest the cursor — and widened
/// four-fold while it yields fewer than `limit` records and there is more to read; every span is
/// correlated with two windows of events on each side, so a record near its edge is joined as
/// the whole store would join it.
pub(crate) fn read_page(
    store: &Store,
    q: &PageQuery,
    window: std::time::Duration,
) -> Result<Page, StoreError> {
    let limit = q.limit.clamp(1, MAX_LIMIT);
    let margin = i64::try_from(window.as_nanos())
        .unwrap_or(i64::MAX / 4)
        .saturating_mul(2);
    let f = &q.filters;
    // The page's bounds on keys: (lower, upper), lower inclusive, upper exclusive.
    let since = Key::before_time(f.since_ns.unwrap_or(i64::MIN));
    let until = Key::before_time(f.until_ns.unwrap_or(i64::MAX));
    let (lower, upper) = match (q.direction, q.cursor) {
        (Direction::Older, Some(c)) => (since, c.min(until)),
        (Direction::Newer, Some(c)) => (
            Key {
                at_ns: c.at_ns,
                id: c.id.saturating_add(1),
            }
            .max(since),
            until,
        ),
        (_, None) => (since, until),
    };
    // Rows of the filters' session and server only: the correlator joins nothing across them.
    let scope = EventQuery {
        types: CALL_TYPES.iter().map(|t| t.to_string()).collect(),
        session: f.session.clone(),
        server: f.server.clone(),
        ..Default::default()
    };
    let mut n = (limit * 2).max(64);
    let mut scanned = 0usize;
    loop {
        // The span's far end in time: the n-th call event from the near end, or the bound.
        let (span, exhausted) = match q.direction {
            Direction::Older => {
                let edge = store.nth_time(&scope, lower.at_ns, upper.at_ns, n, true)?;
                ((edge.unwrap_or(lower.at_ns), upper.at_ns), edge.is_none())
            }
            Direction::Newer => {
                let edge = store.nth_time(&scope, lower.at_ns, upper.at_ns, n, false)?;
                ((lower.at_ns, edge.unwrap_or(upper.at_ns)), edge.is_none())
            }
        };
        // The keys this span can place for sure.
        let (from, to) = match q.direction {
            Direction::Older => (lower.max(Key::before_time(span.0)), upper),
            Direction::Newer => (lower, upper.min(Key::before_time(span.1.saturating_add(1)))),
        };
        let mut kept: BinaryHeap<Ranked> = BinaryHeap::with_capacity(limit + 1);
        let mut correlator = Correlator::new(window, crate::registry::value_hash);
        let mut sweep = Sweep::default();
        let mut take = |_, r: CallRecord| {
            let key = Key::of(&r);
            if key >= from && key < to && r.matches(f) {
                kept.push(Ranked(key, r, q.direction));
                if kept.len() > limit {
                    kept.pop();
                }
            }
        };
        let events = EventQuery {
            since_ns: Some(span.0.saturating_sub(margin)),
            until_ns: Some(span.1.saturating_add(margin).saturating_add(1)),
            ..scope.clone()
        };
        // The bound holds inside a scan too: events at one instant are one span, however many.
        let mut cut_short = false;
        store.scan(&events, |e| {
            scanned += 1;
            sweep.push(&mut correlator, &e, &mut take);
            if scanned >= MAX_SCANNED {
                cut_short = true;
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        })?;
        sweep.finish(&mut correlator, &mut take);
        let full = kept.len() >= limit && !cut_short;
        let exhausted = exhausted && !cut_short;
        if full || exhausted || scanned >= MAX_SCANNED {
            let mut records: Vec<(Key, CallRecord)> =
                kept.into_iter().map(|Ranked(k, r, _)| (k, r)).collect();
            records.sort_unstable_by_key(|(k, _)| *k);
            // More may lie that way unless the span reached the bound with room to spare.
            let next = match (full || !exhausted, q.direction) {
                (false, _) => None,
                (true, Direction::Older) if full => records.first().map(|(k, _)| *k),
                (true, Direction::Newer) if full => records.last().map(|(k, _)| *k),
                // Stopped short: go on from where this span ended.
                (true, Direction::Older) => Some(from),
                (true, Direction::Newer) => Some(Key {
                    at_ns: span.1,
                    id: i64::MAX - 1,
                }),
            };
            return Ok(Page {
                records: records.into_iter().map(|(_, r)| r).collect(),
                next,
                partial: cut_short.then(|| {
                    format!(
                        "this page read the {MAX_SCANNED} events a request may read and holds what they gave (a filter few calls match, or a flood at one instant); the next page goes on past them"
                    )
                }),
            });
        }
        n = n.saturating_mul(4);
    }
}
