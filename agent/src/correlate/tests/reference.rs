//! The correlator as it was before open records were indexed and a batch closed them as it
//! went: a linear search of every open record per event. The tests check the indexed one
//! against it.

use chrono::{DateTime, Duration, Utc};
use serde_json::Value;

use super::super::{CallRecord, Side, Sighting, blank, server_tool};
use crate::{
    decision::Action,
    events::{Event, StoredEvent},
};

/// A record still open for matching.
struct Open {
    record: CallRecord,
    /// The latest sighting's time; the record closes a window after it.
    last: DateTime<Utc>,
}

/// The join state.
pub(super) struct Linear {
    window: Duration,
    open: Vec<Open>,
    hash: fn(&Value) -> String,
}

impl Linear {
    /// A correlator with a time window and the canonical hash used for arguments.
    pub(super) fn new(window: std::time::Duration, hash: fn(&Value) -> String) -> Self {
        Linear {
            window: Duration::from_std(window).unwrap_or(Duration::seconds(2)),
            open: Vec::new(),
            hash,
        }
    }

    /// Takes one stored event. Events that are not calls or connections are ignored.
    pub(super) fn push(&mut self, stored: &StoredEvent) -> Vec<CallRecord> {
        let mut done = Vec::new();
        match &stored.event {
            Event::McpToolCallIntercepted(e) => {
                let tool = if e.server_tool.is_empty() {
                    server_tool(&e.tool_name, &e.server_id)
                } else {
                    e.server_tool.clone()
                };
                let sighting = Sighting {
                    event_id: stored.id,
                    at: e.timestamp,
                    action: e.action,
                    reason: e.reason.clone(),
                    layer: format!("llm/{}", e.dialect),
                };
                let cut = e
                    .input
                    .as_ref()
                    .is_some_and(crate::events::bound::is_marker);
                let args = (!cut).then(|| {
                    (self.hash)(
                        e.input
                            .as_ref()
                            .unwrap_or(&Value::Object(Default::default())),
                    )
                });
                if e.action == Action::Block {
                    let mut record = blank(&e.session_id, &e.server_id, &tool, args);
                    record.args_cut = cut;
                    record.intercept = Some(sighting);
                    done.push(record.settle());
                } else if let Some(i) = self.best(
                    &e.session_id,
                    &e.server_id,
                    &tool,
                    e.timestamp,
                    (&args, cut),
                    Side::NeedsIntercept,
                ) {
                    let open = &mut self.open[i];
                    open.record.intercept = Some(sighting);
                    open.record.args_hash = open.record.args_hash.take().or(args);
                    open.last = open.last.max(e.timestamp);
                } else {
                    let mut record = blank(&e.session_id, &e.server_id, &tool, args);
                    record.args_cut = cut;
                    record.intercept = Some(sighting);
                    self.open_with_connection(record, e.timestamp);
                }
            }
            Event::McpToolCalled(e) => {
                let sighting = Sighting {
                    event_id: stored.id,
                    at: e.timestamp,
                    action: e.action,
                    reason: e.reason.clone(),
                    layer: e.layer.clone(),
                };
                let cut = e
                    .input
                    .as_ref()
                    .is_some_and(crate::events::bound::is_marker);
                let args = (!cut).then(|| {
                    (self.hash)(
                        e.input
                            .as_ref()
                            .unwrap_or(&Value::Object(Default::default())),
                    )
                });
                if let Some(i) = self.best(
                    &e.session_id,
                    &e.server_id,
                    &e.tool_name,
                    e.timestamp,
                    (&args, cut),
                    Side::NeedsExecution,
                ) {
                    let open = &mut self.open[i];
                    open.record.execution = Some(sighting);
                    open.record.args_hash = open.record.args_hash.take().or(args);
                    open.last = open.last.max(e.timestamp);
                } else {
                    let mut record = blank(&e.session_id, &e.server_id, &e.tool_name, args);
                    record.args_cut = cut;
                    record.execution = Some(sighting);
                    self.open_with_connection(record, e.timestamp);
                }
            }
            Event::McpNetworkConnection(e) => {
                let sighting = Sighting {
                    event_id: stored.id,
                    at: e.timestamp,
                    action: e.action,
                    reason: if e.action == Action::Block {
                        "connection denied by the kernel".into()
                    } else {
                        String::new()
                    },
                    layer: "kernel".into(),
                };
                let at = e.timestamp;
                let near = self
                    .open
                    .iter()
                    .enumerate()
                    .filter(|(_, o)| {
                        o.record.connection.is_none()
                            && o.record.session_id == e.session_id
                            && o.record.server_id == e.server_id
                            && (o.record.intercept.is_some() || o.record.execution.is_some())
                            && (o.record.first_seen() - at).abs() <= self.window
                    })
                    .min_by_key(|(_, o)| (o.record.first_seen() - at).abs())
                    .map(|(i, _)| i);
                match near {
                    Some(i) => {
                        self.open[i].record.connection = Some(sighting);
                        self.open[i].last = self.open[i].last.max(at);
                    }
                    None => {
                        let mut record = blank(&e.session_id, &e.server_id, "", None);
                        record.connection = Some(sighting);
                        self.open.push(Open { record, last: at });
                    }
                }
            }
            Event::McpToolSeen(_)
            | Event::McpToolChanged(_)
            | Event::KernelAlert(_)
            | Event::McpResultInspected(_)
            | Event::LlmRoute(_)
            | Event::UnreadableRow(_) => {}
        }
        done
    }

