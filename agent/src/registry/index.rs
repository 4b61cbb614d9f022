//! The in-memory index the hot path reads: tools by server, by bare name and by the sanitized
//! forms agents use, plus the pins. Lookups take `&str` slices of the caller's name and never
//! allocate unless the answer is unusual (ambiguous, unknown tool on a known server).

use std::{collections::HashMap, sync::Arc};

use chrono::{DateTime, Utc};

use super::{
    Resolution, ToolEntry,
    names::{CODEX_NAMESPACE_PREFIX, NamePatterns, claude_form, codex_form},
};
use crate::decision::CallQuery;

/// One server's tools and pins.
#[derive(Debug, Default)]
pub(super) struct ServerTools {
    pub tools: HashMap<String, Arc<ToolEntry>>,
    /// Sanitized tool name (Codex / Claude Code forms) → tool name.
    pub aliases: HashMap<String, String>,
    /// Tool name → (trusted hash, when pinned).
    pub pins: HashMap<String, (String, DateTime<Utc>)>,
    /// When the tool set was sealed (a tool appearing after that is drift).
    pub sealed_at: Option<DateTime<Utc>>,
}

/// Everything, keyed for lookups.
#[derive(Debug, Default)]
pub(super) struct Index {
    pub servers: HashMap<String, ServerTools>,
    /// Sanitized server id → id (`my.server` is `my_server` in Claude Code names).
    pub server_aliases: HashMap<String, String>,
    /// Tool name → its entries on every server (sorted by server id).
    pub by_name: HashMap<String, Vec<Arc<ToolEntry>>>,
    /// Sanitized tool name → its entries (sorted by server id), for bare sanitized names.
    pub by_alias: HashMap<String, Vec<Arc<ToolEntry>>>,
}

impl Index {
    /// Adds or replaces an entry (same server and tool).
    pub fn insert(&mut self, entry: Arc<ToolEntry>) {
        if let Some(alias) = claude_form(&entry.server_id) {
            self.server_aliases
                .entry(alias)
                .or_insert_with(|| entry.server_id.clone());
        }
        if let Some(alias) = codex_form(&entry.server_id) {
            self.server_aliases
                .entry(alias)
                .or_insert_with(|| entry.server_id.clone());
        }
        let server = self.servers.entry(entry.server_id.clone()).or_default();
        for alias in [codex_form(&entry.tool), claude_form(&entry.tool)]
            .into_iter()
            .flatten()
        {
            server
                .aliases
                .entry(alias.clone())
                .or_insert_with(|| entry.tool.clone());
            upsert_sorted(self.by_alias.entry(alias).or_default(), &entry);
        }
        server.tools.insert(entry.tool.clone(), entry.clone());
        upsert_sorted(self.by_name.entry(entry.tool.clone()).or_default(), &entry);
    }

    /// The server with this id or sanitized id.
    fn server(&self, id: &str) -> Option<(&str, &ServerTools)> {
        if let Some((key, tools)) = self.servers.get_key_value(id) {
            return Some((key.as_str(), tools));
        }
        let real = self.server_aliases.get(id)?;
        self.servers
            .get_key_value(real.as_str())
            .map(|(k, t)| (k.as_str(), t))
    }

    /// Resolves a name as a layer saw it; see [`super::Registry::resolve`].
    pub fn resolve(&self, query: &CallQuery<'_>, patterns: &NamePatterns) -> Resolution {
        let name = query.name;
        if let Some(server_id) = query.server_id {
            return match self.server(server_id) {
                Some((_, tools)) => match tool_on(tools, name).or_else(|| {
                    patterns.iter().find_map(|p| {
                        p.find_map(name, |server, tool| {
                            let same = server.is_none_or(|s| {
                                self.server(s).is_some_and(|(id, _)| id == server_id)
                            });
                            if same { tool_on(tools, tool) } else { None }
                        })
                    })
                }) {
                    Some(entry) => Resolution::Found(entry.clone()),
                    None => unknown_on(server_id, name),
                },
                None => unknown_on(server_id, name),
            };
        }
        if let Some(namespace) = query.namespace {
            let server_part = namespace
                .strip_prefix(CODEX_NAMESPACE_PREFIX)
                .unwrap_or(namespace);
            return match self.server(server_part) {
                Some((id, tools)) => match tool_on(tools, name) {
                    Some(entry) => Resolution::Found(entry.clone()),
                    None => unknown_on(id, name),
                },
                None => unknown_on(server_part, name),
            };
        }
        if let Some(found) = self.by_name.get(name).and_then(|e| one_of(name, e)) {
            return found;
        }
        let mut unknown_on_known_server = None;
        for pattern in patterns.iter() {
            let found = pattern.find_map(name, |server, tool| match server {
                Some(server) => {
                    let (id, tools) = self.server(server)?;
                    match tool_on(tools, tool) {
                        Some(entry) => Some(Resolution::Found(entry.clone())),
                        None => {
                            unknown_on_known_server.get_or_insert_with(|| unknown_on(id, tool));
                            None
                        }
                    }
                }
                None => self
                    .by_name
                    .get(tool)
                    .or_else(|| self.by_alias.get(tool))
                    .and_then(|e| one_of(tool, e)),
            });
            if let Some(found) = found {
                return found;
            }
        }
        if let Some(found) = self.by_alias.get(name).and_then(|e| one_of(name, e)) {
            return found;
        }
        unknown_on_known_server.unwrap_or(Resolution::Unknown)
    }
}

/// A tool of one server by its name or a sanitized form of it.
fn tool_on<'a>(tools: &'a ServerTools, name: &str) -> Option<&'a Arc<ToolEntry>> {
    tools.tools.get(name).or_else(|| {
        tools
            .aliases
            .get(name)
            .and_then(|real| tools.tools.get(real.as_str()))
    })
}

fn unknown_on(server_id: &str, tool: &str) -> Resolution {
    Resolution::UnknownOnServer {
        server_id: server_id.to_string(),
        tool: tool.to_string(),
    }
}

/// One entry, or the list of servers that make the name ambiguous.
fn one_of(name: &str, entries: &[Arc<ToolEntry>]) -> Option<Resolution> {
    match entries {
        [] => None,
        [one] => Some(Resolution::Found(one.clone())),
        many => Some(Resolution::Ambiguous {
            name: name.to_string(),
            candidates: many.to_vec(),
        }),
    }
}

/// Replaces the entry of the same server, or inserts keeping the list sorted by server id.
fn upsert_sorted(list: &mut Vec<Arc<ToolEntry>>, entry: &Arc<ToolEntry>) {
    match list.binary_search_by(|e| e.server_id.as_str().cmp(entry.server_id.as_str())) {
        Ok(at) => list[at] = entry.clone(),
        Err(at) => list.insert(at, entry.clone()),
    }
}
