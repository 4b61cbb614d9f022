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
//!
//! Open records are kept by session and server, connections apart from calls, so a flood of
//! kernel connections costs O(log n) an event; a batch closes records as the events' time moves
//! on, so its memory is a few windows' worth however long the list.

mod record;

use std::{
    collections::{BTreeMap, HashMap},
    ops::Bound,
};

use chrono::{DateTime, Duration, Utc};
use serde_json::Value;

use crate::{
    decision::Action,
    events::{Event, StoredEvent},
};

pub(crate) use record::{CallRecord, RecordKind, Sighting};

/// A record with an intercept or an execution, still open for matching.
struct Open {
    record: CallRecord,
    /// The latest sighting's time; the record closes a window after it.
    last: DateTime<Utc>,
    /// Arrival order: ties go to the earlier record, and records close in this order.
    seq: u64,
}

/// An unclaimed connection: all a connection-only record needs besides its key.
#[derive(Clone, Copy)]
struct Conn {
    event_id: i64,
    action: Action,
}

/// One session and server's open records. Calls are few and searched in full; connections can
/// be a flood (every connect the kernel saw), so they are kept by (time, arrival): the nearest
/// is found in O(log n) and the oldest close first.
#[derive(Default)]
struct Pair {
    /// In arrival order.
    calls: Vec<Open>,
    connections: BTreeMap<(DateTime<Utc>, u64), Conn>,
}

/// `map[key]`, made if missing: the key is copied only then (a function returning the reference
/// does not borrow-check).
macro_rules! slot {
    ($map:expr, $key:expr) => {
        match $map.get_mut($key) {
            Some(value) => value,
            None => $map.entry($key.to_owned()).or_default(),
        }
    };
}

/// Calls of one session and server open at once, at most ([`Correlator::open_call`]).
const MAX_OPEN_CALLS: usize = 4096;

/// A batch closes records at least this many events apart (and a quarter of the open count
/// apart, so a sweep's cost is spread over the events that grew the set).
const SWEEP_EVERY: usize = 256;

/// The join state.
pub struct Correlator {
    window: Duration,
    /// Open records by session, then server: an event looks at its own pair's only.
    open: HashMap<String, HashMap<String, Pair>>,
    /// How many records are open.
    len: usize,
    /// The next record's arrival number.
    seq: u64,
    /// The latest event time pushed: a batch closes records against it.
    latest: Option<DateTime<Utc>>,
    hash: fn(&Value) -> String,
    /// The most records open at once (tests check that a batch stays bounded).
    #[cfg(test)]
    peak: usize,
}

impl Correlator {
    /// A correlator with a time window and the canonical hash used for arguments.
    pub fn new(window: std::time::Duration, hash: fn(&Value) -> String) -> Self {
        Correlator {
            window: Duration::from_std(window).unwrap_or(Duration::seconds(2)),
            open: HashMap::new(),
            len: 0,
            seq: 0,
            latest: None,
            hash,
            #[cfg(test)]
            peak: 0,
        }
    }

