//! What leaves for the collector, decided without I/O: stored events in, log records and spans
//! out, and the row id a restart resumes after.
//!
//! A call's events leave with its span's ids, so a collector shows the three layers' events
//! of one call under one span: they wait here until the correlator (`correlate/mod.rs`, the
//! same machine as the live view's) closes the call's record — a few correlation windows.
//! The cursor is never past an event still waiting, so a restart reads the waiting events
//! again and builds the same records, with the same ids (derived from the record's first
//! event id and the store's export instance, so two hosts' ids never meet).

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::{
    correlate::{CallRecord, Correlator, RecordKind, Sighting},
    decision::Action,
    events::{Event, StoredEvent},
};

/// A span's ids: 16-byte trace, 8-byte span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SpanIds {
    pub trace: [u8; 16],
    pub span: [u8; 8],
}

/// One stored event, to leave as a log record.
#[derive(Clone, Debug)]
pub(crate) struct LogItem {
    pub event: StoredEvent,
    /// The span of the call it belongs to, once known.
    pub span: Option<SpanIds>,
}

/// One closed call record, to leave as a span.
#[derive(Clone, Debug)]
pub(crate) struct SpanItem {
    pub ids: SpanIds,
    pub record: CallRecord,
    /// The JSON-RPC id of the execution, when one ran.
    pub jsonrpc_id: Option<serde_json::Value>,
    /// The model's id of the call (`toolu_…`, `call_…`), when the LLM layer saw it.
    pub tool_call_id: Option<String>,
    /// Where a connection went (`ip:port`), for connection records.
    pub remote_addr: Option<String>,
    /// The policy bundle's revision its events were recorded under (the latest, if they
    /// straddle a swap).
    pub policy_revision: Option<u64>,
}

/// What one export sends.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub logs: Vec<LogItem>,
    pub spans: Vec<SpanItem>,
    /// Once the collector took this batch, a restart may start after this row id.
    pub resume_after: i64,
}

/// The event types the correlator makes records of: their logs wait for the record.
fn joins(event: &Event) -> bool {
    matches!(
        event,
        Event::McpToolCallIntercepted(_)
            | Event::McpToolCalled(_)
            | Event::McpNetworkConnection(_)
            | Event::KernelAlert(_)
            | Event::McpResultInspected(_)
    )
}

/// How many correlation windows an event may wait for a record before it leaves without one
/// (a record closes two windows after its last sighting; this only bounds the unforeseen).
const MAX_WAIT_WINDOWS: i32 = 10;

/// Most events waiting for their record: past it the oldest leave at once without a span's
/// ids (a flood of calls must not grow the exporter; the span still leaves when its record
/// closes, the loss is only the link, and it is counted). The correlator searches one
/// session and server's open calls in full, so this also bounds its work per event: 8,192
/// waiting is ~2,000 call events a second across two correlation windows.
const MAX_WAITING: usize = 8_192;

/// The machine.
pub(crate) struct Outbox {
    correlator: Correlator,
    window: chrono::Duration,
    /// Event types that leave as log records (`None`: all).
    wanted: Option<HashSet<&'static str>>,
    spans: bool,
    instance: [u8; 16],
    /// Events waiting for their record, by row id.
    waiting: BTreeMap<i64, StoredEvent>,
    ready: Batch,
    /// The last row id pushed.
    read_through: i64,
    /// Events that left without their span's ids because too many waited.
    unlinked: u64,
    /// [`MAX_WAITING`] (smaller in tests).
    max_waiting: usize,
}

impl Outbox {
    /// `resume_after`: the stored cursor; `instance`: the store's export identity.
    pub(crate) fn new(
        window: std::time::Duration,
        wanted: &[String],
        spans: bool,
        instance: [u8; 16],
        resume_after: i64,
    ) -> Self {
        let wanted = (!wanted.is_empty()).then(|| {
            Event::KINDS
                .iter()
                .copied()
                .filter(|k| wanted.iter().any(|w| w == k))
                .collect()
        });
        Outbox {
            correlator: Correlator::new(window, crate::registry::value_hash),
            window: chrono::Duration::from_std(window).unwrap_or(chrono::Duration::seconds(2)),
            wanted,
            spans,
            instance,
            waiting: BTreeMap::new(),
            ready: Batch {
                resume_after,
                ..Batch::default()
            },
            read_through: resume_after,
            unlinked: 0,
            max_waiting: MAX_WAITING,
        }
    }

