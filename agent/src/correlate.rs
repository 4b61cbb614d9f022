//! The correlator: joins the three layers' events into one record per tool call.
//!
//! Sans-IO: [`Correlator::push`] takes stored events (in store order) and
//! [`Correlator::expire`] hands back the records whose window has passed, so the same code
//! serves the daemon's live stream and a batch over the database (`toolwall mcp calls --db`).
//!
//! Keys, in order: session, then server and tool, then the arguments (a canonical hash, where
//! both sides carry them), then time (a window, 2 s by default). Matching is one-to-one: an
//! execution takes the intercept with the same arguments first, else the earliest open one. A
//! blocked intercept is final at once and never joined: an execution of a call the LLM layer
//! blocked is reported as an execution with no intercept — the alert that something bypassed it.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    decision::Action,
    events::{Event, StoredEvent},
};

/// Which layers saw the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// Asked for by the LLM and executed.
    Joined,
    /// Seen at the LLM layer only: blocked there, or never run.
    InterceptOnly,
    /// Executed with no matching LLM tool call: a call the LLM never asked for (or one the
    /// LLM layer blocked and something ran anyway). Worth an alert.
    ExecutionOnly,
    /// A connection to an MCP server with no call around it.
    ConnectionOnly,
}

/// One layer's sighting of a call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sighting {
    /// Row id of the event in the store.
    pub event_id: i64,
    /// When the layer saw it.
    pub at: DateTime<Utc>,
    /// That layer's decision.
    pub action: Action,
    /// Its reason, if any.
    pub reason: String,
    /// `llm/anthropic`, `shim`, `mcp-proxy`, `kernel`.
    pub layer: String,
}

/// One tool call across the layers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    /// Which layers saw it.
    pub kind: RecordKind,
    /// The agent session.
    pub session_id: String,
    /// The server.
    pub server_id: String,
    /// The tool's name on its server (empty for a bare connection).
    pub tool: String,
    /// The overall decision: blocked if any layer blocked it.
    pub action: Action,
    /// The blocking layer's reason, else the first non-empty one.
    pub reason: String,
    /// Canonical hash of the arguments, when known.
    pub args_hash: Option<String>,
    /// The LLM layer's sighting.
    pub intercept: Option<Sighting>,
    /// The shim's or filter proxy's sighting.
    pub execution: Option<Sighting>,
    /// The kernel's sighting.
    pub connection: Option<Sighting>,
}

impl CallRecord {
    /// When the call was first seen.
    pub fn first_seen(&self) -> DateTime<Utc> {
        [&self.intercept, &self.execution, &self.connection]
            .into_iter()
            .flatten()
            .map(|s| s.at)
            .min()
            .unwrap_or_default()
    }

    /// Milliseconds from the LLM's tool call to its execution.
    pub fn intercept_to_execution_ms(&self) -> Option<f64> {
        let (i, e) = (self.intercept.as_ref()?, self.execution.as_ref()?);
        Some((e.at - i.at).num_microseconds()? as f64 / 1000.0)
    }

    fn kind_now(&self) -> RecordKind {
        match (&self.intercept, &self.execution) {
            (Some(_), Some(_)) => RecordKind::Joined,
            (Some(_), None) => RecordKind::InterceptOnly,
            (None, Some(_)) => RecordKind::ExecutionOnly,
            (None, None) => RecordKind::ConnectionOnly,
        }
    }

    fn settle(mut self) -> Self {
        self.kind = self.kind_now();
        let sightings = [&self.intercept, &self.execution, &self.connection];
        let blocked = sightings
            .iter()
            .copied()
            .flatten()
            .find(|s| s.action == Action::Block);
        self.action = if blocked.is_some() {
            Action::Block
        } else {
            Action::Allow
        };
        self.reason = blocked
            .map(|s| s.reason.clone())
            .or_else(|| {
                sightings
                    .iter()
                    .copied()
                    .flatten()
                    .map(|s| s.reason.clone())
                    .find(|r| !r.is_empty())
            })
            .unwrap_or_default();
        self
    }
}

/// A record still open for matching.
struct Open {
    record: CallRecord,
    /// The latest sighting's time; the record closes a window after it.
    last: DateTime<Utc>,
}

/// The join state.
pub struct Correlator {
    window: Duration,
    open: Vec<Open>,
    hash: fn(&Value) -> String,
}

impl Correlator {
    /// A correlator with a time window and the canonical hash used for arguments.
    pub fn new(window: std::time::Duration, hash: fn(&Value) -> String) -> Self {
        Correlator {
            window: Duration::from_std(window).unwrap_or(Duration::seconds(2)),
            open: Vec::new(),
            hash,
        }
    }

