//! The registry's SQLite tables: what makes registered tools and pins survive a restart and
//! lets the daemon and the shims (separate processes) share them.
//!
//! Three tables, in the same database file as the events (tables prefixed `mcp_`, created
//! if missing, never touching the event store's tables):
//! `mcp_tools` (one row per server and tool: the latest definition and its hash),
//! `mcp_tool_pins` (the trusted hash per server and tool) and `mcp_pinned_servers` (servers
//! whose tool set is sealed: a tool appearing later is drift).

use std::path::Path;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::RegistryError;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS mcp_tools (
    server_id     TEXT NOT NULL,
    tool_name     TEXT NOT NULL,
    server_type   TEXT NOT NULL,
    server_addr   TEXT NOT NULL,
    tool_hash     TEXT NOT NULL,
    definition    TEXT NOT NULL,
    registered_at TEXT NOT NULL,
    PRIMARY KEY (server_id, tool_name)
);
CREATE TABLE IF NOT EXISTS mcp_tool_pins (
    server_id  TEXT NOT NULL,
    tool_name  TEXT NOT NULL,
    tool_hash  TEXT NOT NULL,
    pinned_at  TEXT NOT NULL,
    PRIMARY KEY (server_id, tool_name)
);
CREATE TABLE IF NOT EXISTS mcp_pinned_servers (
    server_id  TEXT NOT NULL PRIMARY KEY,
    pinned_at  TEXT NOT NULL
);
";

/// A `mcp_tools` row.
pub(super) struct ToolRow {
    pub server_id: String,
    pub tool_name: String,
    pub server_type: String,
    pub server_addr: String,
    pub tool_hash: String,
    pub registered_at: DateTime<Utc>,
}

/// A `mcp_tool_pins` row.
pub(super) struct PinRow {
    pub server_id: String,
    pub tool_name: String,
    pub tool_hash: String,
    pub pinned_at: DateTime<Utc>,
}

/// Everything the registry keeps on disk.
pub(super) struct Snapshot {
    pub tools: Vec<ToolRow>,
    pub pins: Vec<PinRow>,
    pub sealed: Vec<(String, DateTime<Utc>)>,
}

