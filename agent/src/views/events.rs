//! `toolwall mcp events`: stored events, a page at a time.

use std::time::Duration;

use super::{Common, Filters, LATEST, Output, Source, query_string, source};
use crate::events::{Event, EventQuery, Store, StoredEvent};

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
    // One page: from the daemon (which pages the same way) or the database.
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
            let mut events: Vec<StoredEvent> = match (source, db) {
                (Source::Daemon(api), _) => {
                    let mut path = format!("/api/events?{}", query_string(&q));
                    for (k, v) in [("after", q.after_id), ("before", q.before_id)] {
                        if let Some(v) = v {
                            path += &format!("&{k}={v}");
                        }
                    }
                    api.get_json(&path).await?
                }
                (_, Some(store)) => store.query(&q)?,
                (Source::Db { .. }, None) => unreachable!("the database is open"),
            };
            // Oldest first within a page, from either source.
            events.sort_by_key(|e| e.id);
            anyhow::Ok(events)
        }
    };
    let mut last = 0;
    let mut shown = 0usize;
    let mut cursor = None;
    let mut more = false;
    if forward {
        loop {
            let events = page(cursor).await?;
            let full = events.len() == page_size;
            for e in events.iter().take(wanted - shown) {
                last = e.id;
                out.row(e, event_cells(e))?;
                shown += 1;
            }
            out.flush()?;
            cursor = Some(last);
            if shown >= wanted || !full {
                more = full;
                break;
            }
        }
    } else {
        let mut pages = Vec::new();
        while shown < wanted {
            let mut events = page(cursor).await?;
            let full = events.len() == page_size;
            cursor = events.first().map(|e| e.id);
            let room = wanted - shown;
            if events.len() > room {
                events.drain(..events.len() - room);
            }
            shown += events.len();
            last = last.max(events.last().map_or(0, |e| e.id));
            pages.push(events);
            more = full;
            if !full {
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
