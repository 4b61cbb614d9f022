use std::time::Duration;

use super::writer::CommitError;
use super::*;
use crate::{decision::Action, events::ToolCalled};

fn called(session: &str, tool: &str, action: Action) -> Event {
    Event::McpToolCalled(ToolCalled {
        policy_revision: None,
        timestamp: chrono::Utc::now(),
        session_id: session.into(),
        server_id: "everything".into(),
        server_type: "stdio".into(),
        tool_name: tool.into(),
        jsonrpc_id: serde_json::json!(1),
        input: Some(serde_json::json!({"a": 1})),
        action,
        reason: String::new(),
        layer: "shim".into(),
    })
}

#[test]
fn a_live_filter_and_the_stored_one_agree() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&dir.path().join("events.db")).unwrap();
    let events = vec![
        called("s1", "echo", Action::Allow),
        called("s2", "echo", Action::Block),
        called("s1", "add", Action::Allow),
    ];
    store.insert(&events).unwrap();
    let queries = [
        EventQuery::default(),
        EventQuery {
            session: Some("s1".into()),
            ..Default::default()
        },
        EventQuery {
            tool: Some("echo".into()),
            action: Some("block".into()),
            ..Default::default()
        },
        EventQuery {
            types: vec!["kernel_alert".into()],
            ..Default::default()
        },
        EventQuery {
            server: Some("other".into()),
            ..Default::default()
        },
    ];
    for q in queries {
        let stored: Vec<Event> = store
            .query(&q)
            .unwrap()
            .into_iter()
            .map(|e| e.event)
            .collect();
        let live: Vec<Event> = events.iter().filter(|e| q.matches(e)).cloned().collect();
        assert_eq!(stored, live, "{q:?}");
    }
}