    /// Takes one stored event. Events that are not calls or connections are ignored.
    pub fn push(&mut self, stored: &StoredEvent) -> Vec<CallRecord> {
        let mut done = Vec::new();
        match &stored.event {
            Event::McpToolCallIntercepted(e) => {
                self.saw(e.timestamp);
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
                let (args, cut) = self.args(e.input.as_ref());
                if e.action == Action::Block {
                    let mut record = blank(&e.session_id, &e.server_id, &tool, args);
                    record.args_cut = cut;
                    record.intercept = Some(sighting);
                    done.push(record.settle());
                } else if let Some(open) = self.best(
                    &e.session_id,
                    &e.server_id,
                    &tool,
                    e.timestamp,
                    (&args, cut),
                    Side::NeedsIntercept,
                ) {
                    open.record.intercept = Some(sighting);
                    open.record.args_hash = open.record.args_hash.take().or(args);
                    open.last = open.last.max(e.timestamp);
                } else {
                    let mut record = blank(&e.session_id, &e.server_id, &tool, args);
                    record.args_cut = cut;
                    record.intercept = Some(sighting);
                    done.extend(self.open_call(record, e.timestamp));
                }
            }
            Event::McpToolCalled(e) => {
                self.saw(e.timestamp);
                let sighting = Sighting {
                    event_id: stored.id,
                    at: e.timestamp,
                    action: e.action,
                    reason: e.reason.clone(),
                    layer: e.layer.clone(),
                };
                let (args, cut) = self.args(e.input.as_ref());
                if let Some(open) = self.best(
                    &e.session_id,
                    &e.server_id,
                    &e.tool_name,
                    e.timestamp,
                    (&args, cut),
                    Side::NeedsExecution,
                ) {
                    open.record.execution = Some(sighting);
                    open.record.args_hash = open.record.args_hash.take().or(args);
                    open.last = open.last.max(e.timestamp);
                } else {
                    let mut record = blank(&e.session_id, &e.server_id, &e.tool_name, args);
                    record.args_cut = cut;
                    record.execution = Some(sighting);
                    done.extend(self.open_call(record, e.timestamp));
                }
            }
            // A summary the kernel made under a flood stands alone: it is many connections,
            // none of which can be told apart to join a call.
            Event::McpNetworkConnection(e) if e.count > 1 => {
                self.saw(e.timestamp);
                let mut sighting = kernel(stored.id, e.timestamp, e.action);
                sighting.reason = format!(
                    "{} connections summarised by the kernel under a flood, {} to {}",
                    e.count,
                    e.since.unwrap_or(e.timestamp).format("%H:%M:%S%.3f"),
                    e.timestamp.format("%H:%M:%S%.3f")
                );
                let mut record = blank(&e.session_id, &e.server_id, "", None);
                record.connection = Some(sighting);
                done.push(record.settle());
            }
            Event::McpNetworkConnection(e) => {
                let at = e.timestamp;
                self.saw(at);
                let window = self.window;
                // The call of this session and server nearest in time that has no connection.
                let near = self.pair(&e.session_id, &e.server_id).and_then(|pair| {
                    pair.calls
                        .iter_mut()
                        .filter(|o| {
                            o.record.connection.is_none()
                                && (o.record.first_seen() - at).abs() <= window
                        })
                        .min_by_key(|o| (o.record.first_seen() - at).abs())
                });
                match near {
                    Some(open) => {
                        open.record.connection = Some(kernel(stored.id, at, e.action));
                        open.last = open.last.max(at);
                    }
                    None => {
                        let seq = self.opened();
                        let servers = slot!(self.open, e.session_id.as_str());
                        let pair = slot!(servers, e.server_id.as_str());
                        let conn = Conn {
                            event_id: stored.id,
                            action: e.action,
                        };
                        pair.connections.insert((at, seq), conn);
                    }
                }
            }
            Event::KernelAlert(e) => {
                self.saw(e.timestamp);
                let sighting = Sighting {
                    event_id: stored.id,
                    at: e.timestamp,
                    action: e.action,
                    reason: e.detail.clone(),
                    layer: "kernel".into(),
                };
                let mut record = blank(
                    &e.session_id,
                    "",
                    &format!("kernel alert: {}", e.alert),
                    None,
                );
                record.connection = Some(sighting);
                done.push(alert(record));
            }
            // What a server's answer held stands as an alert of its own: the call it answers is
            // named (tool and id) in the record, not joined to it.
            Event::McpResultInspected(e) => {
                self.saw(e.timestamp);
                let sighting = Sighting {
                    event_id: stored.id,
                    at: e.timestamp,
                    action: e.action,
                    reason: format!("{} (JSON-RPC id {})", e.reason, e.jsonrpc_id),
                    layer: e.layer.clone(),
                };
                let label = format!("result inspected: {}", e.tool_name);
                let mut record = blank(&e.session_id, &e.server_id, &label, None);
                record.execution = Some(sighting);
                done.push(alert(record));
            }
            // A row the store could not read may have been any call: it is shown among them,
            // so a record with a hole in it is seen where the calls are read.
            Event::UnreadableRow(e) => {
                self.saw(e.timestamp);
                let sighting = Sighting {
                    event_id: stored.id,
                    at: e.timestamp,
                    action: e.action,
                    reason: format!(
                        "row {} (stored as {:?}) could not be read: {}",
                        stored.id, e.stored_type, e.error
                    ),
                    layer: "store".into(),
                };
                let label = format!("unreadable row: {}", e.stored_type);
                let mut record = blank(&e.session_id, &e.server_id, &label, None);
                record.execution = Some(sighting);
                done.push(alert(record));
            }
            Event::McpToolSeen(_) | Event::McpToolChanged(_) | Event::LlmRoute(_) => {}
        }
        done
    }

