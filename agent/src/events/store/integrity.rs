//! The store's integrity check at the daemon's start: a database whose pages are damaged can
//! still open and answer `PRAGMA user_version`, then fail every read, while `/health` said `ok`.
//! The daemon checks it first (`PRAGMA integrity_check`, bounded in time: a big file is checked
//! as far as the bound allows and said so), and sets a damaged one aside — renamed with its
//! `-wal` and `-shm`, never deleted, under a name no earlier set-aside has — so that it starts on
//! a fresh one, saying so in the log and in `/health`. `integrity_check`, not `quick_check`: an
//! index that disagrees with its table passes the quick check and hides rows from the views
//! (`an_index_that_disagrees_with_its_table_is_damage`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{OpenError, StoreError, connect};

/// What the check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Checked {
    /// No database yet, or `integrity_check` said `ok`.
    Sound,
    /// The bound ran out first: what was checked is sound.
    Unfinished(Duration),
    /// Damaged: moved to `to` (with its `-wal` and `-shm`), for why.
    SetAside { to: PathBuf, why: String },
}

impl Checked {
    /// What `/health` says of it.
    pub(crate) fn describe(&self) -> String {
        match self {
            Checked::Sound => "ok".into(),
            Checked::Unfinished(bound) => {
                format!("checked as far as {bound:?} allowed at start: no damage found")
            }
            Checked::SetAside { to, why } => format!(
                "damaged at start ({why}): set aside as {}, a fresh store was started",
                to.display()
            ),
        }
    }
}

