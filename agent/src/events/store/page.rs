//! One page of stored events in time that does not grow with the store: the rows are walked in
//! id order from the cursor, at most a budget of them, and the filters are applied to their
//! indexed columns before a body is decoded. A filter that matches little (one tool of many, the
//! blocked calls) therefore costs one budget a page, not a scan of the table; a page that ran
//! out of budget says so and where to go on (`a_rare_filter_reads_a_budget_a_page`).

use rusqlite::params_from_iter;
use rusqlite::types::Value as SqlValue;

use super::{EventQuery, Store, StoreError, StoredEvent};
use crate::events::Event;

/// Rows a page reads at most (`/api/events`, `toolwall mcp events`): a filter that matches
/// little answers a partial page with a cursor on, instead of scanning the store.
pub(crate) const PAGE_BUDGET: usize = 50_000;

/// One page of events.
#[derive(Debug, Default)]
pub(crate) struct EventsPage {
    /// The events, in the query's order.
    pub events: Vec<StoredEvent>,
    /// The cursor (an event id) the next page goes on from, the same way; `None` at the end.
    pub next: Option<i64>,
    /// Whether the page stopped at its budget of rows before it was full.
    pub partial: bool,
}

impl Store {
    /// One page of `q`: at most `q.limit` events, reading at most `budget` rows, from
    /// `after_id` on (or, with `since_ns` and no cursor, from the first event by id of that time
    /// or later) or, newest first, back from `before_id`.
    pub(crate) fn events_page(
        &self,
        q: &EventQuery,
        budget: usize,
    ) -> Result<EventsPage, StoreError> {
        let limit = q.limit.unwrap_or(usize::MAX).max(1);
        let budget = budget.max(1);
        let after = match (q.after_id, q.since_ns, q.newest_first) {
            (Some(after), _, _) => Some(after),
            (None, Some(since), false) => match self.first_id_since(since)? {
                Some(id) => Some(id - 1),
                None => return Ok(EventsPage::default()),
            },
            _ => None,
        };
        let mut sql = String::from(
            "SELECT id, ts_ns, type, session_id, server_id, tool_name, action, body FROM events WHERE 1=1",
        );
        let mut args = Vec::new();
        for (bound, value) in [("id > ?", after), ("id < ?", q.before_id)] {
            if let Some(v) = value {
                sql += " AND ";
                sql += bound;
                args.push(SqlValue::Integer(v));
            }
        }
        sql += if q.newest_first {
            " ORDER BY id DESC LIMIT ?"
        } else {
            " ORDER BY id LIMIT ?"
        };
        args.push(SqlValue::Integer(i64::try_from(budget).unwrap_or(i64::MAX)));
        let mut stmt = self.conn.prepare_cached(&sql).map_err(self.sql_err())?;
        let mut rows = stmt.query(params_from_iter(args)).map_err(self.sql_err())?;
        let mut page = EventsPage::default();
        let (mut scanned, mut last) = (0usize, None);
        while let Some(row) = rows.next().map_err(self.sql_err())? {
            scanned += 1;
            let id: i64 = row.get(0).map_err(self.sql_err())?;
            last = Some(id);
            let text = |i: usize| row.get_ref(i).ok().and_then(|v| v.as_str().ok());
            let ts: i64 = row.get(1).unwrap_or_default();
            let kept = (q.types.is_empty() || q.types.iter().any(|t| Some(t.as_str()) == text(2)))
                && [
                    (&q.session, 3),
                    (&q.server, 4),
                    (&q.tool, 5),
                    (&q.action, 6),
                ]
                .iter()
                .all(|(want, i)| want.as_deref().is_none_or(|w| Some(w) == text(*i)))
                && q.since_ns.is_none_or(|since| ts >= since)
                && q.until_ns.is_none_or(|until| ts < until);
            if !kept {
                continue;
            }
            let event = match text(7) {
                Some(body) => serde_json::from_str::<Event>(body).map_err(|e| e.to_string()),
                None => Err("the body is not text".to_owned()),
            };
            let event = event.unwrap_or_else(|error| super::unreadable(row, error));
            page.events.push(StoredEvent { id, event });
            if page.events.len() == limit {
                page.next = Some(id);
                return Ok(page);
            }
        }
        if scanned == budget {
            page.next = last;
            page.partial = true;
        }
        Ok(page)
    }