#[test]
fn roundtrip_and_filters() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&dir.path().join("sub/events.db")).unwrap();
    let events = vec![
        called("s1", "echo", Action::Allow),
        called("s2", "echo", Action::Block),
        called("s1", "add", Action::Allow),
    ];
    let ids = store.insert(&events).unwrap();
    assert_eq!(ids.len(), 3);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));

    let all = store.query(&EventQuery::default()).unwrap();
    assert_eq!(
        all.iter().map(|e| e.event.clone()).collect::<Vec<_>>(),
        events
    );
    let s1 = store
        .query(&EventQuery {
            session: Some("s1".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(s1.len(), 2);
    let blocked = store
        .query(&EventQuery {
            action: Some("block".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0].id, ids[1]);
    let after = store
        .query(&EventQuery {
            after_id: Some(ids[0]),
            tool: Some("add".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(after.len(), 1);
    let none = store
        .query(&EventQuery {
            types: vec!["mcp_tool_seen".into()],
            ..Default::default()
        })
        .unwrap();
    assert!(none.is_empty());
}

#[test]
fn reopening_keeps_events_and_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.db");
    Store::open(&path)
        .unwrap()
        .insert(&[called("s", "t", Action::Allow)])
        .unwrap();
    let store = Store::open(&path).unwrap();
    assert_eq!(store.count().unwrap(), 1);
    let version: u32 = store
        .conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version as usize, MIGRATIONS.len());
}

#[test]
fn refuses_a_database_from_a_newer_toolwall() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.db");
    drop(Store::open(&path).unwrap());
    Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let err = Store::open(&path)
        .err()
        .expect("newer schema refused")
        .to_string();
    assert!(
        err.contains("schema version 99") && err.contains("upgrade toolwall"),
        "{err}"
    );
}

#[tokio::test]
async fn a_commit_is_acknowledged_once_stored_and_refused_while_the_store_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.db");
    let store = Store::open(&path).unwrap();
    // Not the 10 s a busy database gets in earnest: the test's lock is not going away.
    store.conn.busy_timeout(Duration::from_millis(20)).unwrap();
    let (sink, rx) = crate::events::EventSink::channel();
    let (committed, commits) = std::sync::mpsc::sync_channel(1);
    let (writer, committer) = spawn_committing_writer(store, rx, Some(committed));
    let wait = Duration::from_secs(5);
    committer
        .commit(vec![called("s", "a", Action::Allow)], wait)
        .await
        .expect("committed");
    assert_eq!(
        Store::open(&path).unwrap().count().unwrap(),
        1,
        "on disk at the ack"
    );
    assert_eq!(commits.try_recv(), Ok(()), "the feed is told of the commit");
    assert!(committer.health().failing().is_none());

    // Another connection makes the database refuse writes: it holds the write lock.
    let mut blocker = Connection::open(&path).unwrap();
    blocker.busy_timeout(Duration::ZERO).unwrap();
    let tx = blocker
        .transaction_with_behavior(rusqlite::TransactionBehavior::Exclusive)
        .unwrap();
    let refused = committer
        .commit(
            vec![called("s", "b", Action::Allow)],
            Duration::from_secs(30),
        )
        .await;
    assert!(
        matches!(&refused, Err(CommitError::Failing(why)) if why.contains("locked")),
        "{refused:?}"
    );
    assert!(committer.health().failing().is_some(), "health says why");
    // A layer's event is kept and retried meanwhile; at the stop it is given up, counted.
    sink.emit(called("s", "c", Action::Allow));
    let health = committer.health();
    health.stop();
    drop((sink, committer));
    let written = tokio::task::spawn_blocking(move || writer.join().unwrap())
        .await
        .unwrap();
    assert_eq!(written, 1);
    assert_eq!(health.unstored(), 1);
    tx.rollback().unwrap();
    assert_eq!(
        Store::open(&path).unwrap().count().unwrap(),
        1,
        "the refused batch was not stored later"
    );
}

#[test]
fn writer_flushes_everything_before_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.db");
    let (sink, rx) = crate::events::EventSink::channel();
    let writer = spawn_writer(Store::open(&path).unwrap(), rx);
    for i in 0..10_000 {
        sink.emit(called("s", &format!("t{i}"), Action::Allow));
    }
    drop(sink);
    assert_eq!(writer.join().unwrap(), 10_000);
    assert_eq!(Store::open(&path).unwrap().count().unwrap(), 10_000);
}

/// Child mode of [`several_processes_write_one_database_and_lose_nothing`].
const CHILD_ENV: &str = "TOOLWALL_STORE_TEST_CHILD_DB";
const PER_CHILD: usize = 2_000;

#[test]
fn several_processes_write_one_database_and_lose_nothing() {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        // Child: small batches, so the processes really interleave on the write lock.
        let mut store = Store::open(Path::new(&path)).unwrap();
        let events: Vec<_> = (0..PER_CHILD)
            .map(|i| {
                called(
                    &std::process::id().to_string(),
                    &i.to_string(),
                    Action::Allow,
                )
            })
            .collect();
        for chunk in events.chunks(10) {
            store.insert(chunk).unwrap();
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.db");
    drop(Store::open(&path).unwrap());
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "events::store::tests::several_processes_write_one_database_and_lose_nothing",
                ])
                .env(CHILD_ENV, &path)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(
        store.count().unwrap(),
        4 * PER_CHILD as u64,
        "every event of every process stored"
    );
    let sessions: i64 = store
        .conn
        .query_row("SELECT count(DISTINCT session_id) FROM events", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(sessions, 4);
}

/// A second connection in the daemon's process must not open and close the database file with
/// `std::fs`: that drops SQLite's locks, and another process's ordinary client then takes
/// itself for the last one, deletes the live `-wal`, and later commits are lost.
#[test]
fn another_process_closing_the_database_loses_nothing_of_ours() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.db");
    let mut writer = Store::open(&path).unwrap();
    writer
        .insert(&[called("s", "before", Action::Allow)])
        .unwrap();
    // The daemon opens more connections as it runs (the exporter, a view).
    let reader = Store::open(&path).unwrap();
    assert_eq!(reader.count().unwrap(), 1);
    // A backup script or an admin's Python opens the file read-write and closes it.
    let script = format!(
        "import sqlite3\nc = sqlite3.connect({:?})\nc.execute('select count(*) from events').fetchall()\nc.close()\n",
        path.display().to_string()
    );
    let status = std::process::Command::new("python3")
        .args(["-c", &script])
        .status()
        .expect("python3");
    assert!(status.success());
    assert!(
        dir.path().join("events.db-wal").exists(),
        "the live write-ahead log was deleted under the writer"
    );
    writer
        .insert(&[called("s", "after", Action::Allow)])
        .unwrap();
    drop((writer, reader));
    assert_eq!(Store::open(&path).unwrap().count().unwrap(), 2);
}