/// Checks the database at `path` within `bound`; sets it aside when damaged.
pub(crate) fn check_at_start(path: &Path, bound: Duration) -> Result<Checked, StoreError> {
    if !path.exists() {
        return Ok(Checked::Sound);
    }
    let found = match integrity_check(path, bound) {
        Ok(found) => found,
        Err(OpenError::Private(path, source)) => return Err(StoreError::Dir { path, source }),
        // A file SQLite cannot even open as a database is damaged as well.
        Err(OpenError::Sqlite(error)) if is_damage(&error) => Err(error.to_string()),
        Err(OpenError::Sqlite(source)) => {
            return Err(StoreError::Sqlite {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let why = match found {
        Ok(None) => return Ok(Checked::Sound),
        Ok(Some(bound)) => return Ok(Checked::Unfinished(bound)),
        Err(why) => why,
    };
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.9fZ");
    let taken = |to: &PathBuf| {
        ["-wal", "-shm", ""]
            .iter()
            .any(|suffix| PathBuf::from(format!("{}{suffix}", to.display())).exists())
    };
    let to = (0..)
        .map(|n| match n {
            0 => PathBuf::from(format!("{}.damaged-{stamp}", path.display())),
            n => PathBuf::from(format!("{}.damaged-{stamp}-{n}", path.display())),
        })
        .find(|to| !taken(to))
        .unwrap_or_else(|| PathBuf::from(format!("{}.damaged", path.display())));
    for suffix in ["-wal", "-shm", ""] {
        let from = PathBuf::from(format!("{}{suffix}", path.display()));
        if from.exists() {
            let dest = PathBuf::from(format!("{}{suffix}", to.display()));
            std::fs::rename(&from, &dest).map_err(|source| StoreError::Dir {
                path: from.clone(),
                source,
            })?;
        }
    }
    tracing::error!(
        store = %path.display(),
        set_aside = %to.display(),
        %why,
        "the event store is damaged: set aside, starting a fresh one (the damaged file is kept; `sqlite3 FILE .recover` may save its rows)"
    );
    Ok(Checked::SetAside { to, why })
}

/// `PRAGMA integrity_check`: `Ok(None)` sound, `Ok(Some(bound))` interrupted by the bound,
/// `Err` damaged (what SQLite said).
fn integrity_check(
    path: &Path,
    bound: Duration,
) -> Result<Result<Option<Duration>, String>, OpenError> {
    let conn = connect(path)?;
    let interrupt = conn.get_interrupt_handle();
    let (done, stop) = std::sync::mpsc::channel::<()>();
    let timer = std::thread::spawn(move || {
        if stop.recv_timeout(bound).is_err() {
            interrupt.interrupt();
        }
    });
    let result = (|| {
        let mut stmt = conn.prepare("PRAGMA integrity_check(8)")?;
        let rows: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<Result<_, _>>()?;
        Ok::<_, rusqlite::Error>(rows)
    })();
    let _ = done.send(());
    let _ = timer.join();
    Ok(match result {
        Ok(rows) if rows == ["ok"] => Ok(None),
        Ok(rows) => Err(rows.join("; ")),
        Err(rusqlite::Error::SqliteFailure(e, _))
            if e.code == rusqlite::ErrorCode::OperationInterrupted =>
        {
            Ok(Some(bound))
        }
        Err(error) if is_damage(&error) => Err(error.to_string()),
        // Locked, out of memory, an I/O error: the store may be sound. The daemon stops with
        // the error rather than set a sound store aside.
        Err(error) => return Err(OpenError::Sqlite(error)),
    })
}

/// Whether SQLite's error says the file is damaged (not a database, corrupt), as opposed to a
/// passing failure (locked, busy, out of memory, I/O).
fn is_damage(error: &rusqlite::Error) -> bool {
    matches!(
        error,
        rusqlite::Error::SqliteFailure(e, _)
            if matches!(e.code, rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sound_store_is_kept_and_a_damaged_one_set_aside_whole() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("events.db");
        assert_eq!(
            check_at_start(&db, Duration::from_secs(5)).unwrap(),
            Checked::Sound
        );
        {
            let mut store = super::super::Store::open(&db).unwrap();
            let events: Vec<_> = (0..2000)
                .map(|i| {
                    crate::events::test_call(
                        "t",
                        Some(serde_json::json!({ "i": i, "pad": "x".repeat(200) })),
                        crate::decision::Action::Allow,
                        String::new(),
                    )
                })
                .collect();
            store.insert(&events).unwrap();
            store
                .conn
                .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
                .unwrap();
        }
        assert_eq!(
            check_at_start(&db, Duration::from_secs(5)).unwrap(),
            Checked::Sound
        );
        // Damage pages in the middle of the file: it still opens, its reads fail.
        {
            use std::io::{Seek, SeekFrom, Write};
            let mut file = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
            let len = file.metadata().unwrap().len();
            file.seek(SeekFrom::Start(len / 2)).unwrap();
            file.write_all(&vec![0xA5; 16 * 4096]).unwrap();
        }
        let checked = check_at_start(&db, Duration::from_secs(5)).unwrap();
        let Checked::SetAside { to, .. } = &checked else {
            panic!("damage found: {checked:?}");
        };
        assert!(to.exists(), "the damaged file is kept");
        assert!(!db.exists(), "a fresh store starts in its place");
        assert!(checked.describe().contains("set aside"));
    }

    /// Pages that are sound but an index that no longer matches its table (its root swapped
    /// with another index's): the quick check passes it, the integrity check does not; a
    /// second damaged store set aside in the same second gets a name of its own.
    #[test]
    fn an_index_that_disagrees_with_its_table_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("events.db");
        let mut set_aside = Vec::new();
        for _ in 0..2 {
            {
                let conn = rusqlite::Connection::open(&db).unwrap();
                conn.execute_batch(
                    "CREATE TABLE a (x); CREATE INDEX ax ON a (x);
                     CREATE TABLE b (x); CREATE INDEX bx ON b (x);
                     WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500)
                     INSERT INTO a SELECT i FROM n;
                     INSERT INTO b SELECT x + 1000 FROM a;",
                )
                .unwrap();
                let root = |name: &str| -> i64 {
                    conn.query_row(
                        "SELECT rootpage FROM sqlite_schema WHERE name = ?1",
                        [name],
                        |r| r.get(0),
                    )
                    .unwrap()
                };
                let (ax, bx) = (root("ax"), root("bx"));
                conn.execute_batch(&format!(
                    "PRAGMA writable_schema = ON;
                     UPDATE sqlite_schema SET rootpage = {bx} WHERE name = 'ax';
                     UPDATE sqlite_schema SET rootpage = {ax} WHERE name = 'bx';
                     PRAGMA writable_schema = OFF;"
                ))
                .unwrap();
            }
            let quick: String = rusqlite::Connection::open(&db)
                .unwrap()
                .query_row("PRAGMA quick_check", [], |r| r.get(0))
                .unwrap();
            assert_eq!(quick, "ok", "the quick check does not see it");
            let checked = check_at_start(&db, Duration::from_secs(5)).unwrap();
            let Checked::SetAside { to, why } = checked else {
                panic!("damage found: {checked:?}");
            };
            assert!(why.contains("index"), "{why}");
            set_aside.push(to);
        }
        assert_ne!(set_aside[0], set_aside[1]);
        assert!(set_aside.iter().all(|to| to.exists()));
    }
}
