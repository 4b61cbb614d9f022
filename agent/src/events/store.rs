//! The SQLite event store: one database written by the daemon and any number of shims at once.
//!
//! WAL lets readers and one writer work side by side; a busy time-out plus a retry loop makes
//! concurrent writers from several processes wait their turn instead of dropping events. Every
//! event is kept whole as JSON, and the fields queries filter on are copied into typed, indexed
//! columns.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use rusqlite::{Connection, OptionalExtension, params, params_from_iter, types::Value as SqlValue};
use serde::Serialize;
use thiserror::Error;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::{Event, SCHEMA_VERSION};

/// Why the store failed; says which database.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The directory for the database could not be made.
    #[error("make {path} private to its owner: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// SQLite failed.
    #[error("event database {path}: {source}")]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// The database was written by a newer toolwall.
    #[error(
        "event database {path} has schema version {found}, newer than this toolwall's {supported}; upgrade toolwall"
    )]
    TooNew {
        /// The database file.
        path: PathBuf,
        /// Its version.
        found: u32,
        /// Ours.
        supported: u32,
    },
    /// A stored row could not be decoded.
    #[error("event database {path}: row {id} is not a valid event: {source}")]
    Decode {
        /// The database file.
        path: PathBuf,
        /// The row id.
        id: i64,
        /// The JSON error.
        source: serde_json::Error,
    },
}

/// An event as stored: with its row id (the order of the store) and receive time.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct StoredEvent {
    /// Row id, increasing; `--follow` resumes after the last one seen.
    pub id: i64,
    /// The event.
    #[serde(flatten)]
    pub event: Event,
}

/// What to read back; every field narrows the result.
#[derive(Clone, Debug, Default)]
pub struct EventQuery {
    /// Only these types (empty = all).
    pub types: Vec<String>,
    /// Only this session.
    pub session: Option<String>,
    /// Only this server.
    pub server: Option<String>,
    /// Only this tool.
    pub tool: Option<String>,
    /// Only this action (`allow` / `block`).
    pub action: Option<String>,
    /// Only events at or after this time (unix ns).
    pub since_ns: Option<i64>,
    /// Only rows after this id.
    pub after_id: Option<i64>,
    /// At most this many rows (oldest first).
    pub limit: Option<usize>,
}

impl EventQuery {
    /// Whether an event passes the type, session, server, tool and action filters (the store
    /// applies the same ones in SQL; a live follower applies them here).
    pub fn matches(&self, event: &Event) -> bool {
        let keys = event.keys();
        (self.types.is_empty() || self.types.iter().any(|t| t == event.kind()))
            && self.session.as_deref().is_none_or(|s| s == keys.session)
            && self.server.as_deref().is_none_or(|s| s == keys.server)
            && self.tool.as_deref().is_none_or(|t| t == keys.tool)
            && self
                .action
                .as_deref()
                .is_none_or(|a| a == keys.action.as_str())
    }
}

/// Migrations, in order; `PRAGMA user_version` says how many have run.
const MIGRATIONS: &[&str] = &["
    CREATE TABLE events (
        id             INTEGER PRIMARY KEY AUTOINCREMENT,
        ts_ns          INTEGER NOT NULL,
        type           TEXT    NOT NULL,
        session_id     TEXT    NOT NULL,
        server_id      TEXT    NOT NULL,
        tool_name      TEXT    NOT NULL,
        action         TEXT    NOT NULL,
        schema_version INTEGER NOT NULL,
        body           TEXT    NOT NULL
    );
    CREATE INDEX events_ts ON events (ts_ns);
    CREATE INDEX events_type_ts ON events (type, ts_ns);
    CREATE INDEX events_session_ts ON events (session_id, ts_ns);
    CREATE INDEX events_server_tool_ts ON events (server_id, tool_name, ts_ns);
"];

/// A connection to the event database.
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

/// Makes a database file readable by its owner only, before SQLite opens it (its `-wal` and
/// `-shm` files take the database's mode), in a directory made `0700` if it has to be made: the
/// record holds every session's tool inputs, and `/health` once told every session where it was
/// (issue 15.6). Returns the path that failed.
fn prepare_private(path: &Path) -> Result<(), (PathBuf, std::io::Error)> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| (dir.to_path_buf(), e))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| (path.to_path_buf(), e))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for suffix in ["", "-wal", "-shm"] {
        use std::os::unix::fs::MetadataExt;
        let file = PathBuf::from(format!("{}{suffix}", path.display()));
        // Another user's database (a view opened with `--db`) is left as it is.
        if let Ok(meta) = std::fs::metadata(&file)
            && meta.uid() == me
            && meta.mode() & 0o777 != 0o600
        {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| (file, e))?;
        }
    }
    Ok(())
}

