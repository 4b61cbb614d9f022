//! The one filter every view of call records applies (so that the daemon's `/api/calls`, its
//! live stream and `toolwall mcp calls --db` show the same calls).

use crate::events::EventQuery;

use super::CallRecord;

impl CallRecord {
    /// Whether the record passes a query's session, server, tool and action filters.
    pub fn matches(&self, q: &EventQuery) -> bool {
        q.session.as_ref().is_none_or(|s| &self.session_id == s)
            && q.server.as_ref().is_none_or(|s| &self.server_id == s)
            && q.tool.as_ref().is_none_or(|t| &self.tool == t)
            && q.action.as_ref().is_none_or(|a| self.action.as_str() == a)
    }
}
