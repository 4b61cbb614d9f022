//! Judging a large message off the runtime's thread.
//!
//! The filter proxy serves every client on one thread. Judging a message of megabytes (a
//! listing of thousands of tools, a call with a large argument) holds that thread for hundreds
//! of milliseconds, and every other client's calls wait that long. A message of
//! [`INLINE_BYTES`] or more is judged on a blocking thread instead: its filter is moved there
//! and back, and the runtime serves the other clients meanwhile. At most one fewer such
//! judgements than the machine has cores run at once; the rest wait their turn, in order, and
//! the messages sent away hold at most [`MAX_AWAY_BYTES`] ([`Away`]). `mcp_proxy_bounds.rs`,
//! `a_large_message_being_judged_does_not_hold_up_other_clients`, shows it through the real
//! binary.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio::sync::{Semaphore, oneshot};

use super::filter::Filter;

/// Messages from this size on are judged off the runtime's thread; smaller ones take less
/// time than the move there and back.
pub(crate) const INLINE_BYTES: usize = 256 << 10;

/// Most bytes of messages sent away to be judged and not judged yet. Past it a large message
/// is judged where it came in, as every message once was: that holds the proxy's thread, so
/// nothing more is read meanwhile. Without it the runtime went on reading every large body
/// while they waited their turn (40 connected clients sending 15 MB each held 865 MB); a bound
/// taken before a body is read instead let eight clients that stall mid-body hold up every
/// large request.
const MAX_AWAY_BYTES: usize = 64 << 20;

/// Bytes of messages sent away, and not judged yet.
static AWAY: AtomicUsize = AtomicUsize::new(0);

/// A message's share of [`MAX_AWAY_BYTES`], given back when it was judged (or dropped).
pub(crate) struct Away(usize);

impl Away {
    /// The share of a message of `len` bytes, if it is large and fits: `None` means judge it
    /// here.
    pub(crate) fn take(len: usize) -> Option<Away> {
        if len < INLINE_BYTES {
            return None;
        }
        AWAY.fetch_update(Ordering::AcqRel, Ordering::Acquire, |away| {
            (away + len <= MAX_AWAY_BYTES).then_some(away + len)
        })
        .ok()
        .map(|_| Away(len))
    }
}

impl Drop for Away {
    fn drop(&mut self) {
        AWAY.fetch_sub(self.0, Ordering::AcqRel);
    }
}

/// The judgements that may run off the runtime's thread at once: the cores but the runtime's.
fn permits() -> &'static Semaphore {
    static PERMITS: OnceLock<Semaphore> = OnceLock::new();
    PERMITS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Semaphore::new(cores.saturating_sub(1).max(1))
    })
}

/// Runs `work` on a blocking thread once a permit is free; the receiver gets what it made.
/// When the receiver is gone before it comes (the client left) but after `work` began,
/// `abandoned` gets it, so that what was judged is still recorded; gone before, `work` is
/// dropped without running (and logged). A `work` that panicked (the panic is reported where
/// it happened) sends nothing. `away` is given back when it is over, however it ends.
fn spawn<T: Send + 'static>(
    away: Away,
    work: impl FnOnce() -> T + Send + 'static,
    abandoned: impl FnOnce(T) + Send + 'static,
) -> oneshot::Receiver<T> {
    let (mut tx, done) = oneshot::channel();
    tokio::spawn(async move {
        let _away = away;
        // A message whose client left while it waited its turn is not judged: nothing of it
        // was passed on, and it is let go at once rather than held until its turn.
        let permit = tokio::select! {
            permit = permits().acquire() => permit,
            () = tx.closed() => {
                tracing::warn!("a large message's client left before it was judged; it was dropped, unjudged and not passed on");
                return;
            }
        };
        // The semaphore is never closed.
        let Ok(_permit) = permit else {
            return;
        };
        if let Ok(out) = tokio::task::spawn_blocking(work).await
            && let Err(out) = tx.send(out)
        {
            abandoned(out);
        }
    });
    done
}

/// Runs `work` (judging a large message under a lock of its own: a bridged session's filter)
/// on a blocking thread ([`spawn`]); `None` when it was lost (it panicked, or the runtime is
/// ending).
pub(crate) async fn blocking<T: Send + 'static>(
    away: Away,
    work: impl FnOnce() -> T + Send + 'static,
    abandoned: impl FnOnce(T) + Send + 'static,
) -> Option<T> {
    spawn(away, work, abandoned).await.ok()
}

/// A judgement under way on a blocking thread: resolves to the filter and what `work` made
/// of the message, or to `None` when the judgement was lost (it panicked, or the runtime is
/// ending); the filter is then lost with it.
pub(crate) struct Judging<T> {
    done: oneshot::Receiver<(Filter, T)>,
}

impl<T: Send + 'static> Judging<T> {
    /// Runs `work` on `filter` on a blocking thread ([`spawn`]); `abandoned` gets what it made
    /// when no one waits for it any more.
    pub(crate) fn start(
        away: Away,
        filter: Filter,
        work: impl FnOnce(&mut Filter) -> T + Send + 'static,
        abandoned: impl FnOnce(T) + Send + 'static,
    ) -> Self {
        let work = move || {
            let mut filter = filter;
            let out = work(&mut filter);
            (filter, out)
        };
        Judging {
            done: spawn(away, work, move |(_, out)| abandoned(out)),
        }
    }
}

impl<T> Future for Judging<T> {
    type Output = Option<(Filter, T)>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.done).poll(cx).map(Result::ok)
    }
}

/// Runs `work` on `filter` on a blocking thread ([`Judging`]) when the message of `len` bytes
/// is large and fits among those away ([`Away::take`]), else here; `None` when the judgement
/// was lost.
pub(crate) async fn judge<T: Send + 'static>(
    mut filter: Filter,
    len: usize,
    work: impl FnOnce(&mut Filter) -> T + Send + 'static,
    abandoned: impl FnOnce(T) + Send + 'static,
) -> Option<(Filter, T)> {
    match Away::take(len) {
        Some(away) => Judging::start(away, filter, work, abandoned).await,
        None => {
            let out = work(&mut filter);
            Some((filter, out))
        }
    }
}
