//! OTLP export (`telemetry.otlp`, issue 17): every stored event leaves as a log record, every
//! correlated call as a span, for a fleet's existing pipeline.
//!
//! The store is the buffer. The exporter reads it behind a cursor kept in the database
//! (`export_cursors`), and moves the cursor only once the collector took a batch: a collector
//! that is down loses nothing (the batch is sent again, with back-off, until it is taken), and
//! a restart resumes where the last taken batch ended. Delivery is at-least-once — a restart
//! can send again what was taken after the cursor last moved; `toolwall.event.id` with the
//! resource's `service.instance.id` is the key to drop repeats by.

mod outbox;
mod wire;

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use tokio::sync::watch;

use crate::{
    config::OtlpConfig,
    events::{EventQuery, Store},
};
use outbox::{Batch, Outbox};

/// The cursor's name in `export_cursors`.
const CURSOR: &str = "otlp";

/// Longest wait between attempts while the collector refuses.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What `/metrics` shows of the exporter.
#[derive(Debug, Default)]
pub(crate) struct ExportStats {
    /// Log records the collector took.
    pub logs: AtomicU64,
    /// Spans the collector took.
    pub spans: AtomicU64,
    /// Exports the collector refused or that failed.
    pub failures: AtomicU64,
    /// The row id the cursor stands at.
    pub cursor: AtomicI64,
    /// Call events sent without their span's ids (too many waited for their records).
    pub unlinked: AtomicU64,
}

