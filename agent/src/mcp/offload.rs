//! Judging a large message off the runtime's thread.
//!
//! The filter proxy serves every client on one thread. Judging a message of megabytes (a
//! listing of thousands of tools, a call with a large argument) holds that thread for hundreds
//! of milliseconds, and every other client's calls wait that long. A message of
//! [`INLINE_BYTES`] or more is judged on a blocking thread instead: its filter is moved there
//! and back, and the runtime serves the other clients meanwhile. At most one fewer such
//! judgements than the machine has cores run at once; the rest wait their turn, in order.
//! `mcp_proxy_edges.rs`, `a_large_message_being_judged_does_not_hold_up_other_clients`, shows
//! it through the real binary.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use tokio::sync::{Semaphore, oneshot};

use super::filter::Filter;

/// Messages from this size on are judged off the runtime's thread; smaller ones take less
/// time than the move there and back.
pub(crate) const INLINE_BYTES: usize = 256 << 10;

/// Large request bodies read and not yet judged, at most: a client's body waits in its
/// socket (the kernel's buffers, not ours) until one of these is free. Without it the runtime
/// reads every large body at once while they wait their turn to be judged: 40 clients sending
/// 15 MB each held 865 MB.
const BODIES_AT_ONCE: usize = 8;

/// A large request body's place among those read and not yet judged ([`admit`]).
pub(crate) type Admitted = tokio::sync::SemaphorePermit<'static>;

/// Waits, before a request body is read, until it may be: at once for a body known to be
/// small, else for a place among [`BODIES_AT_ONCE`] (held until it was judged).
pub(crate) async fn admit(body: &impl hyper::body::Body) -> Option<Admitted> {
    static BODIES: Semaphore = Semaphore::const_new(BODIES_AT_ONCE);
    let hint = body.size_hint();
    if hint.upper().is_some_and(|n| n < INLINE_BYTES as u64) {
        return None;
    }
    // Never closed.
    BODIES.acquire().await.ok()
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
/// it happened) sends nothing.
fn spawn<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
    abandoned: impl FnOnce(T) + Send + 'static,
) -> oneshot::Receiver<T> {
    let (mut tx, done) = oneshot::channel();
    tokio::spawn(async move {
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
    work: impl FnOnce() -> T + Send + 'static,
    abandoned: impl FnOnce(T) + Send + 'static,
) -> Option<T> {
    spawn(work, abandoned).await.ok()
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
            done: spawn(work, move |(_, out)| abandoned(out)),
        }
    }
}

impl<T> Future for Judging<T> {
    type Output = Option<(Filter, T)>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.done).poll(cx).map(Result::ok)
    }
}

/// Runs `work` on `filter` here when `len` is below [`INLINE_BYTES`], else on a blocking
/// thread ([`Judging`]); `None` when the judgement was lost.
pub(crate) async fn judge<T: Send + 'static>(
    mut filter: Filter,
    len: usize,
    work: impl FnOnce(&mut Filter) -> T + Send + 'static,
    abandoned: impl FnOnce(T) + Send + 'static,
) -> Option<(Filter, T)> {
    if len < INLINE_BYTES {
        let out = work(&mut filter);
        return Some((filter, out));
    }
    Judging::start(filter, work, abandoned).await
}
