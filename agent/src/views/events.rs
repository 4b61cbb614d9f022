//! `toolwall mcp events`: stored events, a page at a time.

use std::time::Duration;

use super::{Common, Filters, LATEST, Output, Source, query_string, source};
use crate::events::{Event, EventQuery, PAGE_BUDGET, Store, StoredEvent};

/// `toolwall mcp events`: the latest events, or every event from `--since` on, page by page,
/// then `--follow`.
pub(super) async fn events(
    common: &Common,
    filters: &Filters,
    types: Vec<String>,
) -> anyhow::Result<()> {
    for t in &types {
        anyhow::ensure!(
            Event::KINDS.contains(&t.as_str()),
            "unknown --type {t:?}; one of {}",
            Event::KINDS.join(", ")
        );
    }
    let q = EventQuery {
        types,
        ..filters.query()?
    };
    let forward = q.since_ns.is_some();
    let wanted = filters
        .limit
        .unwrap_or(if forward { usize::MAX } else { LATEST });
    let page_size = wanted.clamp(1, EVENTS_PAGE);
    let mut out = Output::new(common.json, &EVENT_COLUMNS);
    let source = source(common).await?;
    let db = match &source {
        Source::Db { path, .. } => Some(Store::open(path)?),
        Source::Daemon(_) => None,
    };
    // One page: from the daemon (which pages the same way) or the database; its events, oldest
    // first, and the cursor of the next (a page may stop at its budget of rows before it is
    // full, and goes on from there).
    let page = |cursor: Option<i64>| {
        let q = EventQuery {
            limit: Some(page_size),
            after_id: cursor.filter(|_| forward),
            before_id: cursor.filter(|_| !forward),
            newest_first: !forward,
            ..q.clone()
        };
        let (source, db) = (&source, &db);
        async move {
            let (mut events, next): (Vec<StoredEvent>, Option<i64>) = match (source, db) {
                (Source::Daemon(api), _) => {
                    let mut path = format!("/api/events?{}", query_string(&q));
                    for (k, v) in [("after", q.after_id), ("before", q.before_id)] {
                        if let Some(v) = v {
                            path += &format!("&{k}={v}");
                        }
                    }
                    let (events, next, _) = api.get_page(&path).await?;
                    (events, next.as_deref().and_then(cursor_of))
                }
                (_, Some(store)) => {
                    let page = store.events_page(&q, PAGE_BUDGET)?;
                    (page.events, page.next)
                }
                (Source::Db { .. }, None) => unreachable!("the database is open"),
            };
            events.sort_by_key(|e| e.id);
            anyhow::Ok((events, next))
        }
    };
    let mut last = 0;
    let mut shown = 0usize;
    let mut cursor = None;
    let mut more = false;
    if forward {
        loop {
            let (events, next) = page(cursor).await?;
            for e in events.iter().take(wanted - shown) {
                last = e.id;
                out.row(e, event_cells(e))?;
                shown += 1;
            }
            out.flush()?;
            cursor = next;
            if shown >= wanted || next.is_none() {
                more = next.is_some();
                break;
            }
        }
    } else {
        let mut pages = Vec::new();
        while shown < wanted {
            let (mut events, next) = page(cursor).await?;
            cursor = next;
            let room = wanted - shown;
            if events.len() > room {
                events.drain(..events.len() - room);
            }
            shown += events.len();
            last = last.max(events.last().map_or(0, |e| e.id));
            pages.push(events);
            more = next.is_some();
            if next.is_none() {
                break;
            }
        }
        for e in pages.into_iter().rev().flatten() {
            out.row(&e, event_cells(&e))?;
        }
    }
    out.flush()?;
    if more && filters.limit.is_none() && !common.json {
        eprintln!(
            "toolwall: the latest {shown} events; --limit N for more, --since/--until for a time span"
        );
    }
    if !common.follow {
        return Ok(());
    }
    match source {
        Source::Daemon(api) => {
            api.follow("/api/stream/events", |data| {
                let e: StoredEvent = serde_json::from_str(data)?;
                if e.id > last && q.matches(&e.event) {
                    out.row(&e, event_cells(&e))
                } else {
                    Ok(())
                }
            })
            .await
        }
        Source::Db { path, .. } => {
            let store = Store::open(&path)?;
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                for e in store.query(&EventQuery {
                    after_id: Some(last),
                    limit: Some(EVENTS_PAGE),
                    newest_first: false,
                    ..q.clone()
                })? {
                    last = e.id;
                    out.row(&e, event_cells(&e))?;
                }
            }
        }
    }
}

/// Events a page holds, from either source.
const EVENTS_PAGE: usize = 1000;

const EVENT_COLUMNS: [&str; 7] = [
    "ID",
    "TIME",
    "TYPE",
    "SESSION",
    "SERVER",
    "TOOL/ADDRESS",
    "ACTION",
];

fn event_cells(e: &StoredEvent) -> Vec<String> {
    let keys = e.event.keys();
    let (time, session, server, tool, action) = (
        keys.timestamp,
        keys.session,
        keys.server,
        keys.tool,
        keys.action.as_str(),
    );
    let tool = match &e.event {
        // A summary the kernel made under a flood: how many, since when.
        Event::McpNetworkConnection(c) if c.count > 1 => format!(
            "{tool} ×{} since {}",
            c.count,
            c.since.unwrap_or(c.timestamp).format("%H:%M:%S%.3f")
        ),
        _ => tool.into(),
    };
    vec![
        e.id.to_string(),
        time.format("%H:%M:%S%.3f").to_string(),
        e.event.kind().into(),
        session.into(),
        server.into(),
        tool,
        action.into(),
    ]
}

/// The event id a `Link` to the next page of `/api/events` goes on from.
fn cursor_of(link: &str) -> Option<i64> {
    let query = link.split_once('?')?.1;
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "before" || k == "after")
        .and_then(|(_, v)| v.parse().ok())
}