    /// Events that left without their span's ids because too many waited ([`MAX_WAITING`]).
    pub(crate) fn unlinked(&self) -> u64 {
        self.unlinked
    }

    /// The row id to read after.
    pub(crate) fn read_through(&self) -> i64 {
        self.read_through
    }

    /// Takes the next stored event (in row order).
    pub(crate) fn push(&mut self, stored: StoredEvent) {
        self.read_through = self.read_through.max(stored.id);
        if !joins(&stored.event) {
            self.log(stored, None);
            return;
        }
        let records = self.correlator.push(&stored);
        self.waiting.insert(stored.id, stored);
        for record in records {
            self.close(record);
        }
        while self.waiting.len() > self.max_waiting {
            let Some((_, oldest)) = self.waiting.pop_first() else {
                break;
            };
            self.unlinked += 1;
            self.log(oldest, None);
        }
    }

    /// Closes the records whose window ended a window before `now` (the events' own time
    /// while reading history, the clock once caught up): one window of slack for events
    /// stored a little out of time order, as a batch over the store allows
    /// (`Correlator::batch`).
    pub(crate) fn expire(&mut self, now: DateTime<Utc>) {
        let Some(now) = now.checked_sub_signed(self.window) else {
            return;
        };
        for record in self.correlator.expire(now) {
            self.close(record);
        }
        let Some(stale) = now.checked_sub_signed(self.window * MAX_WAIT_WINDOWS) else {
            return;
        };
        // An event stamped ahead of the clock (a clock stepped back) would wait until then and
        // hold the cursor behind it: it waits no longer than one stamped in the past.
        let ahead = now
            .checked_add_signed(self.window * (MAX_WAIT_WINDOWS + 1))
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        let old: Vec<i64> = self
            .waiting
            .iter()
            .filter(|(_, e)| {
                let at = e.event.keys().timestamp;
                at < stale || at > ahead
            })
            .map(|(id, _)| *id)
            .collect();
        for id in old {
            if let Some(event) = self.waiting.remove(&id) {
                self.log(event, None);
            }
        }
    }

    /// What is ready to leave, and the cursor once it has left.
    pub(crate) fn take(&mut self) -> Batch {
        let resume_after = match self.waiting.keys().next() {
            Some(first) => first - 1,
            None => self.read_through,
        };
        let mut batch = std::mem::take(&mut self.ready);
        batch.logs.sort_by_key(|l| l.event.id);
        // Never backwards: a restart must not re-read what an earlier batch's cursor passed.
        batch.resume_after = resume_after.max(batch.resume_after);
        self.ready.resume_after = batch.resume_after;
        batch
    }

    fn log(&mut self, event: StoredEvent, span: Option<SpanIds>) {
        let wanted = self
            .wanted
            .as_ref()
            .is_none_or(|w| w.contains(event.event.kind()));
        if wanted {
            self.ready.logs.push(LogItem { event, span });
        }
    }

    fn close(&mut self, record: CallRecord) {
        let sightings: Vec<&Sighting> = [&record.intercept, &record.execution, &record.connection]
            .into_iter()
            .flatten()
            .collect();
        let Some(first) = sightings.iter().map(|s| s.event_id).min() else {
            return;
        };
        let ids = self.ids(first);
        let mut item = SpanItem {
            ids,
            jsonrpc_id: None,
            tool_call_id: None,
            remote_addr: None,
            policy_revision: None,
            record: record.clone(),
        };
        for id in sightings.iter().map(|s| s.event_id) {
            let Some(event) = self.waiting.remove(&id) else {
                continue;
            };
            item.policy_revision = item.policy_revision.max(event.event.policy_revision());
            match &event.event {
                Event::McpToolCalled(e) => item.jsonrpc_id = Some(e.jsonrpc_id.clone()),
                Event::McpToolCallIntercepted(e) => {
                    item.tool_call_id = Some(e.tool_call_id.clone())
                }
                Event::McpNetworkConnection(e) => item.remote_addr = Some(e.remote_addr.clone()),
                _ => {}
            }
            self.log(event, Some(ids));
        }
        if self.spans {
            self.ready.spans.push(item);
        }
    }

