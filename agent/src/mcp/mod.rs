//! Layer 2: the MCP stdio shim and the MCP tool-filter proxy, and the MCP client the daemon
//! uses to discover network servers' tools.
//!
//! [`filter`] is sans-IO (bytes in, bytes out) over [`framing`]; [`shim`], [`proxy`] and
//! [`client`] are the I/O around it.

pub mod client;
pub mod deny;
pub mod filter;
pub mod framing;
pub mod fuzzing;
pub mod proxy;
pub mod shim;
pub mod sse;

use crate::events::EventSink;

/// An event sink for the stand-alone commands until they write to the event store: events are
/// logged (as JSON, at `info` on the `toolwall::events` target) instead of dropped. Must be
/// called inside a Tokio runtime.
pub fn log_events() -> EventSink {
    let (sink, mut rx) = EventSink::channel();
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            match serde_json::to_string(&event) {
                Ok(json) => tracing::info!(target: "toolwall::events", "{json}"),
                Err(error) => tracing::warn!(%error, "cannot serialise an event"),
            }
        }
    });
    sink
}
