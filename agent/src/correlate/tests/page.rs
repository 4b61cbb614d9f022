//! Pages read from a store against the whole store correlated at once: every page, either way,
//! any size, with or without filters, holds exactly the calls the whole store has there, joined
//! the same way, each once.

use super::super::page::{Direction, Key, PageQuery, read_page};
use super::*;
use crate::events::{EventQuery, Store};

/// A store of calls in bursts over a minute, two sessions and two tools, some blocked, some
/// rogue, some with their kernel connection, some rows unreadable.
fn store() -> (tempfile::TempDir, Store, Vec<StoredEvent>) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&dir.path().join("events.db")).unwrap();
    let mut rand = xorshift(0x2545_F491_4F6C_DD1D);
    let mut timeline: Vec<(i64, Event)> = Vec::new();
    for burst in 0..120i64 {
        for k in 0..6i64 {
            let start = burst * 500 + k * 15 + rand(7) as i64;
            let tool = if k % 3 == 0 { "echo" } else { "add" };
            let session = if burst % 2 == 0 { "s" } else { "t" };
            let mut with = |mut e: StoredEvent, ms: i64| {
                match &mut e.event {
                    Event::McpToolCallIntercepted(x) => x.session_id = session.into(),
                    Event::McpToolCalled(x) => x.session_id = session.into(),
                    Event::McpNetworkConnection(x) => x.session_id = session.into(),
                    _ => {}
                }
                timeline.push((ms, e.event));
            };
            let args = json!({"n": k % 2});
            match rand(12) {
                0 => with(intercept(0, start, tool, args, Action::Block), start),
                1 => with(called(0, start, tool, json!({"n": 99})), start),
                2 => with(connection(0, start), start),
                _ => {
                    let done = start + 10 + rand(30) as i64;
                    if rand(3) == 0 {
                        with(connection(0, start - 2), start - 2);
                    }
                    with(
                        intercept(0, start, tool, args.clone(), Action::Allow),
                        start,
                    );
                    with(called(0, done, tool, args), done);
                }
            }
        }
    }
    timeline.sort_by_key(|(ms, _)| *ms);
    let events: Vec<Event> = timeline.into_iter().map(|(_, e)| e).collect();
    store.insert(&events).unwrap();
    // Two rows this build cannot read, among the calls.
    for ms in [7_000i64, 31_000] {
        let ts = t(ms).timestamp_nanos_opt().unwrap();
        store
            .conn_for_tests()
            .execute(
                "INSERT INTO events (ts_ns, type, session_id, server_id, tool_name, action, schema_version, body)
                 VALUES (?1, 'mcp_tool_called', 's', 'srv', 'add', 'allow', 1, '{')",
                [ts],
            )
            .unwrap();
    }
    let all = store.query(&EventQuery::default()).unwrap();
    (dir, store, all)
}

fn window() -> std::time::Duration {
    std::time::Duration::from_secs(2)
}

/// Every record in order, and one page after another until the end, either way.
fn walk(
    store: &Store,
    filters: &EventQuery,
    limit: usize,
    direction: Direction,
) -> Vec<CallRecord> {
    let mut q = PageQuery {
        filters: filters.clone(),
        limit,
        direction,
        cursor: None,
    };
    let mut pages = Vec::new();
    for _ in 0..10_000 {
        let page = read_page(store, &q, window()).unwrap();
        assert!(page.records.len() <= limit);
        assert!(
            page.records
                .windows(2)
                .all(|w| Key::of(&w[0]) < Key::of(&w[1]))
        );
        pages.push(page.records);
        match page.next {
            Some(next) => q.cursor = Some(next),
            None => break,
        }
    }
    if direction == Direction::Older {
        pages.reverse();
    }
    pages.into_iter().flatten().collect()
}

#[test]
fn pages_hold_what_the_whole_store_holds() {
    let (_dir, store, all) = store();
    let whole = {
        let mut records = Correlator::batch(window(), crate::registry::value_hash, &all);
        records.sort_by_key(Key::of);
        records
    };
    assert!(whole.iter().any(|r| r.kind == RecordKind::Joined));
    assert!(whole.iter().any(|r| r.tool.starts_with("unreadable row")));
    let filters = [
        EventQuery::default(),
        EventQuery {
            session: Some("t".into()),
            ..Default::default()
        },
        EventQuery {
            tool: Some("echo".into()),
            action: Some("allow".into()),
            ..Default::default()
        },
        EventQuery {
            since_ns: t(20_000).timestamp_nanos_opt(),
            until_ns: t(41_000).timestamp_nanos_opt(),
            ..Default::default()
        },
    ];
    for f in &filters {
        let expected: Vec<&CallRecord> = whole
            .iter()
            .filter(|r| {
                let at = Key::of(r);
                r.matches(f)
                    && f.since_ns.is_none_or(|s| at >= Key::of_time(s))
                    && f.until_ns.is_none_or(|u| at < Key::of_time(u))
            })
            .collect();
        for limit in [3, 7, 50, 5000] {
            for direction in [Direction::Older, Direction::Newer] {
                let got = walk(&store, f, limit, direction);
                let got: Vec<&CallRecord> = got.iter().collect();
                assert_eq!(
                    got.len(),
                    expected.len(),
                    "{f:?} limit {limit} {direction:?}"
                );
                let calls = |rs: &[&CallRecord]| -> Vec<_> {
                    rs.iter()
                        .map(|r| {
                            (
                                Key::of(r),
                                r.kind,
                                r.intercept.as_ref().map(|s| s.event_id),
                                r.execution.as_ref().map(|s| s.event_id),
                            )
                        })
                        .collect()
                };
                assert_eq!(
                    calls(&got),
                    calls(&expected),
                    "{f:?} limit {limit} {direction:?}"
                );
            }
        }
    }
}

/// Calls dated where 64-bit nanoseconds do not reach (before 1677, after 2262) are stored just
/// inside the bound on their side, so every page still finds them.
#[test]
fn calls_dated_past_the_nanosecond_range_are_on_a_page() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&dir.path().join("events.db")).unwrap();
    let mut events = Vec::new();
    for (i, year) in [(1, 1600), (2, 2300), (3, 99_999)] {
        let mut e = intercept(i, 0, "add", json!({"i": i}), Action::Allow).event;
        if let Event::McpToolCallIntercepted(x) = &mut e {
            x.timestamp = chrono::NaiveDate::from_ymd_opt(year, 1, 1)
                .and_then(|d| d.and_hms_opt(0, 0, 0))
                .unwrap()
                .and_utc();
        }
        events.push(e);
    }
    store.insert(&events).unwrap();
    for direction in [Direction::Older, Direction::Newer] {
        let got = walk(&store, &EventQuery::default(), 2, direction);
        assert_eq!(got.len(), 3, "{direction:?}: {got:?}");
    }
}