    /// A sighting's arguments as the join compares them: their hash, and whether the record
    /// holds only a marker of arguments cut to its bound. Two sides cut theirs from different
    /// texts (a rogue call padded past the bound would otherwise match any proposal of the same
    /// tool), and neither side carries an id the other has, so cut arguments join nothing.
    ///
    /// A call without arguments is a call with `{}`: an agent may send either for a tool that
    /// takes none. Absent arguments are not a wildcard — an execution whose arguments the
    /// record lacks would otherwise join any proposal of its tool.
    fn args(&self, input: Option<&Value>) -> (Option<String>, bool) {
        match input {
            Some(v) if crate::events::bound::is_marker(v) => (None, true),
            Some(v) => (Some((self.hash)(v)), false),
            None => (Some((self.hash)(&Value::Object(Default::default()))), false),
        }
    }

    /// Notes an event's time (a batch closes records against the latest).
    fn saw(&mut self, at: DateTime<Utc>) {
        self.latest = Some(self.latest.map_or(at, |l| l.max(at)));
    }

    /// Counts a new open record and hands out its arrival number.
    fn opened(&mut self) -> u64 {
        self.len += 1;
        #[cfg(test)]
        {
            self.peak = self.peak.max(self.len);
        }
        self.seq += 1;
        self.seq
    }

    /// The open records of a session and server, if any.
    fn pair(&mut self, session: &str, server: &str) -> Option<&mut Pair> {
        self.open.get_mut(session)?.get_mut(server)
    }

    /// Opens a call record. It adopts the unclaimed connection of its session and server
    /// nearest in time within the window (a TCP connect comes before the request that travels
    /// on it).
    ///
    /// A session and server keep at most [`MAX_OPEN_CALLS`] calls open: past it the oldest
    /// closes at once (returned), so that a flood of calls within one window — thousands of
    /// calls stamped in the same instant — costs each event a bounded search, not one that
    /// grows with the flood.
    fn open_call(&mut self, mut record: CallRecord, at: DateTime<Utc>) -> Option<CallRecord> {
        let window = self.window;
        if let Some(pair) = self.pair(&record.session_id, &record.server_id)
            && let Some((t, seq)) = nearest(&pair.connections, at, window)
            && let Some(conn) = pair.connections.remove(&(t, seq))
        {
            record.connection = Some(kernel(conn.event_id, t, conn.action));
            self.len -= 1;
        }
        let evicted = self
            .pair(&record.session_id, &record.server_id)
            .filter(|pair| pair.calls.len() >= MAX_OPEN_CALLS)
            .map(|pair| pair.calls.remove(0));
        let evicted = evicted.map(|oldest| {
            self.len -= 1;
            let mut record = oldest.record.settle();
            if record.reason.is_empty() {
                record.reason = format!(
                    "closed early: over {MAX_OPEN_CALLS} calls of its session and server were open at once"
                );
            }
            record
        });
        let seq = self.opened();
        let servers = slot!(self.open, record.session_id.as_str());
        let pair = slot!(servers, record.server_id.as_str());
        pair.calls.push(Open {
            record,
            last: at,
            seq,
        });
        evicted
    }

