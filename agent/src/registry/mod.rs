//! The MCP tool registry: which server offers which tool, with which definition (hash), and
//! which definitions are trusted (pins).
//!
//! Every layer asks it "what is this tool name?": the LLM interceptor sees only a name (often
//! in an agent's own form, `mcp__everything__get-sum`), the shim and the filter proxy know the
//! server. Reads come from an in-memory index behind an `RwLock` (many readers at once, no
//! allocation for a plain hit); writes go to SQLite first, then to the index, so what was
//! registered or pinned survives a restart and is shared with other processes ([`Registry::reload`]).

#![warn(missing_docs)]

mod hash;
mod index;
mod names;
mod register;
mod store;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError, RwLock},
};

use chrono::{DateTime, Utc};
use rusqlite::Connection;
use serde_json::Value;

pub(crate) use hash::tool_hash;
pub use hash::value_hash;
pub(crate) use names::{NamePattern, NamePatterns, claude_form, codex_form};

use crate::decision::{CallQuery, ToolIdentity};
use index::Index;

/// Why the registry could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegistryError {
    /// The database failed (unreadable, locked past the time-out, disk full…).
    #[error("registry database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database's directory could not be created.
    #[error("{}: cannot create the registry directory: {source}", path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// One registered tool.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ToolEntry {
    /// The tool's own name on its server (`get-sum`).
    pub tool: String,
    /// The server id.
    pub server_id: String,
    /// `stdio`, `http` or `sse`.
    pub server_type: String,
    /// `host:port` for network servers, empty for stdio.
    pub server_addr: String,
    /// SHA-256 hex of the canonical definition ([`tool_hash`]).
    pub tool_hash: String,
    /// When this definition was first registered.
    pub registered_at: DateTime<Utc>,
}

impl ToolEntry {
    /// The identity decisions carry.
    pub(crate) fn identity(&self) -> ToolIdentity {
        ToolIdentity {
            server_id: self.server_id.clone(),
            server_type: self.server_type.clone(),
            server_addr: self.server_addr.clone(),
            tool: self.tool.clone(),
            tool_hash: self.tool_hash.clone(),
        }
    }
}

/// What a name as an agent wrote it refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// Exactly one registered tool.
    Found(Arc<ToolEntry>),
    /// A bare name that several servers offer; `candidates` sorted by server id.
    Ambiguous {
        /// The name as resolved (after stripping any agent prefix).
        name: String,
        /// One entry per server offering it.
        candidates: Vec<Arc<ToolEntry>>,
    },
    /// Certainly an MCP tool of this server (the layer said so, or the name's form did) but
    /// not registered: never listed, or new since the last listing.
    UnknownOnServer {
        /// The server id as given (may be a server the registry has never seen).
        server_id: String,
        /// The tool name on that server.
        tool: String,
    },
    /// Not a known MCP tool at all.
    Unknown,
}

/// How a registration changed the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RegistrationChange {
    /// The server.
    pub server_id: String,
    /// The tool's name.
    pub tool: String,
    /// The definition hash now registered.
    pub tool_hash: String,
    /// What happened.
    pub kind: ChangeKind,
}

/// Most tools one server may have registered: each is a write and a record, and the largest
/// real servers list a few hundred. A server past it by many pages of new names, or by new names
/// at every listing, gets no more.
pub(crate) const MAX_TOOLS_PER_SERVER: usize = 2048;

/// The kind of a [`RegistrationChange`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    /// A tool the server did not have before.
    Added,
    /// Same tool, different definition.
    Changed {
        /// The hash registered before.
        previous_hash: String,
    },
    /// Same definition as before.
    Unchanged,
    /// Not registered: no string `name`, or one more tool than a server may have.
    Invalid {
        /// Why.
        reason: String,
    },
}

/// The pinning state of one tool (see `version_pinning` in the config).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PinState {
    /// The hash is the pinned one.
    Match,
    /// The definition changed since it was pinned.
    Changed {
        /// The trusted hash.
        pinned_hash: String,
    },
    /// No pin for this tool.
    Unpinned {
        /// Whether the server's tool set was sealed (then this tool is new since: drift).
        server_sealed: bool,
    },
}

