//! OTLP export (`telemetry.otlp`): every stored event leaves as a log record, every
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

/// Most bytes in one export request (estimated from the bodies): under what collectors take
/// (the OpenTelemetry Collector's gRPC default is 4 MiB).
const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// One export request's worth of a batch.
#[derive(Clone, Copy)]
enum Part<'a> {
    Logs(&'a [outbox::LogItem]),
    Spans(&'a [outbox::SpanItem]),
}

impl<'a> Part<'a> {
    fn len(&self) -> usize {
        match self {
            Part::Logs(items) => items.len(),
            Part::Spans(items) => items.len(),
        }
    }

    fn halves(&self) -> (Part<'a>, Part<'a>) {
        let mid = self.len() / 2;
        match self {
            Part::Logs(items) => (Part::Logs(&items[..mid]), Part::Logs(&items[mid..])),
            Part::Spans(items) => (Part::Spans(&items[..mid]), Part::Spans(&items[mid..])),
        }
    }
}

/// `items` cut into requests of at most [`MAX_REQUEST_BYTES`] by `size`.
fn requests<T>(items: &[T], size: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        let n = size(item);
        if i > start && bytes + n > MAX_REQUEST_BYTES {
            out.push(&items[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += n;
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// Whether the collector refused the request as too large (or as more than it takes now):
/// halves of it may pass. The exporters say so only in their error text (`opentelemetry-otlp`'s
/// HTTP status and gRPC code).
fn too_large(error: &str) -> bool {
    ["status code: 413", "gRPC code: ResourceExhausted"]
        .iter()
        .any(|needle| error.contains(needle))
}

/// Sends a batch until the collector takes it: logs, then spans, in requests bounded in bytes;
/// a part taken is not sent again. A request the collector refuses as too large is halved
/// (a record is bounded — `wire.rs` — so one alone passes any collector that takes ~100 KiB).
/// Nothing is dropped: a collector that keeps refusing holds the export, which `/metrics`
/// shows (failures, lag), and the events wait in the store. False when the daemon stops first:
/// the cursor stays, and the next start sends the batch.
async fn deliver(
    exporters: &wire::Exporters,
    batch: &Batch,
    stats: &ExportStats,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let mut parts: Vec<Part<'_>> = requests(&batch.logs, wire::log_size)
        .into_iter()
        .map(Part::Logs)
        .chain(
            requests(&batch.spans, wire::span_size)
                .into_iter()
                .map(Part::Spans),
        )
        .collect();
    parts.reverse();
    let mut backoff = Duration::from_secs(1);
    let mut failed = 0u32;
    while let Some(part) = parts.pop() {
        let result = match part {
            Part::Logs(items) => exporters.send_logs(items).await,
            Part::Spans(items) => exporters.send_spans(items).await,
        };
        let error = match result {
            Ok(()) => {
                let counter = match part {
                    Part::Logs(_) => &stats.logs,
                    Part::Spans(_) => &stats.spans,
                };
                counter.fetch_add(part.len() as u64, Ordering::Relaxed);
                if failed > 0 {
                    tracing::info!(
                        attempts = failed + 1,
                        "OTLP export: the collector took what it had refused"
                    );
                }
                (failed, backoff) = (0, Duration::from_secs(1));
                continue;
            }
            Err(error) => error.to_string(),
        };
        stats.failures.fetch_add(1, Ordering::Relaxed);
        if failed == 0 {
            tracing::warn!(
                %error,
                records = part.len(),
                "OTLP export failed; the events stay in the store and are sent again"
            );
        }
        failed += 1;
        if too_large(&error) && part.len() > 1 {
            let (first, second) = part.halves();
            parts.push(second);
            parts.push(first);
        } else {
            parts.push(part);
        }
        if sleep_or_stop(stop, backoff).await {
            return false;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_bounded_in_bytes_and_never_empty() {
        let sizes = [600_000, 600_000, 10, 2_000_000, 5];
        let cut = requests(&sizes, |n| *n);
        assert_eq!(
            cut,
            vec![&sizes[..1], &sizes[1..3], &sizes[3..4], &sizes[4..]]
        );
        assert!(requests(&[] as &[usize], |n| *n).is_empty());
    }

    #[test]
    fn only_a_refusal_for_size_splits_a_request() {
        assert!(too_large("HTTP export failed with status code: 413"));
        assert!(too_large(
            "TonicLogsClient export failed with gRPC code: ResourceExhausted"
        ));
        assert!(!too_large("HTTP export failed with status code: 400"));
        assert!(!too_large("HTTP export failed with status code: 503"));
        assert!(!too_large(
            "TonicLogsClient export failed with gRPC code: Unavailable: connection refused"
        ));
    }
}
