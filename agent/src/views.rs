//! `toolwall mcp ...`: what the layers recorded, as tables for people or JSON lines for tools.
//!
//! Reads the running daemon's API; with `--db` (or when no daemon answers, said on stderr)
//! reads the database directly, correlating the stored events with the same code the daemon
//! uses.

mod calls;
mod events;
mod table;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::{
    client::ApiClient,
    config::Config,
    events::EventQuery,
    registry::{Registry, ServerInfo, ToolEntry},
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

/// Rows a view shows without `--since` or `--limit`.
const LATEST: usize = 50;

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
            View::Calls { common, filters } => calls::calls(&common, &filters).await,
            View::Events {
                common,
                filters,
                types,
            } => events::events(&common, &filters, types).await,
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

#[cfg(test)]
mod tests;