/// A server as the registry knows it (CLI listings).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ServerInfo {
    /// The id.
    pub server_id: String,
    /// `stdio`, `http` or `sse` (of its most recently registered tool).
    pub server_type: String,
    /// `host:port`, empty for stdio.
    pub server_addr: String,
    /// Registered tools.
    pub tool_count: usize,
    /// When its tool set was sealed for version pinning.
    pub sealed_at: Option<DateTime<Utc>>,
}

/// A trusted definition hash.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg(test)]
pub(crate) struct Pin {
    /// The server.
    pub server_id: String,
    /// The tool.
    pub tool: String,
    /// The trusted hash.
    pub tool_hash: String,
    /// When it was pinned.
    pub pinned_at: DateTime<Utc>,
}

/// The registry. Share it as `Arc<Registry>`; every method takes `&self`.
#[derive(Debug)]
pub(crate) struct Registry {
    index: RwLock<Index>,
    /// Writes are serialized here, before the index lock is taken, so readers never wait on
    /// SQLite.
    db: Mutex<Connection>,
}

impl Registry {
    /// Opens (creating if needed) the registry tables in the database at `db_path` and loads
    /// them.
    pub(crate) fn open(db_path: &Path) -> Result<Registry, RegistryError> {
        Registry::from_connection(store::open(db_path)?)
    }

    /// A registry that lives only in memory (tests, `toolwall config check`).
    pub(crate) fn in_memory() -> Result<Registry, RegistryError> {
        Registry::from_connection(store::open_in_memory()?)
    }

    fn from_connection(conn: Connection) -> Result<Registry, RegistryError> {
        let registry = Registry {
            index: RwLock::new(Index::default()),
            db: Mutex::new(conn),
        };
        registry.reload()?;
        Ok(registry)
    }

    /// Re-reads the database, picking up what other processes (shims) registered or pinned.
    pub(crate) fn reload(&self) -> Result<(), RegistryError> {
        let db = self.db.lock().unwrap_or_else(PoisonError::into_inner);
        let snapshot = store::load(&db)?;
        let mut index = Index::default();
        for row in snapshot.tools {
            index.insert(Arc::new(ToolEntry {
                tool: row.tool_name,
                server_id: row.server_id,
                server_type: row.server_type,
                server_addr: row.server_addr,
                tool_hash: row.tool_hash,
                registered_at: row.registered_at,
            }));
        }
        for pin in snapshot.pins {
            index
                .servers
                .entry(pin.server_id)
                .or_default()
                .pins
                .insert(pin.tool_name, (pin.tool_hash, pin.pinned_at));
        }
        for (server_id, at) in snapshot.sealed {
            index.servers.entry(server_id).or_default().sealed_at = Some(at);
        }
        *self.write_index() = index;
        Ok(())
    }

    /// What `query` names: see [`Resolution`]. Tries, in order: the layer's server (exact
    /// name, sanitized name, agent forms), Codex's namespace, the exact bare name, the agent
    /// forms in `patterns` (Claude Code's first), then sanitized bare names.
    pub(crate) fn resolve(&self, query: &CallQuery<'_>, patterns: &NamePatterns) -> Resolution {
        self.read_index().resolve(query, patterns)
    }

    /// The entry of `tool` on `server_id`, exactly.
    #[cfg(test)]
    pub(crate) fn get(&self, server_id: &str, tool: &str) -> Option<Arc<ToolEntry>> {
        self.read_index()
            .servers
            .get(server_id)
            .and_then(|s| s.tools.get(tool))
            .cloned()
    }