    /// The open record an event should join: same session, server and tool, missing this side,
    /// within the window; equal arguments first, then the earliest.
    fn best(
        &mut self,
        session: &str,
        server: &str,
        tool: &str,
        at: DateTime<Utc>,
        (args, cut): (&Option<String>, bool),
        side: Side,
    ) -> Option<&mut Open> {
        if cut {
            return None;
        }
        let window = self.window;
        let calls = &mut self.pair(session, server)?.calls;
        let candidates = calls.iter().enumerate().filter(|(_, o)| {
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
                && r.tool == tool
                && (r.first_seen() - at).abs() <= window
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
        calls.get_mut(best?.0)
    }

    /// Closes and returns the records whose window ended before `now`.
    pub fn expire(&mut self, now: DateTime<Utc>) -> Vec<CallRecord> {
        let mut done = self.close(Some(now));
        done.sort_unstable_by_key(|(seq, _)| *seq);
        done.into_iter().map(|(_, r)| r).collect()
    }

    /// Closes every open record (end of a batch, or shutdown).
    pub fn flush(&mut self) -> Vec<CallRecord> {
        let mut done: Vec<_> = self
            .close(None)
            .into_iter()
            .map(|(seq, r)| ((r.first_seen(), seq), r))
            .collect();
        done.sort_unstable_by_key(|(key, _)| *key);
        done.into_iter().map(|(_, r)| r).collect()
    }

    /// Closes the records whose window ended before `now` (all of them, without), settled and
    /// with their arrival numbers. Pairs left empty go, so memory follows the open records.
    fn close(&mut self, now: Option<DateTime<Utc>>) -> Vec<(u64, CallRecord)> {
        // last + window < now, without overflow.
        let before = now.map(|now| minus(now, self.window));
        let due = |last: DateTime<Utc>| before.is_none_or(|b| last < b);
        let mut done = Vec::new();
        self.open.retain(|session, servers| {
            servers.retain(|server, pair| {
                let calls = pair.calls.extract_if(.., |o| due(o.last));
                done.extend(calls.map(|o| (o.seq, o.record.settle())));
                while let Some(entry) = pair.connections.first_entry() {
                    if !due(entry.key().0) {
                        break;
                    }
                    let ((at, seq), conn) = entry.remove_entry();
                    let mut record = blank(session, server, "", None);
                    record.connection = Some(kernel(conn.event_id, at, conn.action));
                    done.push((seq, record.settle()));
                }
                !pair.calls.is_empty() || !pair.connections.is_empty()
            });
            !servers.is_empty()
        });
        self.len -= done.len();
        done
    }
}

/// The unclaimed connection nearest `at` within the window; of two as near, the earlier
/// arrival (as a scan in arrival order would pick).
fn nearest(
    connections: &BTreeMap<(DateTime<Utc>, u64), Conn>,
    at: DateTime<Utc>,
    window: Duration,
) -> Option<(DateTime<Utc>, u64)> {
    let first_at = |t: DateTime<Utc>| {
        connections
            .range((t, 0)..=(t, u64::MAX))
            .next()
            .map(|(k, _)| *k)
    };
    let below = connections
        .range((minus(at, window), 0)..=(at, u64::MAX))
        .next_back()
        .and_then(|(k, _)| first_at(k.0));
    let above = connections
        .range((
            Bound::Excluded((at, u64::MAX)),
            Bound::Included((plus(at, window), u64::MAX)),
        ))
        .next()
        .map(|(k, _)| *k);
    match (below, above) {
        (Some(b), Some(a)) => Some(if (at - b.0, b.1) <= (a.0 - at, a.1) {
            b
        } else {
            a
        }),
        (b, a) => b.or(a),
    }
}

/// `at - d`, or the earliest time there is.
fn minus(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    at.checked_sub_signed(d).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// `at + d`, or the latest time there is.
fn plus(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    at.checked_add_signed(d).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// The kernel's sighting of a connection.
fn kernel(event_id: i64, at: DateTime<Utc>, action: Action) -> Sighting {
    Sighting {
        event_id,
        at,
        action,
        reason: if action == Action::Block {
            "connection denied by the kernel".into()
        } else {
            String::new()
        },
        layer: "kernel".into(),
    }
}

#[derive(Clone, Copy)]
enum Side {
    NeedsIntercept,
    NeedsExecution,
}

/// A record that stands alone among the calls (a kernel alert, a result inspection): settled
/// at once.
fn alert(record: CallRecord) -> CallRecord {
    let mut record = record.settle();
    record.kind = RecordKind::Alert;
    record
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
        args_cut: false,
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

mod page;
mod stored;
mod sweep;
pub(crate) use page::{Direction, Key, MAX_LIMIT, PageQuery, read_page};
pub(crate) use sweep::Sweep;

#[cfg(test)]
mod tests;
