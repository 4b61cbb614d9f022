//! `toolwall mcp ...`: what the layers recorded, as tables for people or JSON lines for tools.
//!
//! Reads the running daemon's API; with `--db` (or when no daemon answers, said on stderr)
//! reads the database directly, correlating the stored events with the same code the daemon
//! uses.

mod table;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::{
    client::ApiClient,
    config::Config,
    correlate::{CallRecord, Correlator, Direction, MAX_LIMIT, PageQuery, read_page},
    events::{Event, EventQuery, Store, StoredEvent},
    registry::{Registry, ServerInfo, ToolEntry, value_hash},
};
pub(crate) use table::Output;

/// Arguments of `toolwall mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(subcommand)]
    view: View,
}

#[derive(Debug, Subcommand)]
enum View {
    /// Correlated tool calls: one row per call, joined across the LLM, MCP and kernel layers.
    Calls {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        filters: Filters,
    },
    /// Raw events, oldest first.
    Events {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        filters: Filters,
        /// Only events of this type (repeatable): mcp_tool_call_intercepted, mcp_tool_called,
        /// mcp_network_connection, mcp_tool_seen, mcp_tool_changed, kernel_alert.
        #[arg(long = "type", value_name = "TYPE")]
        types: Vec<String>,
    },
    /// Tools in the registry.
    Tools {
        #[command(flatten)]
        common: Common,
    },
    /// Servers in the registry.
    Servers {
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, Args)]
struct Common {
    /// Read this database directly instead of asking the daemon.
    #[arg(long)]
    db: Option<PathBuf>,
    /// Configuration (for the daemon's socket and the default database).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// JSON lines instead of a table.
    #[arg(long)]
    json: bool,
    /// Keep printing new rows as they come (Ctrl-C to stop).
    #[arg(long, short)]
    follow: bool,
}

#[derive(Debug, Args)]
struct Filters {
    /// Only this session.
    #[arg(long)]
    session: Option<String>,
    /// Only this server.
    #[arg(long)]
    server: Option<String>,
    /// Only this tool.
    #[arg(long)]
    tool: Option<String>,
    /// Only calls with this decision.
    #[arg(long, value_parser = ["allow", "block"])]
    action: Option<String>,
    /// Only since this time: RFC 3339 (`2026-11-22T10:00:00Z`) or an age (`90s`, `10m`, `2h`, `1d`).
    #[arg(long)]
    since: Option<String>,
    /// Only before this time, written as for `--since`.
    #[arg(long)]
    until: Option<String>,
    /// At most this many rows: the latest ones, or the first ones from `--since` (default: the
    /// latest 50 without `--since`, every one from it).
    #[arg(long)]
    limit: Option<usize>,
}

impl Filters {
    fn query(&self) -> anyhow::Result<EventQuery> {
        Ok(EventQuery {
            session: self.session.clone(),
            server: self.server.clone(),
            tool: self.tool.clone(),
            action: self.action.clone(),
            since_ns: self.since.as_deref().map(parse_since).transpose()?,
            until_ns: self.until.as_deref().map(parse_since).transpose()?,
            ..Default::default()
        })
    }
}

/// `--since`, `--until`: RFC 3339, or an age back from now.
fn parse_since(text: &str) -> anyhow::Result<i64> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return t
            .timestamp_nanos_opt()
            .context("--since: time out of range");
    }
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: i64 = number
        .parse()
        .with_context(|| format!("--since {text:?}: RFC 3339 time or an age like 10m"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => anyhow::bail!("--since {text:?}: the unit is s, m, h or d"),
    };
    let now = chrono::Utc::now()
        .timestamp_nanos_opt()
        .context("clock out of range")?;
    Ok(now - secs * 1_000_000_000)
}

/// Where rows come from.
enum Source {
    Daemon(ApiClient),
    Db { path: PathBuf, window: Duration },
}