    /// Compares `hash` with the pin of `tool` on `server_id`. Allocates only when it changed.
    pub(crate) fn pin_state(&self, server_id: &str, tool: &str, hash: &str) -> PinState {
        let index = self.read_index();
        let Some(server) = index.servers.get(server_id) else {
            return PinState::Unpinned {
                server_sealed: false,
            };
        };
        match server.pins.get(tool) {
            Some((pinned, _)) if pinned == hash => PinState::Match,
            Some((pinned, _)) => PinState::Changed {
                pinned_hash: pinned.clone(),
            },
            None => PinState::Unpinned {
                server_sealed: server.sealed_at.is_some(),
            },
        }
    }

    /// Whether `server_id`'s tool set is sealed.
    #[cfg(test)]
    pub(crate) fn is_sealed(&self, server_id: &str) -> bool {
        self.read_index()
            .servers
            .get(server_id)
            .is_some_and(|s| s.sealed_at.is_some())
    }

    /// Trusts `hash` for `tool` on `server_id` (first sight, or a person accepting a change).
    #[cfg(test)]
    pub(crate) fn pin(&self, server_id: &str, tool: &str, hash: &str) -> Result<(), RegistryError> {
        let pin = store::PinRow {
            server_id: server_id.to_string(),
            tool_name: tool.to_string(),
            tool_hash: hash.to_string(),
            pinned_at: Utc::now(),
        };
        let mut db = self.db.lock().unwrap_or_else(PoisonError::into_inner);
        store::save_pins(&mut db, std::slice::from_ref(&pin), None)?;
        self.write_index()
            .servers
            .entry(pin.server_id)
            .or_default()
            .pins
            .insert(pin.tool_name, (pin.tool_hash, pin.pinned_at));
        Ok(())
    }

    /// Pins every registered tool of `server_id` that has no pin yet, and seals the server's
    /// tool set: from now on a tool it did not have is drift. Returns the tools newly pinned.
    #[cfg(test)]
    pub(crate) fn seal_server(&self, server_id: &str) -> Result<Vec<String>, RegistryError> {
        let now = Utc::now();
        let mut db = self.db.lock().unwrap_or_else(PoisonError::into_inner);
        let (pins, already_sealed) = {
            let index = self.read_index();
            match index.servers.get(server_id) {
                Some(server) => (
                    server
                        .tools
                        .values()
                        .filter(|e| !server.pins.contains_key(&e.tool))
                        .map(|e| store::PinRow {
                            server_id: server_id.to_string(),
                            tool_name: e.tool.clone(),
                            tool_hash: e.tool_hash.clone(),
                            pinned_at: now,
                        })
                        .collect::<Vec<_>>(),
                    server.sealed_at.is_some(),
                ),
                None => (Vec::new(), false),
            }
        };
        if pins.is_empty() && already_sealed {
            return Ok(Vec::new());
        }
        store::save_pins(&mut db, &pins, Some((server_id, now)))?;
        let mut index = self.write_index();
        let server = index.servers.entry(server_id.to_string()).or_default();
        server.sealed_at.get_or_insert(now);
        let mut pinned = Vec::with_capacity(pins.len());
        for pin in pins {
            pinned.push(pin.tool_name.clone());
            server
                .pins
                .insert(pin.tool_name, (pin.tool_hash, pin.pinned_at));
        }
        tracing::info!(server_id, pinned = pinned.len(), "server tool set sealed");
        Ok(pinned)
    }

    /// Trust on first use, for version pinning with `auto_trust_first`: pins each of `tools`
    /// (name, hash) that has no pin, and with `seal` (a whole listing) pins every registered
    /// tool of the server and seals its set — unless it is already sealed, in which case
    /// nothing new is trusted (a new tool is drift). Existing pins are never replaced, and the
    /// database decides, so two processes trusting at once cannot overwrite each other's pins
    /// with a later (possibly malicious) definition. Refreshes this server's pins from disk.
    pub(crate) fn trust_first(
        &self,
        server_id: &str,
        tools: &[(&str, &str)],
        seal: bool,
    ) -> Result<(), RegistryError> {
        let mut db = self.db.lock().unwrap_or_else(PoisonError::into_inner);
        let (pins, sealed_at) = store::trust_first(&mut db, server_id, tools, seal, Utc::now())?;
        let mut index = self.write_index();
        let server = index.servers.entry(server_id.to_string()).or_default();
        let newly_sealed = sealed_at.is_some() && server.sealed_at.is_none();
        server.sealed_at = sealed_at;
        server.pins = pins
            .into_iter()
            .map(|p| (p.tool_name, (p.tool_hash, p.pinned_at)))
            .collect();
        if newly_sealed {
            tracing::info!(
                server_id,
                pins = server.pins.len(),
                "server tool set sealed"
            );
        }
        Ok(())
    }