    /// Takes one stored event. Events that are not calls or connections are ignored.
    pub fn push(&mut self, stored: &StoredEvent) -> Vec<CallRecord> {
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
                let args = e.input.as_ref().map(self.hash);
                if e.action == Action::Block {
                    let mut record = blank(&e.session_id, &e.server_id, &tool, args);
                    record.intercept = Some(sighting);
                    done.push(record.settle());
                } else if let Some(i) = self.best(
                    &e.session_id,
                    &e.server_id,
                    &tool,
                    e.timestamp,
                    &args,
                    Side::NeedsIntercept,
                ) {
                    let open = &mut self.open[i];
                    open.record.intercept = Some(sighting);
                    open.record.args_hash = open.record.args_hash.take().or(args);
                    open.last = open.last.max(e.timestamp);
                } else {
                    let mut record = blank(&e.session_id, &e.server_id, &tool, args);
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
                let args = e.input.as_ref().map(self.hash);
                if let Some(i) = self.best(
                    &e.session_id,
                    &e.server_id,
                    &e.tool_name,
                    e.timestamp,
                    &args,
                    Side::NeedsExecution,
                ) {
                    let open = &mut self.open[i];
                    open.record.execution = Some(sighting);
                    open.record.args_hash = open.record.args_hash.take().or(args);
                    open.last = open.last.max(e.timestamp);
                } else {
                    let mut record = blank(&e.session_id, &e.server_id, &e.tool_name, args);
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
            Event::McpToolSeen(_) | Event::McpToolChanged(_) | Event::KernelAlert(_) => {}
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
        args: &Option<String>,
        side: Side,
    ) -> Option<usize> {
        let candidates = self.open.iter().enumerate().filter(|(_, o)| {
            let r = &o.record;
            let missing = match side {
                Side::NeedsIntercept => r.intercept.is_none() && r.execution.is_some(),
                Side::NeedsExecution => r.execution.is_none() && r.intercept.is_some(),
            };
            let args_agree = match (&r.args_hash, args) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            missing
                && args_agree
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
    pub fn expire(&mut self, now: DateTime<Utc>) -> Vec<CallRecord> {
        let window = self.window;
        let (done, open): (Vec<Open>, Vec<Open>) =
            self.open.drain(..).partition(|o| o.last + window < now);
        self.open = open;
        done.into_iter().map(|o| o.record.settle()).collect()
    }

    /// Closes every open record (end of a batch, or shutdown).
    pub fn flush(&mut self) -> Vec<CallRecord> {
        let mut done: Vec<CallRecord> = self.open.drain(..).map(|o| o.record.settle()).collect();
        done.sort_by_key(CallRecord::first_seen);
        done
    }

    /// Correlates a whole ordered list of stored events (a batch over the database).
    pub fn batch(
        window: std::time::Duration,
        hash: fn(&Value) -> String,
        events: &[StoredEvent],
    ) -> Vec<CallRecord> {
        let mut c = Correlator::new(window, hash);
        let mut out: Vec<CallRecord> = events.iter().flat_map(|e| c.push(e)).collect();
        out.extend(c.flush());
        out.sort_by_key(CallRecord::first_seen);
        out
    }
}

#[derive(Clone, Copy)]
enum Side {
    NeedsIntercept,
    NeedsExecution,
}

fn blank(session: &str, server: &str, tool: &str, args_hash: Option<String>) -> CallRecord {
    CallRecord {
        kind: RecordKind::ConnectionOnly,
        session_id: session.into(),
        server_id: server.into(),
        tool: tool.into(),
        action: Action::Allow,
        reason: String::new(),
        args_hash,
        intercept: None,
        execution: None,
        connection: None,
    }
}

/// The tool's own name from the name the model used: `mcp__<server>__<tool>` → `<tool>`.
fn server_tool(model_name: &str, server_id: &str) -> String {
    model_name
        .strip_prefix("mcp__")
        .and_then(|rest| rest.strip_prefix(server_id))
        .and_then(|rest| rest.strip_prefix("__"))
        .unwrap_or(model_name)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{NetworkConnection, ToolCallIntercepted, ToolCalled};
    use serde_json::json;

    fn hash(v: &Value) -> String {
        // serde_json's default map is ordered, so this is canonical enough for tests.
        serde_json::to_string(v).unwrap()
    }

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    fn intercept(id: i64, ms: i64, tool: &str, args: Value, action: Action) -> StoredEvent {
        StoredEvent {
            id,
            event: Event::McpToolCallIntercepted(ToolCallIntercepted {
                timestamp: t(ms),
                session_id: "s".into(),
                request_id: format!("r{id}"),
                dialect: "anthropic".into(),
                tool_name: format!("mcp__srv__{tool}"),
                server_tool: String::new(),
                tool_call_id: format!("toolu_{id}"),
                input: Some(args),
                server_id: "srv".into(),
                server_type: "stdio".into(),
                server_addr: String::new(),
                tool_hash: String::new(),
                action,
                reason: if action == Action::Block {
                    "tool denied".into()
                } else {
                    String::new()
                },
            }),
        }
    }

    fn called(id: i64, ms: i64, tool: &str, args: Value) -> StoredEvent {
        StoredEvent {
            id,
            event: Event::McpToolCalled(ToolCalled {
                timestamp: t(ms),
                session_id: "s".into(),
                server_id: "srv".into(),
                server_type: "stdio".into(),
                tool_name: tool.into(),
                jsonrpc_id: json!(id),
                input: Some(args),
                action: Action::Allow,
                reason: String::new(),
                layer: "shim".into(),
            }),
        }
    }

    fn connection(id: i64, ms: i64) -> StoredEvent {
        StoredEvent {
            id,
            event: Event::McpNetworkConnection(NetworkConnection {
                timestamp: t(ms),
                session_id: "s".into(),
                remote_addr: "127.0.0.1:3001".into(),
                server_id: "srv".into(),
                server_type: "http".into(),
                action: Action::Allow,
                pid: 1,
                tid: 1,
                uid: 0,
                comm: "node".into(),
                exe: None,
                cmdline: None,
                ppid: None,
                cgroup_id: 1,
                socket_cookie: 1,
                protocol: "tcp".into(),
                family: "ipv4".into(),
            }),
        }
    }

    fn run(events: &[StoredEvent]) -> Vec<CallRecord> {
        Correlator::batch(std::time::Duration::from_secs(2), hash, events)
    }

    #[test]
    fn joins_an_intercept_with_its_execution_and_connection() {
        let records = run(&[
            intercept(1, 0, "echo", json!({"m": 1}), Action::Allow),
            connection(2, 40),
            called(3, 50, "echo", json!({"m": 1})),
        ]);
        assert_eq!(records.len(), 1, "{records:#?}");
        let r = &records[0];
        assert_eq!(r.kind, RecordKind::Joined);
        assert_eq!((r.tool.as_str(), r.action), ("echo", Action::Allow));
        assert_eq!(r.intercept.as_ref().unwrap().event_id, 1);
        assert_eq!(r.connection.as_ref().unwrap().event_id, 2);
        assert_eq!(r.execution.as_ref().unwrap().event_id, 3);
        assert_eq!(r.intercept_to_execution_ms(), Some(50.0));
    }

    #[test]
    fn unmatched_records_are_first_class() {
        let records = run(&[
            intercept(1, 0, "delete", json!({}), Action::Block),
            called(2, 100, "delete", json!({})),
            intercept(3, 5_000, "echo", json!({}), Action::Allow),
            connection(4, 20_000),
        ]);
        let kinds: Vec<_> = records.iter().map(|r| (r.kind, r.action)).collect();
        assert_eq!(
            kinds,
            [
                (RecordKind::InterceptOnly, Action::Block),
                (RecordKind::ExecutionOnly, Action::Allow),
                (RecordKind::InterceptOnly, Action::Allow),
                (RecordKind::ConnectionOnly, Action::Allow),
            ],
            "a blocked intercept is never joined to an execution: that execution bypassed the LLM layer"
        );
        assert_eq!(records[0].reason, "tool denied");
    }

    #[test]
    fn same_tool_same_second_is_matched_by_arguments_first() {
        // The executions come back in the opposite order from the intercepts.
        let records = run(&[
            intercept(1, 0, "add", json!({"a": 1}), Action::Allow),
            intercept(2, 1, "add", json!({"a": 2}), Action::Allow),
            called(3, 10, "add", json!({"a": 2})),
            called(4, 11, "add", json!({"a": 1})),
        ]);
        let pairs: Vec<_> = records
            .iter()
            .map(|r| {
                (
                    r.intercept.as_ref().unwrap().event_id,
                    r.execution.as_ref().unwrap().event_id,
                )
            })
            .collect();
        assert_eq!(pairs, [(1, 4), (2, 3)]);
    }

    #[test]
    fn same_arguments_different_times_are_matched_in_order_and_outside_the_window_not_at_all() {
        let records = run(&[
            intercept(1, 0, "ping", json!({}), Action::Allow),
            intercept(2, 500, "ping", json!({}), Action::Allow),
            called(3, 600, "ping", json!({})),
            called(4, 700, "ping", json!({})),
            intercept(5, 10_000, "ping", json!({}), Action::Allow),
            called(6, 13_000, "ping", json!({})),
        ]);
        let pairs: Vec<_> = records
            .iter()
            .map(|r| {
                (
                    r.intercept.as_ref().map(|s| s.event_id),
                    r.execution.as_ref().map(|s| s.event_id),
                )
            })
            .collect();
        assert_eq!(
            pairs,
            [
                (Some(1), Some(3)),
                (Some(2), Some(4)),
                (Some(5), None),
                (None, Some(6))
            ]
        );
    }

    #[test]
    fn expire_closes_only_records_past_their_window() {
        let mut c = Correlator::new(std::time::Duration::from_secs(2), hash);
        assert!(
            c.push(&intercept(1, 0, "echo", json!({}), Action::Allow))
                .is_empty()
        );
        assert!(c.expire(t(1_999)).is_empty());
        c.push(&called(2, 1_000, "echo", json!({})));
        assert!(
            c.expire(t(2_500)).is_empty(),
            "the execution extended the window"
        );
        let done = c.expire(t(3_001));
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].kind, RecordKind::Joined);
    }

    /// Many concurrent calls — bursts of 8 within ~100 ms, bursts 300 ms apart so windows
    /// overlap; the same tool throughout, four argument values so each appears twice per burst;
    /// executions returning out of order across arguments — plus calls the LLM layer blocked
    /// (never executed) and executions nobody asked for. The joins must equal the ground truth.
    #[test]
    fn concurrent_calls_are_joined_exactly_as_they_happened() {
        // Deterministic pseudo-random numbers (xorshift), so a failure reproduces.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut rand = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let mut truth = std::collections::HashSet::new(); // (intercept id, execution id)
        let mut timeline = Vec::new(); // (ms, id, event)
        let mut next_id = 1;
        let mut id = || {
            next_id += 1;
            next_id - 1
        };
        for burst in 0..50i64 {
            for k in 0..8i64 {
                let start = burst * 300 + k * 12 + rand(5) as i64;
                let args = json!({"n": k % 4});
                match rand(20) {
                    0 | 1 => {
                        let i = id();
                        timeline.push((start, i, intercept(i, start, "add", args, Action::Block)));
                        truth.insert((Some(i), None));
                    }
                    2 => {
                        let e = id();
                        let rogue = json!({"n": 1000 + burst * 8 + k});
                        timeline.push((start, e, called(e, start, "add", rogue)));
                        truth.insert((None, Some(e)));
                    }
                    _ => {
                        let (i, e) = (id(), id());
                        let done = start + 20 + rand(25) as i64;
                        timeline.push((
                            start,
                            i,
                            intercept(i, start, "add", args.clone(), Action::Allow),
                        ));
                        timeline.push((done, e, called(e, done, "add", args)));
                        truth.insert((Some(i), Some(e)));
                    }
                }
            }
        }
        // The store's order is arrival order.
        timeline.sort_by_key(|(ms, id, _)| (*ms, *id));
        let events: Vec<StoredEvent> = timeline.into_iter().map(|(_, _, e)| e).collect();
        let records = run(&events);
        let got: std::collections::HashSet<_> = records
            .iter()
            .map(|r| {
                (
                    r.intercept.as_ref().map(|s| s.event_id),
                    r.execution.as_ref().map(|s| s.event_id),
                )
            })
            .collect();
        let joins = |set: &std::collections::HashSet<(Option<i64>, Option<i64>)>| {
            set.iter()
                .filter(|p| p.0.is_some() && p.1.is_some())
                .count()
        };
        let true_joins = got
            .intersection(&truth)
            .filter(|p| p.0.is_some() && p.1.is_some())
            .count();
        let precision = true_joins as f64 / joins(&got) as f64;
        let recall = true_joins as f64 / joins(&truth) as f64;
        println!(
            "correlator: {} calls, {} true joins; precision {precision:.4}, recall {recall:.4}",
            truth.len(),
            joins(&truth)
        );
        assert_eq!(records.len(), truth.len(), "one record per call");
        assert_eq!(
            got, truth,
            "every join, and every unmatched record, as it happened"
        );
    }
}