/// Why [`connect`] failed.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// The file or its directory could not be made the owner's alone.
    Private(PathBuf, std::io::Error),
    /// SQLite refused.
    Sqlite(rusqlite::Error),
}

/// The one way the database is opened, by the event store and the registry alike (they share
/// the file): owner-only ([`prepare_private`]), WAL so readers never wait for the writer, a
/// 10 s busy time-out so writers in several processes wait for each other rather than fail,
/// and `synchronous = NORMAL` (WAL makes that durable across a process crash).
pub(crate) fn connect(path: &Path) -> Result<Connection, OpenError> {
    prepare_private(path).map_err(|(path, e)| OpenError::Private(path, e))?;
    let conn = Connection::open(path).map_err(OpenError::Sqlite)?;
    conn.busy_timeout(Duration::from_secs(10))
        .map_err(OpenError::Sqlite)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(OpenError::Sqlite)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(OpenError::Sqlite)?;
    Ok(conn)
}

impl Store {
    /// Opens (creating if needed) the database and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = connect(path).map_err(|e| match e {
            OpenError::Private(path, source) => StoreError::Dir { path, source },
            OpenError::Sqlite(source) => StoreError::Sqlite {
                path: path.to_path_buf(),
                source,
            },
        })?;
        let mut store = Self {
            conn,
            path: path.to_path_buf(),
        };
        store.migrate()?;
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sql_err(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        let path = self.path.clone();
        let sql = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        // Take the write lock first so two processes opening a new file don't both migrate.
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        let version: u32 = tx
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(sql)?;
        if version as usize > MIGRATIONS.len() {
            return Err(StoreError::TooNew {
                path: path.clone(),
                found: version,
                supported: MIGRATIONS.len() as u32,
            });
        }
        for (i, migration) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            tx.execute_batch(migration).map_err(sql)?;
            tx.pragma_update(None, "user_version", (i + 1) as u32)
                .map_err(sql)?;
        }
        tx.commit().map_err(sql)
    }

    /// Inserts a batch in one transaction; returns the row ids, in order.
    pub fn insert(&mut self, events: &[Event]) -> Result<Vec<i64>, StoreError> {
        let path = self.path.clone();
        let sql = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        let mut stored = Vec::with_capacity(events.len());
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO events (ts_ns, type, session_id, server_id, tool_name, action, schema_version, body)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )
                .map_err(sql)?;
            for event in events {
                let cols = Columns::of(event);
                // Only what every reader can read back enters the record (`bound.rs`).
                let event = &bounded_event(event);
                let body = serde_json::to_string(event).expect("events always serialize");
                stmt.execute(params![
                    cols.ts_ns,
                    event.kind(),
                    cols.session,
                    cols.server,
                    cols.tool,
                    cols.action,
                    SCHEMA_VERSION,
                    body
                ])
                .map_err(sql)?;
                stored.push(tx.last_insert_rowid());
            }
        }
        tx.commit().map_err(sql)?;
        Ok(stored)
    }

    /// Reads events back, oldest first.
    pub fn query(&self, q: &EventQuery) -> Result<Vec<StoredEvent>, StoreError> {
        let mut sql = String::from("SELECT id, body FROM events WHERE 1=1");
        let mut args: Vec<SqlValue> = Vec::new();
        if !q.types.is_empty() {
            sql += &format!(" AND type IN ({})", vec!["?"; q.types.len()].join(","));
            args.extend(q.types.iter().cloned().map(SqlValue::Text));
        }
        for (column, value) in [
            ("session_id", &q.session),
            ("server_id", &q.server),
            ("tool_name", &q.tool),
            ("action", &q.action),
        ] {
            if let Some(v) = value {
                sql += &format!(" AND {column} = ?");
                args.push(SqlValue::Text(v.clone()));
            }
        }
        if let Some(since) = q.since_ns {
            sql += " AND ts_ns >= ?";
            args.push(SqlValue::Integer(since));
        }
        if let Some(after) = q.after_id {
            sql += " AND id > ?";
            args.push(SqlValue::Integer(after));
        }
        sql += " ORDER BY id";
        if let Some(limit) = q.limit {
            sql += &format!(" LIMIT {limit}");
        }
        let mut stmt = self.conn.prepare_cached(&sql).map_err(self.sql_err())?;
        let rows = stmt
            .query_map(params_from_iter(args), |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(self.sql_err())?;
        let mut out = Vec::new();
        for row in rows {
            let (id, body) = row.map_err(self.sql_err())?;
            let event = serde_json::from_str(&body).map_err(|source| StoreError::Decode {
                path: self.path.clone(),
                id,
                source,
            })?;
            out.push(StoredEvent { id, event });
        }
        Ok(out)
    }

    /// Number of stored events.
    pub fn count(&self) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .map_err(self.sql_err())?;
        Ok(n as u64)
    }

    /// The highest row id, if any.
    pub fn last_id(&self) -> Result<Option<i64>, StoreError> {
        self.conn
            .query_row("SELECT max(id) FROM events", [], |r| r.get(0))
            .optional()
            .map(Option::flatten)
            .map_err(self.sql_err())
    }
}

