//! What a reader asks the store for: the filters every view shares, and the SQL they become.

use rusqlite::types::Value as SqlValue;

use crate::events::Event;

/// What to read back; every field narrows the result.
#[derive(Clone, Debug, Default)]
pub struct EventQuery {
    /// Only these types (empty = all).
    pub types: Vec<String>,
    /// Only this session.
    pub session: Option<String>,
    /// Only this server.
    pub server: Option<String>,
    /// Only this tool.
    pub tool: Option<String>,
    /// Only this action (`allow` / `block`).
    pub action: Option<String>,
    /// Only events at or after this time (unix ns).
    pub since_ns: Option<i64>,
    /// Only events before this time (unix ns).
    pub until_ns: Option<i64>,
    /// Only rows after this id.
    pub after_id: Option<i64>,
    /// Only rows before this id.
    pub before_id: Option<i64>,
    /// At most this many rows.
    pub limit: Option<usize>,
    /// Newest rows first (a page back from `before_id`), instead of oldest first.
    pub newest_first: bool,
}

impl EventQuery {
    /// The `SELECT` of `columns` for this query, and its arguments; in the query's order of
    /// ids unless `order` is given.
    pub(super) fn sql(&self, columns: &str, order: Option<&str>) -> (String, Vec<SqlValue>) {
        let mut sql = format!("SELECT {columns} FROM events WHERE 1=1");
        let mut args: Vec<SqlValue> = Vec::new();
        if !self.types.is_empty() {
            sql += &format!(" AND type IN ({})", vec!["?"; self.types.len()].join(","));
            args.extend(self.types.iter().cloned().map(SqlValue::Text));
        }
        for (column, value) in [
            ("session_id", &self.session),
            ("server_id", &self.server),
            ("tool_name", &self.tool),
            ("action", &self.action),
        ] {
            if let Some(v) = value {
                sql += &format!(" AND {column} = ?");
                args.push(SqlValue::Text(v.clone()));
            }
        }
        for (bound, value) in [
            ("ts_ns >= ?", self.since_ns),
            ("ts_ns < ?", self.until_ns),
            ("id > ?", self.after_id),
            ("id < ?", self.before_id),
        ] {
            if let Some(v) = value {
                sql += " AND ";
                sql += bound;
                args.push(SqlValue::Integer(v));
            }
        }
        sql += match (order, self.newest_first) {
            (Some(order), _) => order,
            (None, true) => " ORDER BY id DESC",
            (None, false) => " ORDER BY id",
        };
        if let Some(limit) = self.limit {
            sql += &format!(" LIMIT {limit}");
        }
        (sql, args)
    }

    /// Whether an event passes the type, session, server, tool and action filters (the store
    /// applies the same ones in SQL; a live follower applies them here).
    pub fn matches(&self, event: &Event) -> bool {
        let keys = event.keys();
        (self.types.is_empty() || self.types.iter().any(|t| t == event.kind()))
            && self.session.as_deref().is_none_or(|s| s == keys.session)
            && self.server.as_deref().is_none_or(|s| s == keys.server)
            && self.tool.as_deref().is_none_or(|t| t == keys.tool)
            && self
                .action
                .as_deref()
                .is_none_or(|a| a == keys.action.as_str())
    }
}
