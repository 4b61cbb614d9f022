//! `toolwall mcp calls`: correlated call records, a page at a time.

use std::time::Duration;

use super::{Common, Filters, LATEST, Output, Source, query_string, source};
use crate::{
    client::ApiClient,
    correlate::{CallRecord, Correlator, Direction, MAX_LIMIT, PageQuery, read_page},
    events::{EventQuery, Store},
    registry::value_hash,
};

/// Pages of call records from the daemon or the database, in one direction.
enum Pager {
    Daemon {
        api: ApiClient,
        next: Option<String>,
    },
    Db {
        store: Box<Store>,
        q: Box<PageQuery>,
        window: Duration,
        done: bool,
    },
}

impl Pager {
    /// Whether a page may follow.
    fn has_more(&self) -> bool {
        match self {
            Pager::Daemon { next, .. } => next.is_some(),
            Pager::Db { done, .. } => !done,
        }
    }

    /// The next page (oldest first within it), or `None` at the end.
    async fn next(&mut self) -> anyhow::Result<Option<Vec<CallRecord>>> {
        match self {
            Pager::Daemon { api, next } => {
                let Some(path) = next.take() else {
                    return Ok(None);
                };
                let (records, then, partial) = api.get_page(&path).await?;
                if let Some(why) = partial {
                    eprintln!("toolwall: {why}");
                }
                *next = then;
                Ok(Some(records))
            }
            Pager::Db {
                store,
                q,
                window,
                done,
            } => {
                if *done {
                    return Ok(None);
                }
                let page = read_page(store, q, *window)?;
                if let Some(why) = &page.partial {
                    eprintln!("toolwall: {why}");
                }
                q.cursor = page.next;
                *done = page.next.is_none();
                Ok(Some(page.records))
            }
        }
    }
}

/// `toolwall mcp calls`: the latest calls (a page back from `--until`), or every call from
/// `--since` on (page after page, printed as they come), then `--follow`. What a page holds is
/// bounded, whatever the store's size.
pub(super) async fn calls(common: &Common, filters: &Filters) -> anyhow::Result<()> {
    let q = filters.query()?;
    let forward = q.since_ns.is_some();
    // Backward, rows are held until the oldest page came, so `--limit` bounds them.
    let wanted = filters
        .limit
        .unwrap_or(if forward { usize::MAX } else { LATEST });
    let page_size = wanted.clamp(1, MAX_LIMIT);
    let source = source(common).await?;
    let mut pager = match &source {
        Source::Daemon(api) => Pager::Daemon {
            api: api.clone(),
            next: Some(format!(
                "/api/calls?{}",
                query_string(&EventQuery {
                    limit: Some(page_size),
                    ..q.clone()
                })
            )),
        },
        Source::Db { path, window } => Pager::Db {
            store: Box::new(Store::open(path)?),
            q: Box::new(PageQuery {
                filters: q.clone(),
                limit: page_size,
                direction: if forward {
                    Direction::Newer
                } else {
                    Direction::Older
                },
                cursor: None,
            }),
            window: *window,
            done: false,
        },
    };
    let mut out = Output::new(common.json, &CALL_COLUMNS);
    let mut shown = 0usize;
    let mut more = false;
    if forward {
        while let Some(page) = pager.next().await? {
            for r in page.into_iter().take(wanted - shown) {
                out.row(&r, call_cells(&r))?;
                shown += 1;
            }
            // The first page sizes the table's columns; later ones print in its widths.
            out.flush()?;
            if shown >= wanted {
                more = true;
                break;
            }
        }
    } else {
        let mut pages = Vec::new();
        while shown < wanted {
            let Some(mut page) = pager.next().await? else {
                break;
            };
            let room = wanted - shown;
            if page.len() > room {
                page.drain(..page.len() - room);
            }
            shown += page.len();
            pages.push(page);
        }
        more = shown >= wanted && pager.has_more();
        for r in pages.into_iter().rev().flatten() {
            out.row(&r, call_cells(&r))?;
        }
    }
    out.flush()?;
    if more && filters.limit.is_none() && !common.json {
        eprintln!(
            "toolwall: the latest {shown} calls; --limit N for more, --since/--until for a time span"
        );
    }
    if !common.follow {
        return Ok(());
    }
    match source {
        Source::Daemon(api) => {
            api.follow("/api/stream/calls", |data| {
                let r: CallRecord = serde_json::from_str(data)?;
                if r.matches(&q) {
                    out.row(&r, call_cells(&r))
                } else {
                    Ok(())
                }
            })
            .await?
        }
        Source::Db { path, window } => {
            // New events only, through a live correlator of our own.
            let store = Store::open(&path)?;
            let mut last = store.last_id()?.unwrap_or(0);
            let mut correlator = Correlator::new(window, value_hash);
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let new = store.query(&EventQuery {
                    after_id: Some(last),
                    limit: Some(4096),
                    ..Default::default()
                })?;
                for e in &new {
                    last = e.id;
                    for r in correlator.push(e) {
                        if r.matches(&q) {
                            out.row(&r, call_cells(&r))?;
                        }
                    }
                }
                for r in correlator.expire(chrono::Utc::now()) {
                    if r.matches(&q) {
                        out.row(&r, call_cells(&r))?;
                    }
                }
            }
        }
    }
    out.flush()
}

const CALL_COLUMNS: [&str; 10] = [
    "TIME",
    "SESSION",
    "SERVER",
    "TOOL",
    "DECISION",
    "LLM",
    "EXECUTED",
    "CONNECTION",
    "LLM→EXEC",
    "REASON",
];

fn call_cells(r: &CallRecord) -> Vec<String> {
    let seen = |s: &Option<crate::correlate::Sighting>| match s {
        None => "-".to_string(),
        Some(s) if s.action == crate::decision::Action::Block => format!("blocked ({})", s.layer),
        Some(s) => s.layer.clone(),
    };
    vec![
        r.first_seen().format("%H:%M:%S%.3f").to_string(),
        r.session_id.clone(),
        r.server_id.clone(),
        if r.tool.is_empty() {
            "(connection)".into()
        } else {
            r.tool.clone()
        },
        r.action.as_str().into(),
        seen(&r.intercept),
        seen(&r.execution),
        seen(&r.connection),
        r.intercept_to_execution_ms()
            .map(|ms| format!("{ms:.0} ms"))
            .unwrap_or_default(),
        r.reason.clone(),
    ]
}