/// `event` with its free-form JSON values (a call's arguments, a JSON-RPC id) bounded.
fn bounded_event(event: &Event) -> std::borrow::Cow<'_, Event> {
    use super::bound::bounded;
    let (input, id) = match event {
        Event::McpToolCallIntercepted(e) => (e.input.as_ref(), None),
        Event::McpToolCalled(e) => (e.input.as_ref(), Some(&e.jsonrpc_id)),
        _ => (None, None),
    };
    let new_input = input.and_then(bounded);
    let new_id = id.and_then(bounded);
    if new_input.is_none() && new_id.is_none() {
        return std::borrow::Cow::Borrowed(event);
    }
    let mut event = event.clone();
    match &mut event {
        Event::McpToolCallIntercepted(e) => e.input = new_input.or(e.input.take()),
        Event::McpToolCalled(e) => {
            e.input = new_input.or(e.input.take());
            if let Some(id) = new_id {
                e.jsonrpc_id = id;
            }
        }
        _ => {}
    }
    tracing::warn!(
        kind = event.kind(),
        "an event value was too deep or too large: stored as a marker with its hash"
    );
    std::borrow::Cow::Owned(event)
}

/// The typed columns of an event.
struct Columns<'a> {
    ts_ns: i64,
    session: &'a str,
    server: &'a str,
    tool: &'a str,
    action: &'static str,
}

impl<'a> Columns<'a> {
    fn of(event: &'a Event) -> Self {
        let keys = event.keys();
        Columns {
            ts_ns: keys.timestamp.timestamp_nanos_opt().unwrap_or(i64::MAX),
            session: keys.session,
            server: keys.server,
            tool: keys.tool,
            action: keys.action.as_str(),
        }
    }
}

/// Largest batch written in one transaction.
const MAX_BATCH: usize = 4096;

/// How the store is doing, shared by the writer and whoever reports on it (`/health`).
#[derive(Debug, Default)]
pub struct StoreHealth {
    /// Why the last write failed, until one succeeds.
    failing: std::sync::Mutex<Option<String>>,
    /// Set when the daemon stops: a write that keeps failing is then given up.
    stopping: AtomicBool,
    /// Events given up on at shutdown.
    unstored: AtomicU64,
}

