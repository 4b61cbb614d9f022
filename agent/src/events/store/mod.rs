//! The SQLite event store: one database written by the daemon and any number of shims at once.
//!
//! WAL lets readers and one writer work side by side; a busy time-out plus a retry loop makes
//! concurrent writers from several processes wait their turn instead of dropping events. Every
//! event is kept whole as JSON, and the fields queries filter on are copied into typed, indexed
//! columns.

mod integrity;
mod owner;
mod page;
mod query;
mod writer;

#[cfg(test)]
mod tests;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use rusqlite::{Connection, OptionalExtension, params, params_from_iter};
use serde::Serialize;
use thiserror::Error;

pub(crate) use integrity::{Checked, check_at_start};
pub(crate) use owner::claim;
pub(crate) use page::PAGE_BUDGET;
pub(crate) use query::EventQuery;
pub use writer::spawn_writer;
pub(crate) use writer::{Committer, StoreHealth, spawn_committing_writer};

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

/// Migrations, in order; `PRAGMA user_version` says how many have run.
const MIGRATIONS: &[&str] = &[
    "
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
",
    "
    CREATE TABLE export_cursors (
        name         TEXT    PRIMARY KEY,
        resume_after INTEGER NOT NULL,
        instance     BLOB    NOT NULL,
        updated_ns   INTEGER NOT NULL
    );
",
    // `llm_route` events: rows an older binary could not read. Nothing changes in the tables;
    // the version says the rows may hold the type, so an older binary refuses the database.
    "CREATE INDEX IF NOT EXISTS events_type_ts ON events (type, ts_ns);",
];

/// The `user_version` this build writes (and the newest it reads).
#[cfg(test)]
pub(crate) fn supported_version() -> u32 {
    MIGRATIONS.len() as u32
}

/// A connection to the event database.
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

