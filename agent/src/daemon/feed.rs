//! One feed from the store: `/metrics`, the live streams (`/api/stream/events`, `/api/stream/calls`)
//! and the live correlator follow the rows the store committed, by row id, whichever process
//! wrote them — the daemon's writer, a stand-alone `toolwall shim` or `mcp-proxy` with the same
//! store. (The OTLP exporter reads the store behind its own cursor: `daemon/otlp`.)
//!
//! Row ids grow in commit order (SQLite lets one writer in at a time, and a row's id is taken
//! inside its transaction), so reading every row past the last one read misses none. The
//! daemon's writer says when it committed, for a prompt feed; other processes' rows are found
//! by a short poll. The feed reads each row once; a live stream's follower that falls behind is
//! told how many it missed (`event: lagged`), and the metrics count every row.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use super::metrics::Metrics;
use crate::correlate::{CallRecord, Correlator};
use crate::events::{EventQuery, Store, StoredEvent};
use crate::registry::value_hash;

/// How often rows other processes committed are looked for.
const POLL: Duration = Duration::from_millis(250);

/// Rows read at once.
const BATCH: usize = 4096;

/// Where the feed goes.
pub(crate) struct Followers {
    pub events: broadcast::Sender<StoredEvent>,
    pub calls: broadcast::Sender<CallRecord>,
    pub metrics: Arc<Metrics>,
    /// The correlator's window.
    pub window: Duration,
}

/// Starts the feed after row `start` (the store's last when the daemon's writer started); it
/// ends once `committed` closes (the writer is gone), after reading what was committed until
/// then.
pub(crate) fn spawn(
    db: PathBuf,
    start: i64,
    committed: std::sync::mpsc::Receiver<()>,
    to: Followers,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let store = Store::open(&db)?;
    Ok(std::thread::Builder::new()
        .name("event-feed".into())
        .spawn(move || follow(store, start, committed, to))?)
}

fn follow(store: Store, mut last: i64, committed: std::sync::mpsc::Receiver<()>, to: Followers) {
    let mut correlator = Correlator::new(to.window, value_hash);
    let mut failing = false;
    loop {
        let open = match committed.recv_timeout(POLL) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => true,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => false,
        };
        loop {
            let read = store.query(&EventQuery {
                after_id: Some(last),
                limit: Some(BATCH),
                ..Default::default()
            });
            let rows = match read {
                Ok(rows) => {
                    if failing {
                        tracing::warn!("the live feed reads the store again");
                        failing = false;
                    }
                    rows
                }
                Err(error) => {
                    if !failing {
                        tracing::error!(%error, "the live feed cannot read the store; it goes on from row {last} once it can");
                        failing = true;
                    }
                    break;
                }
            };
            let n = rows.len();
            for stored in rows {
                last = stored.id;
                to.metrics.committed(&stored);
                for record in correlator.push(&stored) {
                    let _ = to.calls.send(record);
                }
                // No follower is fine.
                let _ = to.events.send(stored);
            }
            if n < BATCH {
                break;
            }
        }
        for record in correlator.expire(chrono::Utc::now()) {
            let _ = to.calls.send(record);
        }
        if !open {
            break;
        }
    }
    for record in correlator.flush() {
        let _ = to.calls.send(record);
    }
}
