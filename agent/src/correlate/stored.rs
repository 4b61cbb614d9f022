//! Correlation over the event store, and the one filter every view of call records applies
//! (so that the daemon's `/api/calls` and `toolwall mcp calls --db` show the same calls).

use crate::events::{EventQuery, Store, StoreError};

use super::{CallRecord, Correlator};

impl CallRecord {
    /// Whether the record passes a query's session, server, tool and action filters.
    pub fn matches(&self, q: &EventQuery) -> bool {
        q.session.as_ref().is_none_or(|s| &self.session_id == s)
            && q.server.as_ref().is_none_or(|s| &self.server_id == s)
            && q.tool.as_ref().is_none_or(|t| &self.tool == t)
            && q.action.as_ref().is_none_or(|a| self.action.as_str() == a)
    }
}

/// Correlated records over the stored events that match the filters.
pub(crate) fn correlate_stored(
    store: &Store,
    q: &EventQuery,
    window: std::time::Duration,
) -> Result<Vec<CallRecord>, StoreError> {
    // Correlate over all call events in the time range and filter the records after: a filter
    // on one side's fields must not cut the other side of a join away.
    let events = store.query(&EventQuery {
        types: vec![
            "mcp_tool_call_intercepted".into(),
            "mcp_tool_called".into(),
            "mcp_network_connection".into(),
            // Records of their own, shown among the calls (`RecordKind::Alert`).
            "kernel_alert".into(),
            "mcp_result_inspected".into(),
        ],
        since_ns: q.since_ns,
        ..Default::default()
    })?;
    let records = Correlator::batch(window, crate::registry::value_hash, &events);
    Ok(records.into_iter().filter(|r| r.matches(q)).collect())
}