/// Makes a database file readable by its owner only, before SQLite opens it (its `-wal` and
/// `-shm` files take the database's mode), in a directory made `0700` if it has to be made: the
/// record holds every session's tool inputs, which no other local user may read. Returns the
/// path that failed.
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
    // Made only when missing, never opened when it exists: closing any descriptor of a file
    // drops every POSIX lock this process holds on it, SQLite's included — the next connection
    // the daemon opens (the exporter's, a view's) would release the writer's shared lock, and
    // another process's client, finding no lock, would take itself for the last and delete the
    // live `-wal` file: events acknowledged after that would be lost.
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err((path.to_path_buf(), e)),
    }
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

    /// The connection, for tests that write rows no build writes.
    #[cfg(test)]
    pub(crate) fn conn_for_tests(&self) -> &Connection {
        &self.conn
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

    /// Reads events back, oldest first (newest first with [`EventQuery::newest_first`]).
    /// A row that cannot be decoded comes back as an [`Event::UnreadableRow`] in its place.
    pub fn query(&self, q: &EventQuery) -> Result<Vec<StoredEvent>, StoreError> {
        let mut out = Vec::new();
        self.scan(q, |e| {
            out.push(e);
            std::ops::ControlFlow::Continue(())
        })?;
        Ok(out)
    }

    /// [`Store::query`], one event at a time, without holding the result: `f` says when to
    /// stop. What a reader holds is then its own business (a page, a correlator's window).
    pub fn scan(
        &self,
        q: &EventQuery,
        mut f: impl FnMut(StoredEvent) -> std::ops::ControlFlow<()>,
    ) -> Result<(), StoreError> {
        let (sql, args) = q.sql(
            "id, ts_ns, type, session_id, server_id, tool_name, action, body",
            None,
        );
        let mut stmt = self.conn.prepare_cached(&sql).map_err(self.sql_err())?;
        let mut rows = stmt.query(params_from_iter(args)).map_err(self.sql_err())?;
        while let Some(row) = rows.next().map_err(self.sql_err())? {
            let id: i64 = row.get(0).map_err(self.sql_err())?;
            let event = match row.get_ref(7).map_err(self.sql_err())?.as_str() {
                Ok(body) => serde_json::from_str::<Event>(body).map_err(|e| e.to_string()),
                Err(e) => Err(format!("the body is not text: {e}")),
            };
            let event = event.unwrap_or_else(|error| unreadable(row, error));
            if f(StoredEvent { id, event }).is_break() {
                break;
            }
        }
        Ok(())
    }

    /// The time of the `n`-th event (1-based) that `q` selects in `[from_ns, to_ns)`, counting
    /// back from the newest (`newest`) or on from the oldest; `None` when there are fewer. Reads
    /// `n` index entries, not the events: a page finds its span with it.
    pub(crate) fn nth_time(
        &self,
        q: &EventQuery,
        from_ns: i64,
        to_ns: i64,
        n: usize,
        newest: bool,
    ) -> Result<Option<i64>, StoreError> {
        let q = EventQuery {
            since_ns: Some(from_ns),
            until_ns: Some(to_ns),
            limit: None,
            ..q.clone()
        };
        let order = if newest {
            format!(
                " ORDER BY ts_ns DESC LIMIT 1 OFFSET {}",
                n.saturating_sub(1)
            )
        } else {
            format!(" ORDER BY ts_ns LIMIT 1 OFFSET {}", n.saturating_sub(1))
        };
        let (sql, args) = q.sql("ts_ns", Some(&order));
        let mut stmt = self.conn.prepare_cached(&sql).map_err(self.sql_err())?;
        stmt.query_row(params_from_iter(args), |r| r.get(0))
            .optional()
            .map_err(self.sql_err())
    }

    /// Number of stored events.
    pub fn count(&self) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .map_err(self.sql_err())?;
        Ok(n as u64)
    }

    /// Where the exporter `name` goes on after a restart — it has sent everything up to this
    /// row id (0 when it never ran: it starts with the oldest event) — and this store's
    /// export identity (16 random bytes made on the first run: span ids and
    /// `service.instance.id` derive from it, so two hosts' never meet).
    pub(crate) fn export_instance(&self, name: &str) -> Result<(i64, [u8; 16]), StoreError> {
        let found: Option<(i64, Vec<u8>)> = self
            .conn
            .query_row(
                "SELECT resume_after, instance FROM export_cursors WHERE name = ?1",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(self.sql_err())?;
        if let Some((resume_after, instance)) = found
            && let Ok(instance) = <[u8; 16]>::try_from(instance.as_slice())
        {
            return Ok((resume_after, instance));
        }
        let mut instance = [0u8; 16];
        // SAFETY: getrandom writes at most the length given into the buffer we own.
        let got = unsafe { libc::getrandom(instance.as_mut_ptr().cast(), instance.len(), 0) };
        if got != instance.len() as isize {
            // Without randomness, the time and the process still tell hosts apart.
            let seed = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
            instance
                .copy_from_slice(&<sha2::Sha256 as sha2::Digest>::digest(seed.as_bytes())[..16]);
        }
        let now = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(i64::MAX);
        self.conn
            .execute(
                "INSERT INTO export_cursors (name, resume_after, instance, updated_ns)
                 VALUES (?1, 0, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE SET instance = ?2, updated_ns = ?3",
                params![name, instance.as_slice(), now],
            )
            .map_err(self.sql_err())?;
        let (resume_after,) = self
            .conn
            .query_row(
                "SELECT resume_after FROM export_cursors WHERE name = ?1",
                [name],
                |r| Ok((r.get(0)?,)),
            )
            .map_err(self.sql_err())?;
        Ok((resume_after, instance))
    }

    /// Records how far the exporter `name` got (after the collector took the events).
    pub(crate) fn set_export_cursor(
        &self,
        name: &str,
        resume_after: i64,
    ) -> Result<(), StoreError> {
        let now = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(i64::MAX);
        self.conn
            .execute(
                "UPDATE export_cursors SET resume_after = ?2, updated_ns = ?3 WHERE name = ?1",
                params![name, resume_after, now],
            )
            .map(drop)
            .map_err(self.sql_err())
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

/// What a row's indexed columns still say of an event whose body could not be decoded.
fn unreadable(row: &rusqlite::Row<'_>, error: String) -> Event {
    let text = |i: usize| row.get::<_, String>(i).unwrap_or_default();
    let ts: i64 = row.get(1).unwrap_or_default();
    Event::UnreadableRow(super::UnreadableRow {
        timestamp: chrono::DateTime::from_timestamp_nanos(ts),
        session_id: text(3),
        server_id: text(4),
        tool_name: text(5),
        action: match text(6).as_str() {
            "block" => crate::decision::Action::Block,
            _ => crate::decision::Action::Allow,
        },
        stored_type: text(2),
        error,
    })
}

/// `event` with every free-form JSON value it holds (a call's arguments, a JSON-RPC id) bounded:
/// a value past the bound would make the row unreadable to every reader (`bound.rs`).
fn bounded_event(event: &Event) -> std::borrow::Cow<'_, Event> {
    use super::bound::bounded;
    let (input, id) = match event {
        Event::McpToolCallIntercepted(e) => (e.input.as_ref(), None),
        Event::McpToolCalled(e) => (e.input.as_ref(), Some(&e.jsonrpc_id)),
        Event::McpResultInspected(e) => (None, Some(&e.jsonrpc_id)),
        Event::McpNetworkConnection(_)
        | Event::McpToolSeen(_)
        | Event::McpToolChanged(_)
        | Event::KernelAlert(_)
        | Event::LlmRoute(_)
        | Event::UnreadableRow(_) => (None, None),
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
        Event::McpResultInspected(e) => {
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

/// A time as the store's `ts_ns` column holds it. One outside what 64-bit nanoseconds reach
/// (before 1677, after 2262) is held just inside the bound on its own side, where every time
/// range the views read still finds it (`i64::MAX` itself is past every `ts_ns < until`).
pub(crate) fn time_ns(at: chrono::DateTime<chrono::Utc>) -> i64 {
    at.timestamp_nanos_opt().unwrap_or(if at.timestamp() < 0 {
        i64::MIN + 1
    } else {
        i64::MAX - 1
    })
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
            ts_ns: time_ns(keys.timestamp),
            session: keys.session,
            server: keys.server,
            tool: keys.tool,
            action: keys.action.as_str(),
        }
    }
}