/// Starts the exporter; returns what `/metrics` reads and a description for the layer list.
/// Fails when the exporter cannot be built (a CA file that does not parse, say): a configured
/// export that silently does nothing would be a loss no one sees.
pub(crate) async fn start(
    config: OtlpConfig,
    db: PathBuf,
    window: Duration,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<(Arc<ExportStats>, tokio::task::JoinHandle<()>)> {
    let (store, resume_after, instance) = tokio::task::spawn_blocking(move || {
        let store = Store::open(&db)?;
        let (resume_after, instance) = store.export_instance(CURSOR)?;
        anyhow::Ok((store, resume_after, instance))
    })
    .await
    .context("open the store for export")??;
    let exporters =
        wire::Exporters::new(&config, &hex::encode(instance)).context("telemetry.otlp")?;
    let stats = Arc::new(ExportStats::default());
    stats.cursor.store(resume_after, Ordering::Relaxed);
    let outbox = Outbox::new(window, &config.events, config.spans, instance, resume_after);
    let task = tokio::spawn(run(config, store, exporters, outbox, stats.clone(), stop));
    Ok((stats, task))
}

async fn run(
    config: OtlpConfig,
    store: Store,
    exporters: wire::Exporters,
    mut outbox: Outbox,
    stats: Arc<ExportStats>,
    mut stop: watch::Receiver<bool>,
) {
    let store = Arc::new(std::sync::Mutex::new(store));
    let interval = Duration::from_millis(config.interval_ms);
    loop {
        if *stop.borrow() {
            return;
        }
        let after = outbox.read_through();
        let limit = config.batch_size;
        let read = {
            let store = store.clone();
            tokio::task::spawn_blocking(move || {
                let store = store
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                store.query(&EventQuery {
                    after_id: Some(after),
                    limit: Some(limit),
                    ..Default::default()
                })
            })
            .await
        };
        let events = match read {
            Ok(Ok(events)) => events,
            Ok(Err(error)) => {
                tracing::error!(%error, "OTLP export: reading the store failed; trying again");
                if sleep_or_stop(&mut stop, Duration::from_secs(5)).await {
                    return;
                }
                continue;
            }
            Err(error) => {
                tracing::error!(%error, "OTLP export: the store reader failed");
                return;
            }
        };
        let caught_up = events.len() < limit;
        let latest = events.last().map(|e| e.event.keys().timestamp);
        for event in events {
            outbox.push(event);
        }
        // Reading history, the events' own time closes records; caught up, the clock does.
        let now = match (caught_up, latest) {
            (false, Some(latest)) => latest,
            _ => chrono::Utc::now(),
        };
        outbox.expire(now);
        if outbox.unlinked() > stats.unlinked.load(Ordering::Relaxed) {
            tracing::warn!(
                events = outbox.unlinked(),
                "OTLP export: more call events waited for their records than the exporter holds; the oldest left without their span's ids"
            );
            stats.unlinked.store(outbox.unlinked(), Ordering::Relaxed);
        }
        let batch = outbox.take();
        if !deliver(&exporters, &batch, &stats, &mut stop).await {
            return;
        }
        if batch.resume_after != stats.cursor.load(Ordering::Relaxed) {
            let store = store.clone();
            let resume_after = batch.resume_after;
            let saved = tokio::task::spawn_blocking(move || {
                let store = store
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                store.set_export_cursor(CURSOR, resume_after)
            })
            .await;
            match saved {
                Ok(Ok(())) => stats.cursor.store(resume_after, Ordering::Relaxed),
                Ok(Err(error)) => {
                    tracing::error!(%error, "OTLP export: saving the cursor failed (a restart sends these events again)")
                }
                Err(error) => tracing::error!(%error, "OTLP export: the cursor writer failed"),
            }
        }
        if caught_up && sleep_or_stop(&mut stop, interval).await {
            return;
        }
    }
}

/// Sends a batch until the collector takes it (logs, then spans; a part taken is not sent
/// again). False when the daemon stops first: the cursor stays, and the next start sends it.
async fn deliver(
    exporters: &wire::Exporters,
    batch: &Batch,
    stats: &ExportStats,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let mut logs_done = batch.logs.is_empty();
    let mut spans_done = batch.spans.is_empty();
    let mut backoff = Duration::from_secs(1);
    let mut failed = 0u32;
    while !(logs_done && spans_done) {
        let result = if logs_done {
            exporters.send_spans(&batch.spans).await.map(|()| {
                spans_done = true;
                stats
                    .spans
                    .fetch_add(batch.spans.len() as u64, Ordering::Relaxed);
            })
        } else {
            exporters.send_logs(&batch.logs).await.map(|()| {
                logs_done = true;
                stats
                    .logs
                    .fetch_add(batch.logs.len() as u64, Ordering::Relaxed);
            })
        };
        match result {
            Ok(()) => {
                if failed > 0 {
                    tracing::info!(
                        attempts = failed + 1,
                        "OTLP export: the collector took the batch it had refused"
                    );
                    failed = 0;
                }
            }
            Err(error) => {
                stats.failures.fetch_add(1, Ordering::Relaxed);
                if failed == 0 {
                    tracing::warn!(
                        %error,
                        events = batch.logs.len(),
                        spans = batch.spans.len(),
                        "OTLP export failed; the events stay in the store and are sent again"
                    );
                }
                failed += 1;
                if sleep_or_stop(stop, backoff).await {
                    return false;
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
    true
}

/// Sleeps; true when the daemon is stopping.
async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, time: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(time) => *stop.borrow(),
        _ = stop.changed() => true,
    }
}

/// The exporter's whole path over a store — read, correlate, convert, encode, send over
/// OTLP/HTTP — as fast as it goes, for `cargo xtask bench export`: returns the log records
/// and spans the collector at `endpoint` took.
#[cfg(feature = "bench")]
pub async fn bench_export(db: &std::path::Path, endpoint: &str) -> anyhow::Result<(u64, u64)> {
    let config = OtlpConfig {
        endpoint: endpoint.to_owned(),
        protocol: crate::config::OtlpProtocol::HttpProtobuf,
        headers: Default::default(),
        tls: None,
        events: Vec::new(),
        spans: true,
        batch_size: 512,
        interval_ms: 1000,
        timeout_secs: 10,
    };
    let store = Store::open(db)?;
    let (_, instance) = store.export_instance("bench")?;
    let exporters = wire::Exporters::new(&config, "bench")?;
    let mut outbox = Outbox::new(Duration::from_secs(2), &[], true, instance, 0);
    let stats = ExportStats::default();
    let (_keep, mut stop) = watch::channel(false);
    loop {
        let events = store.query(&EventQuery {
            after_id: Some(outbox.read_through()),
            limit: Some(config.batch_size),
            ..Default::default()
        })?;
        let Some(latest) = events.last().map(|e| e.event.keys().timestamp) else {
            // Everything read: close what is open, send it, done.
            outbox.expire(chrono::DateTime::<chrono::Utc>::MAX_UTC);
            let batch = outbox.take();
            anyhow::ensure!(deliver(&exporters, &batch, &stats, &mut stop).await);
            break;
        };
        for event in events {
            outbox.push(event);
        }
        outbox.expire(latest);
        let batch = outbox.take();
        anyhow::ensure!(deliver(&exporters, &batch, &stats, &mut stop).await);
    }
    Ok((
        stats.logs.load(Ordering::Relaxed),
        stats.spans.load(Ordering::Relaxed),
    ))
}
