//! The writer threads: the one that batches the layers' events into the store, and the
//! committer whose batches wait for their commit.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use thiserror::Error;
use tokio::sync::{mpsc, oneshot};

use super::Store;
use crate::events::{Event, EventQueue};

/// Largest batch written in one transaction.
const MAX_BATCH: usize = 4096;

/// How the store is doing, shared by the writer and whoever reports on it (`/health`).
#[derive(Debug)]
pub(crate) struct StoreHealth {
    /// Why the last write failed, until one succeeds.
    failing: std::sync::Mutex<Option<String>>,
    /// Set when the daemon stops: a write that keeps failing is then given up.
    stopping: AtomicBool,
    /// Events given up on at shutdown.
    unstored: AtomicU64,
    /// What the integrity check at start found (`None`: not run, a stand-alone writer).
    checked: std::sync::Mutex<Option<super::Checked>>,
    /// Why the last read of the store failed, until one succeeds.
    reads_failing: std::sync::Mutex<Option<String>>,
    /// Seconds each batch's transaction took (successful ones), for `/metrics`.
    pub(crate) commit_seconds: prometheus_client::metrics::histogram::Histogram,
}

impl Default for StoreHealth {
    fn default() -> Self {
        StoreHealth {
            failing: Default::default(),
            stopping: Default::default(),
            unstored: Default::default(),
            checked: Default::default(),
            reads_failing: Default::default(),
            // 50 µs to ~3 s: a batch on a quiet disk to one behind a busy lock.
            commit_seconds: prometheus_client::metrics::histogram::Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(50e-6, 4.0, 9),
            ),
        }
    }
}

impl StoreHealth {
    /// Why the store cannot write now; `None` when its last write succeeded.
    pub(crate) fn failing(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What the integrity check at start found.
    pub(crate) fn checked(&self) -> Option<super::Checked> {
        self.checked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records what the integrity check at start found.
    pub(crate) fn set_checked(&self, checked: super::Checked) {
        *self.checked.lock().unwrap_or_else(|e| e.into_inner()) = Some(checked);
    }

    /// Why reading the store fails now; `None` when its last read succeeded.
    pub(crate) fn reads_failing(&self) -> Option<String> {
        self.reads_failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records the outcome of a read (a view's, a page's).
    pub(crate) fn set_read(&self, failing: Option<String>) {
        *self.reads_failing.lock().unwrap_or_else(|e| e.into_inner()) = failing;
    }

    /// Events the writer gave up on at shutdown (the disk kept failing).
    pub(crate) fn unstored(&self) -> u64 {
        self.unstored.load(Ordering::Relaxed)
    }

    /// From now on a write that keeps failing is given up after a few tries, so that the
    /// daemon's stop does not wait on a full disk for ever.
    pub(crate) fn stop(&self) {
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
pub(crate) enum CommitError {
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
pub(crate) struct Committer {
    tx: mpsc::UnboundedSender<Durable>,
    health: Arc<StoreHealth>,
}

impl Committer {
    /// Stores `events` in one transaction and waits, at most `within`, until it committed.
    pub(crate) async fn commit(
        &self,
        events: Vec<Event>,
        within: Duration,
    ) -> Result<(), CommitError> {
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
    pub(crate) fn health(&self) -> Arc<StoreHealth> {
        self.health.clone()
    }
}

/// Runs the single writer: drains the channel in batches until every sender is gone, then
/// returns (so joining the thread after dropping the sinks means every event is on disk).
///
/// A failed write is retried (another process may hold the lock past the busy time-out); events
/// are never dropped.
pub fn spawn_writer(store: Store, rx: EventQueue) -> thread::JoinHandle<u64> {
    spawn_committing_writer(store, rx, None).0
}

/// [`spawn_writer`], with a [`Committer`] for batches that wait for their commit.
///
/// A failing write marks the store failing (its health says why) and answers the waiting
/// batches in it at once (their senders get an error and keep their events; nothing of them is
/// stored later, so a retry cannot store twice); the layers' events are retried with back-off
/// until the disk takes them, or given up after a few tries once [`StoreHealth::stop`] was
/// called (counted in [`StoreHealth::unstored`] and logged). `committed` is told after each
/// commit (the daemon's feed reads the new rows at once: `daemon/feed.rs`); it closes when
/// the writer returns.
pub(crate) fn spawn_committing_writer(
    mut store: Store,
    mut rx: EventQueue,
    committed: Option<std::sync::mpsc::SyncSender<()>>,
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
                // Once a batch was given up at stop, the next ones get one try each: the stop
                // takes one failed write per batch, not three with back-off (with back-off, 73
                // batches take over a minute).
                let mut gave_up = false;
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
                        let started = std::time::Instant::now();
                        match store.insert(&batch) {
                            Ok(ids) => {
                                health
                                    .commit_seconds
                                    .observe(started.elapsed().as_secs_f64());
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
                                if health.stopping.load(Ordering::Relaxed)
                                    && tries >= if gave_up { 1 } else { 3 }
                                {
                                    gave_up = true;
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
                    if !ids.is_empty()
                        && let Some(committed) = &committed
                    {
                        // Full means the feed is told already.
                        let _ = committed.try_send(());
                    }
                    for (_, _, done) in waiting.drain(..) {
                        let _ = done.send(Ok(()));
                    }
                    written += ids.len() as u64;
                    batch.clear();
                }
                written
            })
        })
        .expect("spawn the event writer thread");
    (writer, committer)
}