/// Opens (creating if needed) the database and the registry tables.
pub(super) fn open(path: &Path) -> Result<Connection, RegistryError> {
    let conn = crate::events::connect(path).map_err(|e| match e {
        crate::events::OpenError::Private(path, source) => RegistryError::Io { path, source },
        crate::events::OpenError::Sqlite(e) => RegistryError::Sqlite(e),
    })?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

/// An in-memory database with the same tables (tests, `config check`).
pub(super) fn open_in_memory() -> Result<Connection, RegistryError> {
    let conn = Connection::open_in_memory()?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

/// Reads everything.
pub(super) fn load(conn: &Connection) -> Result<Snapshot, RegistryError> {
    let mut stmt = conn.prepare(
        "SELECT server_id, tool_name, server_type, server_addr, tool_hash, registered_at
         FROM mcp_tools",
    )?;
    let tools = stmt
        .query_map([], |row| {
            Ok(ToolRow {
                server_id: row.get(0)?,
                tool_name: row.get(1)?,
                server_type: row.get(2)?,
                server_addr: row.get(3)?,
                tool_hash: row.get(4)?,
                registered_at: parse_time(&row.get::<_, String>(5)?),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut stmt =
        conn.prepare("SELECT server_id, tool_name, tool_hash, pinned_at FROM mcp_tool_pins")?;
    let pins = stmt
        .query_map([], |row| {
            Ok(PinRow {
                server_id: row.get(0)?,
                tool_name: row.get(1)?,
                tool_hash: row.get(2)?,
                pinned_at: parse_time(&row.get::<_, String>(3)?),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut stmt = conn.prepare("SELECT server_id, pinned_at FROM mcp_pinned_servers")?;
    let sealed = stmt
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                parse_time(&row.get::<_, String>(1)?),
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Snapshot {
        tools,
        pins,
        sealed,
    })
}

/// Upserts tool definitions in one transaction.
pub(super) fn save_tools(
    conn: &mut Connection,
    rows: &[(ToolRow, String)],
) -> Result<(), RegistryError> {
    let tx = conn.transaction()?;
    {
        let mut stmt = tx.prepare(
            "INSERT INTO mcp_tools
                 (server_id, tool_name, server_type, server_addr, tool_hash, definition, registered_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (server_id, tool_name) DO UPDATE SET
                 server_type = excluded.server_type, server_addr = excluded.server_addr,
                 tool_hash = excluded.tool_hash, definition = excluded.definition,
                 registered_at = excluded.registered_at",
        )?;
        for (row, definition) in rows {
            stmt.execute(params![
                row.server_id,
                row.tool_name,
                row.server_type,
                row.server_addr,
                row.tool_hash,
                definition,
                row.registered_at.to_rfc3339(),
            ])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// Pins hashes (replacing earlier pins) and optionally seals a server, in one transaction.
#[cfg(test)]
pub(super) fn save_pins(
    conn: &mut Connection,
    pins: &[PinRow],
    seal: Option<(&str, DateTime<Utc>)>,
) -> Result<(), RegistryError> {
    let tx = conn.transaction()?;
    {
        let mut stmt = tx.prepare(
            "INSERT INTO mcp_tool_pins (server_id, tool_name, tool_hash, pinned_at)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (server_id, tool_name) DO UPDATE SET
                 tool_hash = excluded.tool_hash, pinned_at = excluded.pinned_at",
        )?;
        for pin in pins {
            stmt.execute(params![
                pin.server_id,
                pin.tool_name,
                pin.tool_hash,
                pin.pinned_at.to_rfc3339()
            ])?;
        }
    }
    if let Some((server_id, at)) = seal {
        tx.execute(
            "INSERT OR IGNORE INTO mcp_pinned_servers (server_id, pinned_at) VALUES (?1, ?2)",
            params![server_id, at.to_rfc3339()],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Trust-on-first-use, safe against other processes doing the same: in one write
/// transaction, unless the server is already sealed, pins each of `tools` (name, hash) that
/// has no pin yet (an existing pin is never replaced here), and with `seal` also pins every
/// stored tool of the server and seals it. Returns the server's pins and seal time as stored
/// afterwards, so the caller's memory matches what every process sees.
pub(super) fn trust_first(
    conn: &mut Connection,
    server_id: &str,
    tools: &[(&str, &str)],
    seal: bool,
    now: DateTime<Utc>,
) -> Result<(Vec<PinRow>, Option<DateTime<Utc>>), RegistryError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let sealed: Option<String> = tx
        .query_row(
            "SELECT pinned_at FROM mcp_pinned_servers WHERE server_id = ?1",
            params![server_id],
            |row| row.get(0),
        )
        .optional()?;
    if sealed.is_none() {
        let at = now.to_rfc3339();
        {
            let mut stmt = tx.prepare(
                "INSERT OR IGNORE INTO mcp_tool_pins (server_id, tool_name, tool_hash, pinned_at)
                 VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (tool, hash) in tools {
                stmt.execute(params![server_id, tool, hash, at])?;
            }
        }
        if seal {
            tx.execute(
                "INSERT OR IGNORE INTO mcp_tool_pins (server_id, tool_name, tool_hash, pinned_at)
                 SELECT server_id, tool_name, tool_hash, ?2 FROM mcp_tools WHERE server_id = ?1",
                params![server_id, at],
            )?;
            tx.execute(
                "INSERT OR IGNORE INTO mcp_pinned_servers (server_id, pinned_at) VALUES (?1, ?2)",
                params![server_id, at],
            )?;
        }
    }
    let pins = {
        let mut stmt = tx.prepare(
            "SELECT server_id, tool_name, tool_hash, pinned_at FROM mcp_tool_pins WHERE server_id = ?1",
        )?;
        stmt.query_map(params![server_id], |row| {
            Ok(PinRow {
                server_id: row.get(0)?,
                tool_name: row.get(1)?,
                tool_hash: row.get(2)?,
                pinned_at: parse_time(&row.get::<_, String>(3)?),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?
    };
    let sealed_at = tx
        .query_row(
            "SELECT pinned_at FROM mcp_pinned_servers WHERE server_id = ?1",
            params![server_id],
            |row| row.get::<_, String>(0),
        )
        .optional()?
        .map(|t| parse_time(&t));
    tx.commit()?;
    Ok((pins, sealed_at))
}

/// The stored definition of one tool (the CLI's detail view; a listing's restatements).
pub(super) fn definition(
    conn: &Connection,
    server_id: &str,
    tool: &str,
) -> Result<Option<String>, RegistryError> {
    // Cached: a listing asks it for every tool whose hash did not change.
    Ok(conn
        .prepare_cached("SELECT definition FROM mcp_tools WHERE server_id = ?1 AND tool_name = ?2")?
        .query_row(params![server_id, tool], |row| row.get(0))
        .optional()?)
}

/// A server's stored definitions (a new policy judges what earlier listings showed).
pub(super) fn definitions_of(
    conn: &Connection,
    server_id: &str,
) -> Result<Vec<String>, RegistryError> {
    let mut stmt = conn.prepare_cached("SELECT definition FROM mcp_tools WHERE server_id = ?1")?;
    let rows = stmt.query_map(params![server_id], |row| row.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Times are written as RFC 3339; a row someone edited by hand into nonsense reads as the
/// epoch rather than failing the whole load.
fn parse_time(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_default()
}