    /// A new record adopts an unclaimed connection of its session and server in the window (a
    /// TCP connect comes before the request that travels on it).
    fn open_with_connection(&mut self, mut record: CallRecord, at: DateTime<Utc>) {
        let adopt = self
            .open
            .iter()
            .enumerate()
            .filter(|(_, o)| {
                o.record.intercept.is_none()
                    && o.record.execution.is_none()
                    && o.record.session_id == record.session_id
                    && o.record.server_id == record.server_id
                    && (o.last - at).abs() <= self.window
            })
            .min_by_key(|(_, o)| (o.last - at).abs())
            .map(|(i, _)| i);
        if let Some(i) = adopt {
            record.connection = self.open.remove(i).record.connection;
        }
        self.open.push(Open { record, last: at });
    }

    /// The open record an event should join: same session, server and tool, missing this side,
    /// within the window; equal arguments first, then the earliest.
    fn best(
        &self,
        session: &str,
        server: &str,
        tool: &str,
        at: DateTime<Utc>,
        (args, cut): (&Option<String>, bool),
        side: Side,
    ) -> Option<usize> {
        if cut {
            return None;
        }
        let candidates = self.open.iter().enumerate().filter(|(_, o)| {
            let r = &o.record;
            // A call runs after the model proposed it: an execution joins no proposal made
            // after it (else one whose proposal lies before what was read takes a later call's,
            // and that call's execution the next one's).
            let missing = match side {
                Side::NeedsIntercept => {
                    r.intercept.is_none() && r.execution.as_ref().is_some_and(|x| x.at >= at)
                }
                Side::NeedsExecution => {
                    r.execution.is_none() && r.intercept.as_ref().is_some_and(|i| i.at <= at)
                }
            };
            let args_agree = match (&r.args_hash, args) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            missing
                && args_agree
                && !r.args_cut
                && r.session_id == session
                && r.server_id == server
                && r.tool == tool
                && (r.first_seen() - at).abs() <= self.window
        });
        let mut best: Option<(usize, bool, DateTime<Utc>)> = None;
        for (i, o) in candidates {
            let same_args = args.is_some() && o.record.args_hash == *args;
            let first = o.record.first_seen();
            let better = match best {
                None => true,
                Some((_, b_same, b_first)) => {
                    (same_args, std::cmp::Reverse(first)) > (b_same, std::cmp::Reverse(b_first))
                }
            };
            if better {
                best = Some((i, same_args, first));
            }
        }
        best.map(|(i, _, _)| i)
    }

    /// Closes and returns the records whose window ended before `now`.
    pub(super) fn expire(&mut self, now: DateTime<Utc>) -> Vec<CallRecord> {
        let window = self.window;
        let (done, open): (Vec<Open>, Vec<Open>) =
            self.open.drain(..).partition(|o| o.last + window < now);
        self.open = open;
        done.into_iter().map(|o| o.record.settle()).collect()
    }

    /// Closes every open record (end of a batch, or shutdown).
    pub(super) fn flush(&mut self) -> Vec<CallRecord> {
        let mut done: Vec<CallRecord> = self.open.drain(..).map(|o| o.record.settle()).collect();
        done.sort_by_key(CallRecord::first_seen);
        done
    }

    /// Correlates a whole ordered list of stored events (a batch over the database).
    pub(super) fn batch(
        window: std::time::Duration,
        hash: fn(&Value) -> String,
        events: &[StoredEvent],
    ) -> Vec<CallRecord> {
        let mut c = Linear::new(window, hash);
        let mut out: Vec<CallRecord> = events.iter().flat_map(|e| c.push(e)).collect();
        out.extend(c.flush());
        out.sort_by_key(CallRecord::first_seen);
        out
    }
}