/// A row of a type this build does not know, or with a damaged body, is read back in its place
/// as an unreadable row with what its columns say; the rows after it read as ever.
#[test]
fn an_undecodable_row_is_shown_in_its_place_and_the_rest_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&dir.path().join("events.db")).unwrap();
    store
        .insert(&[called("s1", "echo", Action::Allow)])
        .unwrap();
    store
        .conn
        .execute(
            "INSERT INTO events (ts_ns, type, session_id, server_id, tool_name, action, schema_version, body)
             VALUES (5, 'mcp_future_event', 's9', 'srv', 'read_file', 'block', 1, '{\"type\":\"mcp_future_event\"}'),
                    (6, 'mcp_tool_called', 's9', 'srv', 'echo', 'allow', 1, '{\"type\":\"mcp_tool_called\",')",
            [],
        )
        .unwrap();
    store.insert(&[called("s1", "add", Action::Allow)]).unwrap();
    let read = store
        .query(&EventQuery::default())
        .expect("a bad row fails no read");
    let kinds: Vec<_> = read.iter().map(|e| e.event.kind()).collect();
    assert_eq!(
        kinds,
        [
            "mcp_tool_called",
            "unreadable_row",
            "unreadable_row",
            "mcp_tool_called"
        ]
    );
    let Event::UnreadableRow(row) = &read[1].event else {
        unreachable!()
    };
    assert_eq!(
        (
            row.stored_type.as_str(),
            row.session_id.as_str(),
            row.tool_name.as_str()
        ),
        ("mcp_future_event", "s9", "read_file")
    );
    assert_eq!(row.action, Action::Block);
    assert!(row.error.contains("unknown variant"), "{}", row.error);
    let Event::UnreadableRow(row) = &read[2].event else {
        unreachable!()
    };
    assert!(row.error.contains("EOF"), "{}", row.error);
}

/// Every free-form JSON value an event holds goes through the record's bound, the JSON-RPC id
/// a result inspection names included: 126 levels deep, it would make the row unreadable.
#[test]
fn a_deep_id_of_a_result_inspection_is_stored_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&dir.path().join("events.db")).unwrap();
    let mut id = serde_json::json!(1);
    for _ in 0..126 {
        id = serde_json::json!([id]);
    }
    let event = Event::McpResultInspected(crate::events::ResultInspected {
        policy_revision: None,
        timestamp: chrono::Utc::now(),
        session_id: "s".into(),
        server_id: "srv".into(),
        server_type: "stdio".into(),
        tool_name: "get-env".into(),
        jsonrpc_id: id,
        action: Action::Allow,
        inspection: crate::decision::ResultAction::Alert,
        findings: Vec::new(),
        findings_total: 0,
        reason: "secret in the result".into(),
        layer: "shim".into(),
    });
    store.insert(&[event]).unwrap();
    let read = store.query(&EventQuery::default()).unwrap();
    let Event::McpResultInspected(e) = &read[0].event else {
        panic!("read back whole: {:?}", read[0].event.kind())
    };
    assert!(
        crate::events::bound::is_marker(&e.jsonrpc_id),
        "{}",
        e.jsonrpc_id
    );
}
