//! Floods and mixes: many connections around few calls, one instant or many, joined as they
//! happened with the open set bounded, and the index changing no result against a plain scan.

use super::*;

/// `e` moved `us` microseconds later.
fn later(mut e: StoredEvent, us: i64) -> StoredEvent {
    let d = Duration::microseconds(us);
    match &mut e.event {
        Event::McpToolCallIntercepted(x) => x.timestamp += d,
        Event::McpToolCalled(x) => x.timestamp += d,
        Event::McpNetworkConnection(x) => x.timestamp += d,
        _ => {}
    }
    e
}

/// `e` in another session or server (and the model's name for the tool to match).
fn rekey(mut e: StoredEvent, session: &str, server: &str) -> StoredEvent {
    match &mut e.event {
        Event::McpToolCallIntercepted(x) => {
            x.tool_name = x.tool_name.replacen("__srv__", &format!("__{server}__"), 1);
            (x.session_id, x.server_id) = (session.into(), server.into());
        }
        Event::McpToolCalled(x) => (x.session_id, x.server_id) = (session.into(), server.into()),
        Event::McpNetworkConnection(x) => {
            (x.session_id, x.server_id) = (session.into(), server.into());
        }
        _ => {}
    }
    e
}

const FLOOD: i64 = 200_000;
/// When the calls among the flood start, µs: off the flood's 500 µs grid.
const CALLS_AT: [i64; 5] = [10_000_250, 30_000_250, 50_000_250, 70_000_250, 90_000_250];

/// 200,000 kernel connections of one session and server, one every 0.5 ms over 100 s, and among
/// them five calls, each an intercept, a connection 50 µs before it (nearer than the flood's)
/// and the execution 2 ms after, in time order.
fn flood() -> Vec<StoredEvent> {
    let mut timeline: Vec<(i64, StoredEvent)> = (0..FLOOD)
        .map(|i| (i * 500, later(connection(i + 1, 0), i * 500)))
        .collect();
    for (k, &at) in CALLS_AT.iter().enumerate() {
        let id = 1_000_000 + 10 * k as i64;
        let args = json!({"k": k});
        timeline.push((at - 50, later(connection(id, 0), at - 50)));
        timeline.push((
            at,
            later(
                intercept(id + 1, 0, "echo", args.clone(), Action::Allow),
                at,
            ),
        ));
        timeline.push((
            at + 2_000,
            later(called(id + 2, 0, "echo", args), at + 2_000),
        ));
    }
    timeline.sort_by_key(|(us, _)| *us);
    timeline.into_iter().map(|(_, e)| e).collect()
}

#[test]
fn a_flood_of_connections_still_joins_every_call_with_its_own_connection() {
    let events = flood();
    let records = run(&events);
    let calls: Vec<_> = records
        .iter()
        .filter(|r| r.kind != RecordKind::ConnectionOnly)
        .collect();
    let ids = |r: &CallRecord| {
        [&r.connection, &r.intercept, &r.execution].map(|s| s.as_ref().map(|s| s.event_id))
    };
    let got: Vec<_> = calls.iter().map(|r| (r.kind, ids(r))).collect();
    let want: Vec<_> = (0..CALLS_AT.len() as i64)
        .map(|k| {
            let id = 1_000_000 + 10 * k;
            (RecordKind::Joined, [Some(id), Some(id + 1), Some(id + 2)])
        })
        .collect();
    assert_eq!(got, want);
    let connection_only = records.len() - calls.len();
    assert_eq!(
        connection_only as i64, FLOOD,
        "every other connection on its own"
    );
    assert_eq!(3 * calls.len() + connection_only, events.len());
    assert!(
        records.is_sorted_by_key(CallRecord::first_seen),
        "by first sighting"
    );
}

#[test]
fn a_batch_keeps_only_a_few_windows_of_records_open() {
    let events = flood();
    let mut c = Correlator::new(std::time::Duration::from_secs(2), hash);
    let records = c.run(&events);
    assert_eq!(records.len() as i64, FLOOD + CALLS_AT.len() as i64);
    // 2,000 connections a second: two windows of slack are 8,000 open, and a quarter more
    // between sweeps. Without closing as it went, all 200,000 were open at the end.
    assert!(
        c.peak < events.len() / 10,
        "at most {} of {} events' records open at once",
        c.peak,
        events.len()
    );
    assert!(c.peak > 4_000, "the window's records stay open: {}", c.peak);
    assert_eq!(
        (c.len, c.open.len()),
        (0, 0),
        "nothing left, not even a key"
    );
}

/// A mixed stream: two sessions and two servers, two tools, few argument values, blocked calls
/// and connections, ties in time, and events up to half a window out of time order.
fn mixed(seed: u64, n: usize) -> Vec<StoredEvent> {
    let mut rand = xorshift(seed);
    let mut clock = 0i64;
    (1..=n as i64)
        .map(|id| {
            // On a 10 ms grid, so records are as near before as after, or as near as each other.
            clock += [0, 0, 10, 20, 100, 300, 900][rand(7) as usize];
            let ms = clock + 10 * (rand(100) as i64 - 50);
            let tool = ["a", "b"][rand(2) as usize];
            let args = json!({"n": rand(3)});
            let e = match rand(20) {
                0 => intercept(id, ms, tool, args, Action::Block),
                1..=6 => intercept(id, ms, tool, args, Action::Allow),
                7..=12 => called(id, ms, tool, args),
                _ => {
                    let mut e = connection(id, ms);
                    if let Event::McpNetworkConnection(c) = &mut e.event
                        && rand(10) == 0
                    {
                        c.action = Action::Block;
                    }
                    e
                }
            };
            rekey(
                e,
                ["s", "t"][rand(2) as usize],
                ["srv", "other"][rand(2) as usize],
            )
        })
        .collect()
}

/// The indexed correlator, closing as it goes, gives exactly what the linear search gave, in
/// a batch and live (records closed at each `expire`, in the same order).
#[test]
fn the_index_changes_no_result() {
    let window = std::time::Duration::from_secs(2);
    for seed in 0..20 {
        let events = mixed(seed, 1_500);
        let want = reference::Linear::batch(window, hash, &events);
        assert_eq!(run(&events), want, "batch, seed {seed}");

        let (mut new, mut old) = (
            Correlator::new(window, hash),
            reference::Linear::new(window, hash),
        );
        for (i, e) in events.iter().enumerate() {
            assert_eq!(new.push(e), old.push(e), "push, seed {seed}");
            if i % 50 == 0
                && let Event::McpNetworkConnection(c) = &e.event
            {
                let now = c.timestamp;
                assert_eq!(new.expire(now), old.expire(now), "expire, seed {seed}");
            }
        }
        assert_eq!(new.flush(), old.flush(), "flush, seed {seed}");
        assert_eq!((new.len, new.open.len()), (0, 0));
    }
}
