//! The store's integrity check at the daemon's start: a database whose pages are damaged can
//! still open and answer `PRAGMA user_version`, then fail every read, while `/health` said `ok`.
//! The daemon checks it first (`PRAGMA quick_check`, bounded in time: a big file is checked as
//! far as the bound allows and said so), and sets a damaged one aside — renamed with its `-wal`
//! and `-shm`, never deleted — so that it starts on a fresh one, saying so in the log and in
//! `/health`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{OpenError, StoreError, connect};

/// What the check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Checked {
    /// No database yet, or `quick_check` said `ok`.
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
    let found = match quick_check(path, bound) {
        Ok(found) => found,
        Err(OpenError::Private(path, source)) => return Err(StoreError::Dir { path, source }),
        // A file SQLite cannot even open as a database is damaged as well.
        Err(OpenError::Sqlite(error)) => Err(error.to_string()),
    };
    let why = match found {
        Ok(None) => return Ok(Checked::Sound),
        Ok(Some(bound)) => return Ok(Checked::Unfinished(bound)),
        Err(why) => why,
    };
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    let to = PathBuf::from(format!("{}.damaged-{stamp}", path.display()));
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

/// `PRAGMA quick_check`: `Ok(None)` sound, `Ok(Some(bound))` interrupted by the bound, `Err`
/// damaged (what SQLite said).
fn quick_check(
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
        let mut stmt = conn.prepare("PRAGMA quick_check(8)")?;
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
        Err(error) => Err(error.to_string()),
    })
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
}