    /// Ids from the record's first event and this store's instance: the same record read
    /// again after a restart gets the same span; another host's never does.
    fn ids(&self, first_event: i64) -> SpanIds {
        let digest = Sha256::new()
            .chain_update(b"toolwall-span\0")
            .chain_update(self.instance)
            .chain_update(first_event.to_be_bytes())
            .finalize();
        let mut trace = [0; 16];
        let mut span = [0; 8];
        trace.copy_from_slice(&digest[..16]);
        span.copy_from_slice(&digest[16..24]);
        // All-zero ids are invalid in OTLP; a digest of zeros is not going to happen, but a
        // collector must never be handed one.
        trace[0] |= u8::from(trace == [0; 16]);
        span[0] |= u8::from(span == [0; 8]);
        SpanIds { trace, span }
    }
}

/// The span's name: `{mcp.method.name} {gen_ai.tool.name}` for calls (the MCP semantic
/// conventions), what happened for the rest.
pub(crate) fn span_name(item: &SpanItem) -> String {
    let r = &item.record;
    match r.kind {
        RecordKind::Joined | RecordKind::InterceptOnly | RecordKind::ExecutionOnly => {
            format!("tools/call {}", r.tool)
        }
        RecordKind::ConnectionOnly => format!("connect {}", r.server_id),
        RecordKind::Alert => format!("toolwall alert {}", r.tool),
    }
}