    /// Every registered tool, sorted by server then name.
    pub(crate) fn tools(&self) -> Vec<Arc<ToolEntry>> {
        let index = self.read_index();
        let mut all: Vec<_> = index
            .servers
            .values()
            .flat_map(|s| s.tools.values().cloned())
            .collect();
        all.sort_by(|a, b| (&a.server_id, &a.tool).cmp(&(&b.server_id, &b.tool)));
        all
    }

    /// Every known server (registered tools or pins), sorted by id.
    pub(crate) fn servers(&self) -> Vec<ServerInfo> {
        let index = self.read_index();
        let mut all: Vec<_> = index
            .servers
            .iter()
            .map(|(id, s)| {
                let latest = s.tools.values().max_by_key(|e| e.registered_at);
                ServerInfo {
                    server_id: id.clone(),
                    server_type: latest.map(|e| e.server_type.clone()).unwrap_or_default(),
                    server_addr: latest.map(|e| e.server_addr.clone()).unwrap_or_default(),
                    tool_count: s.tools.len(),
                    sealed_at: s.sealed_at,
                }
            })
            .collect();
        all.sort_by(|a, b| a.server_id.cmp(&b.server_id));
        all
    }

    /// Every pin, sorted by server then tool.
    #[cfg(test)]
    pub(crate) fn pins(&self) -> Vec<Pin> {
        let index = self.read_index();
        let mut all: Vec<_> = index
            .servers
            .iter()
            .flat_map(|(id, s)| {
                s.pins.iter().map(move |(tool, (hash, at))| Pin {
                    server_id: id.clone(),
                    tool: tool.clone(),
                    tool_hash: hash.clone(),
                    pinned_at: *at,
                })
            })
            .collect();
        all.sort_by(|a, b| (&a.server_id, &a.tool).cmp(&(&b.server_id, &b.tool)));
        all
    }

    /// Network server addresses (`host:port` → server id), for the kernel layer's watch list.
    #[cfg(test)]
    pub(crate) fn server_addrs(&self) -> Vec<(String, String)> {
        let mut addrs: Vec<_> = self
            .servers()
            .into_iter()
            .filter(|s| !s.server_addr.is_empty())
            .map(|s| (s.server_addr, s.server_id))
            .collect();
        addrs.dedup();
        addrs
    }

    /// The stored JSON definition of a tool, as the server last listed it (`toolwall config
    /// check` reads its `inputSchema`).
    pub(crate) fn definition(
        &self,
        server_id: &str,
        tool: &str,
    ) -> Result<Option<Value>, RegistryError> {
        let db = self.db.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(store::definition(&db, server_id, tool)?
            .and_then(|text| serde_json::from_str(&text).ok()))
    }

    /// A server's stored definitions, as its listings last showed them (stored as this
    /// process serialized them; a row edited by hand into something else is left out).
    pub(crate) fn definitions_of(&self, server_id: &str) -> Result<Vec<Value>, RegistryError> {
        let rows = {
            let db = self.db.lock().unwrap_or_else(PoisonError::into_inner);
            store::definitions_of(&db, server_id)?
        };
        Ok(rows
            .iter()
            .filter_map(|text| serde_json::from_str(text).ok())
            .collect())
    }

    fn read_index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        // A panic while holding the lock cannot leave the index half-updated in a way that
        // matters more than stopping every layer: keep serving.
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests;