impl StoreHealth {
    /// Why the store cannot write now; `None` when its last write succeeded.
    pub fn failing(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Events the writer gave up on at shutdown (the disk kept failing).
    pub fn unstored(&self) -> u64 {
        self.unstored.load(Ordering::Relaxed)
    }

    /// From now on a write that keeps failing is given up after a few tries, so that the
    /// daemon's stop does not wait on a full disk for ever.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// A failing store, for tests of what the layers do then.
    #[cfg(test)]
    pub(crate) fn set_failing_for_test(&self, why: &str) {
        self.set(Some(why.to_owned()));
    }

    /// Records the outcome of a write; true when it changed (failing ↔ writing).
    fn set(&self, failing: Option<String>) -> bool {
        let mut now = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        let changed = now.is_some() != failing.is_some();
        *now = failing;
        changed
    }
}

/// Why a commit was not acknowledged.
#[derive(Debug, Error)]
pub enum CommitError {
    /// The database refused the write (disk full, read-only, ...); nothing of it was stored.
    #[error("the event store cannot write ({0}); nothing of this batch was stored")]
    Failing(String),
    /// No answer in time; the batch may still be stored later.
    #[error("the event store did not commit within {0:?}")]
    TimedOut(Duration),
    /// The writer is gone (the daemon is stopping).
    #[error("the event store is closed")]
    Closed,
}

/// Told when a durable batch committed, or why it did not.
type Ack = oneshot::Sender<Result<(), String>>;

/// A batch whose sender waits until the transaction holding it committed (or failed).
#[derive(Debug)]
struct Durable {
    events: Vec<Event>,
    done: Ack,
}

/// The writer's second door: batches acknowledged only once committed (the API's
/// `POST /api/events` answers 202 after that, 503 when the disk refuses), and its health.
#[derive(Clone, Debug)]
pub struct Committer {
    tx: mpsc::UnboundedSender<Durable>,
    health: Arc<StoreHealth>,
}

impl Committer {
    /// Stores `events` in one transaction and waits, at most `within`, until it committed.
    pub async fn commit(&self, events: Vec<Event>, within: Duration) -> Result<(), CommitError> {
        if let Some(reason) = self.health.failing() {
            return Err(CommitError::Failing(reason));
        }
        let (done, answer) = oneshot::channel();
        self.tx
            .send(Durable { events, done })
            .map_err(|_| CommitError::Closed)?;
        match tokio::time::timeout(within, answer).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(reason))) => Err(CommitError::Failing(reason)),
            Ok(Err(_)) => Err(CommitError::Closed),
            Err(_) => Err(CommitError::TimedOut(within)),
        }
    }

    /// The store's health (a handle that does not keep the writer open, unlike the committer).
    pub fn health(&self) -> Arc<StoreHealth> {
        self.health.clone()
    }
}

/// Runs the single writer: drains the channel in batches until every sender is gone, then
/// returns (so joining the thread after dropping the sinks means every event is on disk).
///
/// A failed write is retried (another process may hold the lock past the busy time-out); events
/// are never dropped.
pub fn spawn_writer(
    store: Store,
    rx: mpsc::UnboundedReceiver<Event>,
    live: broadcast::Sender<StoredEvent>,
) -> thread::JoinHandle<u64> {
    spawn_committing_writer(store, rx, live).0
}