/// The layers that saw the record, in the order a call passes them.
pub(crate) fn layers(record: &CallRecord) -> String {
    [&record.intercept, &record.execution, &record.connection]
        .into_iter()
        .flatten()
        .map(|s| s.layer.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// A blocked record is an error span, with the blocking reason as its message.
pub(crate) fn blocked(record: &CallRecord) -> bool {
    record.action == Action::Block
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{ToolCallIntercepted, ToolCalled};
    use serde_json::json;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_700_000_000_000 + ms).unwrap()
    }

    fn intercepted(id: i64, ms: i64, tool: &str) -> StoredEvent {
        StoredEvent {
            id,
            event: Event::McpToolCallIntercepted(ToolCallIntercepted {
                policy_revision: None,
                timestamp: at(ms),
                session_id: "s".into(),
                request_id: "r".into(),
                dialect: "anthropic".into(),
                tool_name: tool.into(),
                server_tool: tool.into(),
                tool_call_id: format!("toolu_{id}"),
                input: Some(json!({"a": 1})),
                server_id: "srv".into(),
                server_type: "stdio".into(),
                server_addr: String::new(),
                tool_hash: String::new(),
                action: Action::Allow,
                reason: String::new(),
            }),
        }
    }

    fn called(id: i64, ms: i64, tool: &str, action: Action) -> StoredEvent {
        StoredEvent {
            id,
            event: Event::McpToolCalled(ToolCalled {
                policy_revision: None,
                timestamp: at(ms),
                session_id: "s".into(),
                server_id: "srv".into(),
                server_type: "stdio".into(),
                tool_name: tool.into(),
                jsonrpc_id: json!(id),
                input: Some(json!({"a": 1})),
                action,
                reason: if action == Action::Block {
                    "denied".into()
                } else {
                    String::new()
                },
                layer: "shim".into(),
            }),
        }
    }

    fn seen(id: i64, ms: i64) -> StoredEvent {
        StoredEvent {
            id,
            event: Event::McpToolSeen(crate::events::ToolSeen {
                policy_revision: None,
                timestamp: at(ms),
                session_id: "s".into(),
                server_id: "srv".into(),
                server_type: "stdio".into(),
                tool_name: "t".into(),
                tool_hash: "h".into(),
                action: Action::Allow,
                reason: String::new(),
            }),
        }
    }

    fn outbox(resume_after: i64) -> Outbox {
        Outbox::new(
            std::time::Duration::from_secs(2),
            &[],
            true,
            [7; 16],
            resume_after,
        )
    }

    #[test]
    fn a_calls_events_share_its_span_and_wait_for_it() {
        let mut out = outbox(0);
        out.push(seen(1, 0));
        out.push(intercepted(2, 10, "get-sum"));
        let mut call = called(3, 20, "get-sum", Action::Allow);
        if let Event::McpToolCalled(e) = &mut call.event {
            e.policy_revision = Some(9);
        }
        out.push(call);
        let batch = out.take();
        // The listing left at once; the call's events wait, and the cursor with them.
        assert_eq!(batch.logs.len(), 1);
        assert_eq!(batch.resume_after, 1);
        assert!(batch.spans.is_empty());
        out.expire(at(10_000));
        let batch = out.take();
        assert_eq!(batch.resume_after, 3);
        assert_eq!(batch.spans.len(), 1);
        let span = &batch.spans[0];
        assert_eq!(span.record.kind, RecordKind::Joined);
        assert_eq!(span_name(span), "tools/call get-sum");
        assert_eq!(layers(&span.record), "llm/anthropic,shim");
        assert_eq!(span.jsonrpc_id, Some(json!(3)));
        assert_eq!(span.tool_call_id.as_deref(), Some("toolu_2"));
        assert_eq!(span.policy_revision, Some(9));
        let ids: Vec<_> = batch.logs.iter().map(|l| (l.event.id, l.span)).collect();
        assert_eq!(ids, vec![(2, Some(span.ids)), (3, Some(span.ids))]);
    }

    #[test]
    fn a_restart_from_the_cursor_builds_the_same_span() {
        let events = [
            intercepted(1, 0, "a"),
            called(2, 5, "a", Action::Allow),
            intercepted(3, 9_000, "b"),
        ];
        let mut first = outbox(0);
        for e in &events {
            first.push(e.clone());
        }
        first.expire(at(8_000));
        let before = first.take();
        assert_eq!(before.spans.len(), 1);
        // "b" still waits: the cursor stays before it.
        assert_eq!(before.resume_after, 2);
        first.push(called(4, 9_010, "b", Action::Block));
        first.expire(at(20_000));
        let span_b = first.take().spans.remove(0);

        let mut again = outbox(before.resume_after);
        for e in [events[2].clone(), called(4, 9_010, "b", Action::Block)] {
            again.push(e);
        }
        again.expire(at(20_000));
        let replay = again.take();
        assert_eq!(replay.spans[0].ids, span_b.ids);
        assert!(blocked(&replay.spans[0].record));
        assert_eq!(replay.resume_after, 4);
    }

    #[test]
    fn a_flood_of_open_calls_is_bounded_and_the_unlinked_counted() {
        let mut out = outbox(0);
        out.max_waiting = 500;
        for id in 1..=600 {
            out.push(intercepted(id, 0, &format!("t{id}")));
        }
        assert_eq!(out.waiting.len(), 500);
        assert_eq!(out.unlinked(), 100);
        let batch = out.take();
        assert_eq!(batch.logs.len(), 100);
        assert!(batch.logs.iter().all(|l| l.span.is_none()));
        // The cursor stays before the oldest still waiting.
        assert_eq!(batch.resume_after, 100);
    }

    #[test]
    fn an_event_stamped_ahead_of_the_clock_does_not_hold_the_cursor() {
        let mut out = outbox(0);
        out.push(intercepted(1, 3_600_000, "later"));
        out.push(seen(2, 0));
        out.expire(at(1_000));
        let batch = out.take();
        assert_eq!(batch.resume_after, 2, "{batch:?}");
        assert_eq!(batch.logs.len(), 2);
    }

    #[test]
    fn another_instance_gets_other_ids() {
        let a = outbox(0).ids(5);
        let b = Outbox::new(std::time::Duration::from_secs(2), &[], true, [8; 16], 0).ids(5);
        assert_ne!(a.trace, b.trace);
        assert_ne!(a.span, b.span);
    }

    #[test]
    fn only_the_wanted_types_leave_as_logs_but_spans_still_do() {
        let mut out = Outbox::new(
            std::time::Duration::from_secs(2),
            &["mcp_tool_seen".into()],
            true,
            [7; 16],
            0,
        );
        out.push(seen(1, 0));
        out.push(called(2, 1, "t", Action::Allow));
        out.expire(at(60_000));
        let batch = out.take();
        assert_eq!(batch.logs.len(), 1);
        assert_eq!(batch.logs[0].event.id, 1);
        assert_eq!(batch.spans.len(), 1);
        assert_eq!(batch.resume_after, 2);
    }
}