    /// The lowest id of an event of time `since_ns` or later: an event stored after later-stamped
    /// ones (a shim whose clock is behind) comes before them by id, so the earliest by time is
    /// not where to start. Reads the time index from `since_ns` on, ids only.
    fn first_id_since(&self, since_ns: i64) -> Result<Option<i64>, StoreError> {
        self.conn
            .query_row(
                "SELECT min(id) FROM events WHERE ts_ns >= ?1",
                [since_ns],
                |r| r.get(0),
            )
            .map_err(self.sql_err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Action;

    fn store_of(n: usize) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("events.db")).unwrap();
        let events: Vec<_> = (0..n)
            .map(|i| {
                let action = if i % 97 == 0 {
                    Action::Block
                } else {
                    Action::Allow
                };
                crate::events::test_call(&format!("t{}", i % 7), None, action, String::new())
            })
            .collect();
        store.insert(&events).unwrap();
        (dir, store)
    }

    /// Walks every page of `q` with `budget`; the events, and how many pages were partial.
    fn walk(store: &Store, q: &EventQuery, budget: usize) -> (Vec<i64>, usize) {
        let (mut ids, mut partial, mut q) = (Vec::new(), 0, q.clone());
        loop {
            let page = store.events_page(&q, budget).unwrap();
            partial += usize::from(page.partial);
            ids.extend(page.events.iter().map(|e| e.id));
            let Some(next) = page.next else { break };
            if q.newest_first {
                q.before_id = Some(next);
            } else {
                q.after_id = Some(next);
            }
        }
        (ids, partial)
    }

    #[test]
    fn a_rare_filter_reads_a_budget_a_page() {
        let (_dir, mut store) = store_of(3000);
        for newest_first in [false, true] {
            for (tool, action, types) in [
                (None, Some("block"), vec![]),
                (Some("t3"), None, vec![]),
                (
                    Some("t3"),
                    Some("block"),
                    vec!["mcp_tool_called".to_owned()],
                ),
                (None, None, vec![]),
                (Some("nothing"), None, vec![]),
            ] {
                let q = EventQuery {
                    tool: tool.map(str::to_owned),
                    action: action.map(str::to_owned),
                    types,
                    limit: Some(10),
                    newest_first,
                    ..EventQuery::default()
                };
                let mut want: Vec<i64> = store
                    .query(&EventQuery {
                        limit: None,
                        newest_first: false,
                        ..q.clone()
                    })
                    .unwrap()
                    .iter()
                    .map(|e| e.id)
                    .collect();
                if newest_first {
                    want.reverse();
                }
                let (got, partial) = walk(&store, &q, 500);
                assert_eq!(got, want, "{q:?}");
                // Each page reads at most 500 rows: a walk of 3,000 takes at least 6 pages,
                // and those that ran out of budget before filling said so.
                let pages_needed = want.len().div_ceil(10);
                assert!(partial + pages_needed >= 6, "{q:?}: {partial} partial");
            }
        }
        // `since` finds every event of its time or later, whatever their order by id: here a
        // late one, stored last but stamped an hour before the rest.
        let mut late = crate::events::test_call("late", None, Action::Allow, String::new());
        if let Event::McpToolCalled(e) = &mut late {
            e.timestamp -= chrono::Duration::seconds(3600);
        }
        store.insert(&[late]).unwrap();
        let all = store.query(&EventQuery::default()).unwrap();
        for at in [
            all[1234].event.keys().timestamp,
            all[3000].event.keys().timestamp,
        ] {
            let since = super::super::time_ns(at);
            let q = EventQuery {
                since_ns: Some(since),
                limit: Some(100),
                ..EventQuery::default()
            };
            let (got, _) = walk(&store, &q, 700);
            let want: Vec<i64> = all
                .iter()
                .filter(|e| super::super::time_ns(e.event.keys().timestamp) >= since)
                .map(|e| e.id)
                .collect();
            assert_eq!(got, want, "since {at}");
        }
    }
}