async fn source(common: &Common) -> anyhow::Result<Source> {
    let config = Config::load(common.config.as_deref())?;
    let window = Duration::from_millis(config.correlator.window_ms);
    if let Some(path) = &common.db {
        anyhow::ensure!(path.exists(), "no database at {}", path.display());
        return Ok(Source::Db {
            path: path.clone(),
            window,
        });
    }
    let socket = crate::config::prepare_socket_dir(config.api.socket.as_deref(), false)?;
    match ApiClient::connect(&socket).await {
        Ok(client) => Ok(Source::Daemon(client)),
        Err(_) => {
            let path = config.store_path();
            eprintln!(
                "toolwall: no daemon on {}; reading {} directly",
                socket.display(),
                path.display()
            );
            anyhow::ensure!(
                path.exists(),
                "no database at {} either; pass --db PATH",
                path.display()
            );
            Ok(Source::Db { path, window })
        }
    }
}

/// Runs a view.
pub(crate) fn run(args: McpArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("start the async runtime")?;
    runtime.block_on(async move {
        match args.view {
            View::Calls { common, filters } => calls(&common, &filters).await,
            View::Events {
                common,
                filters,
                types,
            } => events(&common, &filters, types).await,
            View::Tools { common } => tools(&common).await,
            View::Servers { common } => servers(&common).await,
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

fn query_string(q: &EventQuery) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for t in &q.types {
        s.append_pair("type", t);
    }
    for (k, v) in [
        ("session", &q.session),
        ("server", &q.server),
        ("tool", &q.tool),
        ("action", &q.action),
    ] {
        if let Some(v) = v {
            s.append_pair(k, v);
        }
    }
    for (k, v) in [("since", q.since_ns), ("until", q.until_ns)] {
        if let Some(v) = v {
            s.append_pair(k, &v.to_string());
        }
    }
    if let Some(limit) = q.limit {
        s.append_pair("limit", &limit.to_string());
    }
    s.finish()
}

/// Rows shown without `--since` or `--limit`.
const LATEST: usize = 50;

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
async fn calls(common: &Common, filters: &Filters) -> anyhow::Result<()> {
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

/// `toolwall mcp events`: the latest events, or every event from `--since` on, page by page,
/// then `--follow`.
async fn events(common: &Common, filters: &Filters, types: Vec<String>) -> anyhow::Result<()> {
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

async fn tools(common: &Common) -> anyhow::Result<()> {
    let tools: Vec<ToolEntry> = match source(common).await? {
        Source::Daemon(api) => api.get_json("/api/tools").await?,
        Source::Db { path, .. } => Registry::open(&path)?
            .tools()
            .iter()
            .map(|t| (**t).clone())
            .collect(),
    };
    let mut out = Output::new(
        common.json,
        &["SERVER", "TOOL", "TYPE", "ADDRESS", "HASH", "REGISTERED"],
    );
    for t in &tools {
        let cells = vec![
            t.server_id.clone(),
            t.tool.clone(),
            t.server_type.clone(),
            t.server_addr.clone(),
            t.tool_hash.chars().take(12).collect(),
            t.registered_at.format("%Y-%m-%d %H:%M:%S").to_string(),
        ];
        out.row(t, cells)?;
    }
    out.flush()
}

async fn servers(common: &Common) -> anyhow::Result<()> {
    let servers: Vec<ServerInfo> = match source(common).await? {
        Source::Daemon(api) => api.get_json("/api/servers").await?,
        Source::Db { path, .. } => Registry::open(&path)?.servers(),
    };
    let mut out = Output::new(
        common.json,
        &["SERVER", "TYPE", "ADDRESS", "TOOLS", "PINNED SET"],
    );
    for s in &servers {
        let sealed = s
            .sealed_at
            .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_else(|| "-".into());
        out.row(
            s,
            vec![
                s.server_id.clone(),
                s.server_type.clone(),
                s.server_addr.clone(),
                s.tool_count.to_string(),
                sealed,
            ],
        )?;
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

#[cfg(test)]
mod tests;