/// [`spawn_writer`], with a [`Committer`] for batches that wait for their commit.
///
/// A failing write marks the store failing (its health says why) and answers the waiting
/// batches in it at once (their senders get an error and keep their events; nothing of them is
/// stored later, so a retry cannot store twice); the layers' events are retried with back-off
/// until the disk takes them, or given up after a few tries once [`StoreHealth::stop`] was
/// called (counted in [`StoreHealth::unstored`] and logged).
pub fn spawn_committing_writer(
    mut store: Store,
    mut rx: mpsc::UnboundedReceiver<Event>,
    live: broadcast::Sender<StoredEvent>,
) -> (thread::JoinHandle<u64>, Committer) {
    let (durable_tx, mut durable_rx) = mpsc::unbounded_channel::<Durable>();
    let health = Arc::new(StoreHealth::default());
    let committer = Committer {
        tx: durable_tx,
        health: health.clone(),
    };
    let writer = thread::Builder::new()
        .name("event-writer".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a current-thread runtime for the event writer");
            runtime.block_on(async move {
                let mut written = 0u64;
                let mut batch = Vec::with_capacity(MAX_BATCH);
                // (start, length in the batch, who waits) of each durable batch in it.
                let mut waiting: Vec<(usize, usize, Ack)> = Vec::new();
                let (mut events_open, mut durable_open) = (true, true);
                while events_open || durable_open {
                    let mut take = |durable: Durable, batch: &mut Vec<Event>| {
                        waiting.push((batch.len(), durable.events.len(), durable.done));
                        batch.extend(durable.events);
                    };
                    tokio::select! {
                        event = rx.recv(), if events_open => match event {
                            Some(event) => batch.push(event),
                            None => events_open = false,
                        },
                        durable = durable_rx.recv(), if durable_open => match durable {
                            Some(durable) => take(durable, &mut batch),
                            None => durable_open = false,
                        },
                    }
                    while batch.len() < MAX_BATCH {
                        match durable_rx.try_recv() {
                            Ok(durable) => take(durable, &mut batch),
                            Err(_) => break,
                        }
                    }
                    while batch.len() < MAX_BATCH {
                        match rx.try_recv() {
                            Ok(event) => batch.push(event),
                            Err(_) => break,
                        }
                    }
                    if batch.is_empty() {
                        continue;
                    }
                    let mut tries = 0u32;
                    let ids = loop {
                        match store.insert(&batch) {
                            Ok(ids) => {
                                if health.set(None) {
                                    tracing::warn!("the event store writes again");
                                }
                                break ids;
                            }
                            Err(error) => {
                                let reason = error.to_string();
                                if health.set(Some(reason.clone())) {
                                    tracing::error!(%error, pending = batch.len(), "the event store cannot write; batches posted to the API are refused (503) until it can, the layers' events are kept and retried");
                                }
                                // Answered now; their events leave the batch (latest first, so
                                // the earlier ranges stay where they are).
                                for (start, len, done) in waiting.drain(..).rev() {
                                    batch.drain(start..start + len);
                                    let _ = done.send(Err(reason.clone()));
                                }
                                tries += 1;
                                if batch.is_empty() {
                                    break Vec::new();
                                }
                                if health.stopping.load(Ordering::Relaxed) && tries >= 3 {
                                    health
                                        .unstored
                                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                                    tracing::error!(%error, events = batch.len(), "stopping: events given up, the store cannot write them");
                                    batch.clear();
                                    break Vec::new();
                                }
                                let backoff = Duration::from_millis(100 << tries.min(4));
                                tokio::time::sleep(backoff).await;
                            }
                        }
                    };
                    for (_, _, done) in waiting.drain(..) {
                        let _ = done.send(Ok(()));
                    }
                    written += ids.len() as u64;
                    for (id, event) in ids.into_iter().zip(batch.drain(..)) {
                        // No follower is fine; a lagging follower re-reads from the store.
                        let _ = live.send(StoredEvent { id, event });
                    }
                }
                written
            })
        })
        .expect("spawn the event writer thread");
    (writer, committer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decision::Action, events::ToolCalled};

    fn called(session: &str, tool: &str, action: Action) -> Event {
        Event::McpToolCalled(ToolCalled {
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
        let (live, _) = broadcast::channel(16);
        let (writer, committer) = spawn_committing_writer(store, rx, live);
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
        let (live, mut follower) = broadcast::channel(16);
        let writer = spawn_writer(Store::open(&path).unwrap(), rx, live);
        for i in 0..10_000 {
            sink.emit(called("s", &format!("t{i}"), Action::Allow));
        }
        drop(sink);
        assert_eq!(writer.join().unwrap(), 10_000);
        assert_eq!(Store::open(&path).unwrap().count().unwrap(), 10_000);
        // The follower got the live stream; having fallen behind a 16-slot channel it is told
        // exactly how many it missed (it can re-read them from the store), then gets the rest.
        assert_eq!(
            follower.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(10_000 - 16))
        );
        assert_eq!(follower.try_recv().unwrap().id, 10_000 - 16 + 1);
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
                    .args(["--exact", "events::store::tests::several_processes_write_one_database_and_lose_nothing"])
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
}
