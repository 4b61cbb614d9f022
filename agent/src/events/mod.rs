//! Events: what every layer records, the sink they record into, and the store behind it.
//!
//! Layers never touch the database: they hand events to an [`EventSink`] (a channel send, no
//! I/O on the hot path) and one writer task batches them into SQLite. What waits between them
//! is bounded in bytes: a layer asks [`EventSink::room`] before taking in more of what it
//! records, so a session that floods calls waits for the store instead of growing the
//! daemon's memory.

pub(crate) mod bound;
mod store;
mod types;

pub(crate) use store::{
    Checked, OpenError, check_at_start, claim as claim_store, connect, time_ns,
};
pub(crate) use store::{
    Committer, EventQuery, PAGE_BUDGET, StoreError, StoreHealth, spawn_committing_writer,
};
pub use store::{Store, StoredEvent, spawn_writer};
pub use types::*;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, mpsc};

/// Bytes (as [`Event::weight`] counts them) the queue holds before [`EventSink::room`] waits:
/// 128 records of the largest size the store keeps, tens of thousands of ordinary ones.
pub(crate) const MAX_QUEUED_BYTES: usize = 32 * 1024 * 1024;

/// What the sinks have queued and the writer has not yet taken.
#[derive(Debug)]
struct Budget {
    queued: AtomicUsize,
    limit: usize,
    freed: Arc<Notify>,
}

impl Budget {
    fn take(&self, weight: usize) {
        self.queued.fetch_add(weight, Ordering::AcqRel);
    }

    fn release(&self, weight: usize) {
        let before = self.queued.fetch_sub(weight, Ordering::AcqRel);
        if before > self.limit && before - weight <= self.limit {
            self.freed.notify_waiters();
        }
    }

    fn has_room(&self) -> bool {
        self.queued.load(Ordering::Acquire) <= self.limit
    }
}

/// Where layers put events. Cheap to clone; sending never blocks and never fails loudly on the
/// hot path (a closed store is logged once per sink clone).
#[derive(Clone, Debug)]
pub struct EventSink {
    /// Each event with its weight, so the writer releases what was taken.
    tx: mpsc::UnboundedSender<(Event, usize)>,
    budget: Arc<Budget>,
    /// The signed policy bundle's revision in force (0: none), stamped on every decision
    /// event this sink records; shared by every clone, set by the daemon when it applies a
    /// bundle (`daemon/bundle.rs`).
    revision: Arc<std::sync::atomic::AtomicU64>,
}

impl EventSink {
    /// A sink and the receiving end (the store's writer task, or a test).
    pub fn channel() -> (Self, EventQueue) {
        Self::with_limit(MAX_QUEUED_BYTES)
    }

    /// [`EventSink::channel`] with the queue's bound in bytes given.
    pub(crate) fn with_limit(limit: usize) -> (Self, EventQueue) {
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = Arc::new(Budget {
            queued: AtomicUsize::new(0),
            limit,
            freed: Arc::new(Notify::new()),
        });
        (
            Self {
                tx,
                budget: budget.clone(),
                revision: Arc::default(),
            },
            EventQueue { rx, budget },
        )
    }

    /// Records an event. Never waits: a layer that can hold its input back asks
    /// [`EventSink::room`] first; what it records then is never dropped.
    pub fn emit(&self, mut event: Event) {
        let revision = self.revision.load(Ordering::Acquire);
        if revision != 0
            && let Some(field) = event.policy_revision_mut()
        {
            *field = Some(revision);
        }
        let weight = event.weight();
        self.budget.take(weight);
        if self.tx.send((event, weight)).is_err() {
            self.budget.release(weight);
            tracing::error!("event store is gone; an event was not recorded");
        }
    }

    /// Waits until the queue is within its bound (at once when it is). Layers call it before
    /// reading the next message of whoever they record (`mcp/shim.rs`, the filter proxy, the
    /// LLM proxy): when the store falls behind, they stop reading, and the sender waits.
    pub async fn room(&self) {
        loop {
            let freed = self.budget.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.budget.has_room() || self.tx.is_closed() {
                return;
            }
            freed.await;
        }
    }

    /// [`EventSink::room`] for a body that is polled, not awaited (the LLM proxy's pumps).
    pub(crate) fn room_poller(&self) -> RoomPoller {
        RoomPoller {
            sink: self.clone(),
            waiting: None,
        }
    }

