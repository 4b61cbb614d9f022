//! The records the correlator hands out: one per tool call, with what each layer saw of it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::decision::Action;

/// Why a record with cut arguments stands alone.
pub(crate) const CUT_REASON: &str =
    "arguments over the record's bound were kept as a marker: not compared, so not joined";

/// Which layers saw the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// Asked for by the LLM and executed.
    Joined,
    /// Seen at the LLM layer only: blocked there, or never run.
    InterceptOnly,
    /// Executed with no matching LLM tool call: a call the LLM never asked for (or one the
    /// LLM layer blocked and something ran anyway). Worth an alert.
    ExecutionOnly,
    /// A connection to an MCP server with no call around it.
    ConnectionOnly,
    /// What the kernel layer's watch found (a detached program put back, a process moved
    /// back, events lost): shown among the calls, so a loss or an escape attempt is seen where
    /// the calls are read, not only in `/health` or the event list.
    Alert,
}

/// One layer's sighting of a call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sighting {
    /// Row id of the event in the store.
    pub event_id: i64,
    /// When the layer saw it.
    pub at: DateTime<Utc>,
    /// That layer's decision.
    pub action: Action,
    /// Its reason, if any.
    pub reason: String,
    /// `llm/anthropic`, `shim`, `mcp-proxy`, `kernel`.
    pub layer: String,
}

/// One tool call across the layers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    /// Which layers saw it.
    pub kind: RecordKind,
    /// The agent session.
    pub session_id: String,
    /// The server.
    pub server_id: String,
    /// The tool's name on its server (empty for a bare connection).
    pub tool: String,
    /// The overall decision: blocked if any layer blocked it.
    pub action: Action,
    /// The blocking layer's reason, else the first non-empty one.
    pub reason: String,
    /// Canonical hash of the arguments, when known.
    pub args_hash: Option<String>,
    /// The arguments were over the record's bound and kept as a marker only: compared with
    /// nothing, so the record joins no other layer's sighting (its reason says so).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub args_cut: bool,
    /// The LLM layer's sighting.
    pub intercept: Option<Sighting>,
    /// The shim's or filter proxy's sighting.
    pub execution: Option<Sighting>,
    /// The kernel's sighting.
    pub connection: Option<Sighting>,
}

impl CallRecord {
    /// When the call was first seen.
    pub fn first_seen(&self) -> DateTime<Utc> {
        [&self.intercept, &self.execution, &self.connection]
            .into_iter()
            .flatten()
            .map(|s| s.at)
            .min()
            .unwrap_or_default()
    }

    /// Milliseconds from the LLM's tool call to its execution.
    pub fn intercept_to_execution_ms(&self) -> Option<f64> {
        let (i, e) = (self.intercept.as_ref()?, self.execution.as_ref()?);
        Some((e.at - i.at).num_microseconds()? as f64 / 1000.0)
    }

    pub(super) fn kind_now(&self) -> RecordKind {
        match (&self.intercept, &self.execution) {
            (Some(_), Some(_)) => RecordKind::Joined,
            (Some(_), None) => RecordKind::InterceptOnly,
            (None, Some(_)) => RecordKind::ExecutionOnly,
            (None, None) => RecordKind::ConnectionOnly,
        }
    }

    pub(super) fn settle(mut self) -> Self {
        self.kind = self.kind_now();
        let sightings = [&self.intercept, &self.execution, &self.connection];
        let blocked = sightings
            .iter()
            .copied()
            .flatten()
            .find(|s| s.action == Action::Block);
        self.action = if blocked.is_some() {
            Action::Block
        } else {
            Action::Allow
        };
        self.reason = blocked
            .map(|s| s.reason.clone())
            .or_else(|| {
                sightings
                    .iter()
                    .copied()
                    .flatten()
                    .map(|s| s.reason.clone())
                    .find(|r| !r.is_empty())
            })
            .unwrap_or_default();
        if self.args_cut && self.reason.is_empty() {
            self.reason = CUT_REASON.to_owned();
        }
        self
    }
}
