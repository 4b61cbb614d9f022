//! Events: what every layer records, the sink they record into, and the store behind it.
//!
//! Layers never touch the database: they hand events to an [`EventSink`] (a channel send, no
//! I/O on the hot path) and one writer task batches them into SQLite.

pub(crate) mod bound;
mod store;
mod types;

pub(crate) use store::{Committer, EventQuery, StoreError, StoreHealth, spawn_committing_writer};
pub(crate) use store::{OpenError, connect};
pub use store::{Store, StoredEvent, spawn_writer};
pub use types::*;

use tokio::sync::mpsc;

/// Where layers put events. Cheap to clone; sending never blocks and never fails loudly on the
/// hot path (a closed store is logged once per sink clone).
#[derive(Clone, Debug)]
pub struct EventSink {
    tx: mpsc::UnboundedSender<Event>,
}

impl EventSink {
    /// A sink and the receiving end (the store's writer task, or a test).
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx }, rx)
    }

    /// Records an event.
    pub fn emit(&self, event: Event) {
        if self.tx.send(event).is_err() {
            tracing::error!("event store is gone; an event was not recorded");
        }
    }
}