    /// Whether the queue is within its bound: a producer that cannot wait (the kernel's
    /// event reader) counts instead of queueing when it is not.
    pub(crate) fn has_room(&self) -> bool {
        self.budget.has_room()
    }

    /// Stamps `revision` on the decision events recorded from now on (every clone of this
    /// sink). The policy swap comes first, so an event stamped with the new revision was
    /// decided by it — but for a decision made just before the swap and recorded just after.
    pub(crate) fn set_policy_revision(&self, revision: u64) {
        self.revision.store(revision, Ordering::Release);
    }

    /// Bytes queued and not yet taken by the writer.
    pub(crate) fn queued(&self) -> usize {
        self.budget.queued.load(Ordering::Acquire)
    }
}

/// Waits for room in the event queue from a `poll` method.
pub(crate) struct RoomPoller {
    sink: EventSink,
    waiting: Option<std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>>,
}

impl RoomPoller {
    /// Ready once the queue is within its bound (or the store is gone).
    pub(crate) fn poll_room(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        use std::future::Future as _;
        loop {
            let freed = self.sink.budget.freed.clone();
            let waiting = self.waiting.get_or_insert_with(|| {
                let mut notified = Box::pin(freed.notified_owned());
                notified.as_mut().enable();
                notified
            });
            if self.sink.budget.has_room() || self.sink.tx.is_closed() {
                self.waiting = None;
                return std::task::Poll::Ready(());
            }
            std::task::ready!(waiting.as_mut().poll(cx));
            self.waiting = None;
        }
    }
}

/// The receiving end of the sinks: what it hands out leaves the queue's budget.
#[derive(Debug)]
pub struct EventQueue {
    rx: mpsc::UnboundedReceiver<(Event, usize)>,
    budget: Arc<Budget>,
}

impl EventQueue {
    /// The next event; `None` once every sink is gone and the queue is empty.
    pub async fn recv(&mut self) -> Option<Event> {
        let (event, weight) = self.rx.recv().await?;
        self.budget.release(weight);
        Some(event)
    }

    /// The next event if one is queued.
    pub fn try_recv(&mut self) -> Result<Event, mpsc::error::TryRecvError> {
        let (event, weight) = self.rx.try_recv()?;
        self.budget.release(weight);
        Ok(event)
    }
}

/// A `tools/call` of `tool` at the shim, for the tests of what reads events.
#[cfg(test)]
pub(crate) fn test_call(
    tool: &str,
    input: Option<serde_json::Value>,
    action: crate::decision::Action,
    reason: String,
) -> Event {
    Event::McpToolCalled(ToolCalled {
        policy_revision: None,
        timestamp: chrono::Utc::now(),
        session_id: "s".into(),
        server_id: "srv".into(),
        server_type: "stdio".into(),
        tool_name: tool.into(),
        jsonrpc_id: serde_json::json!(1),
        input,
        action,
        reason,
        layer: "shim".into(),
    })
}

#[cfg(test)]
mod schema_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn call(text: &str) -> Event {
        test_call(
            "t",
            Some(serde_json::json!({ "text": text })),
            crate::decision::Action::Allow,
            String::new(),
        )
    }

    #[tokio::test]
    async fn room_waits_while_the_queue_is_over_its_bound_and_wakes_when_it_drains() {
        let (sink, mut queue) = EventSink::with_limit(64 * 1024);
        sink.room().await;
        for _ in 0..4 {
            sink.emit(call(&"x".repeat(30 * 1024)));
        }
        assert!(
            sink.queued() > 64 * 1024,
            "four 30 KiB calls are over 64 KiB"
        );
        let waiting = tokio::spawn({
            let sink = sink.clone();
            async move { sink.room().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "room() must wait while over the bound"
        );
        queue.recv().await.expect("queued");
        queue.recv().await.expect("queued");
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("room() wakes once the writer took enough")
            .expect("no panic");
        while queue.try_recv().is_ok() {}
        assert_eq!(sink.queued(), 0, "every event taken leaves the budget");
    }

    #[tokio::test]
    async fn room_does_not_wait_on_a_closed_store() {
        let (sink, queue) = EventSink::with_limit(1);
        drop(queue);
        sink.emit(call("x"));
        tokio::time::timeout(std::time::Duration::from_secs(5), sink.room())
            .await
            .expect("a closed store does not hold the layers");
    }
}
