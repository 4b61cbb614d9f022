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
    /// Sanitized tool name (Codex / Claude Code forms) → every tool name of this server with
    /// that form (sorted). Sanitizing is not one-to-one (`a.b`, `a-b` and `a_b` are all `a_b`
    /// to Codex), so an alias can stand for several tools.
    pub aliases: HashMap<String, Vec<String>>,
    /// Tool name → (trusted hash, when pinned).
    pub pins: HashMap<String, (String, DateTime<Utc>)>,
    /// When the tool set was sealed (a tool appearing after that is drift).
    pub sealed_at: Option<DateTime<Utc>>,
}

/// Everything, keyed for lookups.
///
/// Colliding sanitized names are ambiguous, never "whichever was registered first": a name
/// an agent wrote that could stand for several registered tools (`a_b` for `a_b`, `a-b` and
/// `a.b`; `my_srv` for servers `my.srv` and `my-srv`) resolves to [`Resolution::Ambiguous`]
/// with every candidate, which the policy blocks under `fail_closed` and otherwise allows only
/// if every candidate is allowed. Agents' LLM-side names are sanitized, so the literal name is
/// just one of the candidates there; only a layer that names the server (the shim and the
/// filter proxy, which see the real `tools/call` name) takes an exact tool name as certain.
#[derive(Debug, Default)]
pub(super) struct Index {
    pub servers: HashMap<String, ServerTools>,
    /// Sanitized server id → every id with that form (sorted; `my.server` is `my_server` in
    /// Claude Code names).
    pub server_aliases: HashMap<String, Vec<String>>,
    /// Tool name → its entries on every server (sorted by server id).
    pub by_name: HashMap<String, Vec<Arc<ToolEntry>>>,
    /// Sanitized tool name → its entries (sorted by server id, then tool), for bare sanitized
    /// names.
    pub by_alias: HashMap<String, Vec<Arc<ToolEntry>>>,
}

/// The entries a lookup found: one is an answer, more are an ambiguity. Allocates only when
/// there is a second one.
#[derive(Default)]
struct Hits {
    first: Option<Arc<ToolEntry>>,
    more: Vec<Arc<ToolEntry>>,
}

impl Hits {
    fn push(&mut self, entry: &Arc<ToolEntry>) {
        let same = |e: &Arc<ToolEntry>| e.server_id == entry.server_id && e.tool == entry.tool;
        match &self.first {
            None => self.first = Some(entry.clone()),
            Some(first) if same(first) => {}
            Some(_) if self.more.iter().any(same) => {}
            Some(_) => self.more.push(entry.clone()),
        }
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.more.len()
    }

    /// `Found`, `Ambiguous` (candidates sorted by server id, then tool) or `None`.
    fn into_resolution(self, name: &str) -> Option<Resolution> {
        let first = self.first?;
        if self.more.is_empty() {
            return Some(Resolution::Found(first));
        }
        let mut candidates = self.more;
        candidates.push(first);
        candidates.sort_by(|a, b| (&a.server_id, &a.tool).cmp(&(&b.server_id, &b.tool)));
        Some(Resolution::Ambiguous {
            name: name.to_string(),
            candidates,
        })
    }
}

impl Index {
    /// Adds or replaces an entry (same server and tool).
    pub(super) fn insert(&mut self, entry: Arc<ToolEntry>) {
        for alias in [claude_form(&entry.server_id), codex_form(&entry.server_id)]
            .into_iter()
            .flatten()
        {
            insert_name(
                self.server_aliases.entry(alias).or_default(),
                &entry.server_id,
            );
        }
        let server = self.servers.entry(entry.server_id.clone()).or_default();
        for alias in [codex_form(&entry.tool), claude_form(&entry.tool)]
            .into_iter()
            .flatten()
        {
            insert_name(
                server.aliases.entry(alias.clone()).or_default(),
                &entry.tool,
            );
            upsert_sorted(self.by_alias.entry(alias).or_default(), &entry);
        }
        server.tools.insert(entry.tool.clone(), entry.clone());
        upsert_sorted(self.by_name.entry(entry.tool.clone()).or_default(), &entry);
    }

    /// Every server `id` may stand for: the one with this id and those whose sanitized id it is.
    fn servers_for<'a, 'b>(
        &'a self,
        id: &'b str,
    ) -> impl Iterator<Item = (&'a str, &'a ServerTools)> + use<'a, 'b> {
        let exact = self.servers.get_key_value(id);
        let aliased = self
            .server_aliases
            .get(id)
            .into_iter()
            .flatten()
            .filter(move |real| real.as_str() != id)
            .filter_map(|real| self.servers.get_key_value(real.as_str()));
        exact
            .into_iter()
            .chain(aliased)
            .map(|(k, t)| (k.as_str(), t))
    }

    /// The entries `server` + `tool` (as an agent wrote them) may stand for.
    fn hits_on<'a>(&'a self, server: &str, tool: &str, hits: &mut Hits) -> Option<&'a str> {
        let mut first_server = None;
        for (id, tools) in self.servers_for(server) {
            first_server.get_or_insert(id);
            tools_for(tools, tool).for_each(|e| hits.push(e));
        }
        first_server
    }

    /// Resolves a name as a layer saw it; see [`super::Registry::resolve`].
    pub(super) fn resolve(&self, query: &CallQuery<'_>, patterns: &NamePatterns) -> Resolution {
        let name = query.name;
        if let Some(server_id) = query.server_id {
            // The shim and the filter proxy see the real `tools/call` name: an exact tool of
            // the exact server is certain.
            if let Some(entry) = self.servers.get(server_id).and_then(|t| t.tools.get(name)) {
                return Resolution::Found(entry.clone());
            }
            let mut hits = Hits::default();
            self.hits_on(server_id, name, &mut hits);
            if hits.is_empty() {
                let _: Option<()> = patterns.iter().find_map(|p| {
                    p.find_map(name, |server, tool| {
                        let same = server
                            .is_none_or(|s| self.servers_for(s).any(|(id, _)| id == server_id));
                        if same {
                            self.hits_on(server_id, tool, &mut hits);
                        }
                        (!hits.is_empty()).then_some(())
                    })
                });
            }
            return hits
                .into_resolution(name)
                .unwrap_or_else(|| unknown_on(server_id, name));
        }
        if let Some(namespace) = query.namespace {
            let server_part = namespace
                .strip_prefix(CODEX_NAMESPACE_PREFIX)
                .unwrap_or(namespace);
            let mut hits = Hits::default();
            let id = self.hits_on(server_part, name, &mut hits);
            return hits
                .into_resolution(name)
                .unwrap_or_else(|| unknown_on(id.unwrap_or(server_part), name));
        }
        // A name in a known server's form (`mcp__github__delete_repo`) is that server's tool,
        // registered or not: a tool some other server (or a forged listing) registered under
        // that very name must not stand in for it and be judged by the other server's rules.
        // Where a server id ends is not known (`google` and `google_drive` both fit
        // `mcp_google_drive_x`): the tools every reading names are taken together (two are
        // ambiguous, each judged); with none listed, the first known server's unlisted tool.
        let mut hits = Hits::default();
        let mut unlisted = None;
        for pattern in patterns.iter() {
            let _: Option<()> = pattern.find_map(name, |server, tool| {
                let server = server?;
                // A form without a prefix of its own (OpenCode's `{server}_{tool}`) may be a
                // tool's own name: a tool that server lists under the whole name (`github`'s
                // `github_search`) is that tool, found as a bare name below.
                if !pattern.marks_servers()
                    && self
                        .servers_for(server)
                        .any(|(_, tools)| tools_for(tools, name).next().is_some())
                {
                    return None;
                }
                let before = hits.len();
                let id = self.hits_on(server, tool, &mut hits)?;
                if hits.len() == before {
                    unlisted.get_or_insert_with(|| unknown_on(id, tool));
                }
                None
            });
        }
        if let Some(found) = hits.into_resolution(name).or(unlisted) {
            return found;
        }
        if let Some(found) = bare(self, name) {
            return found;
        }
        let mut unknown_on_known_server = None;
        for pattern in patterns.iter() {
            let found = pattern.find_map(name, |server, tool| match server {
                Some(server) => {
                    let mut hits = Hits::default();
                    let id = self.hits_on(server, tool, &mut hits)?;
                    let found = hits.into_resolution(tool);
                    if found.is_none() {
                        unknown_on_known_server.get_or_insert_with(|| unknown_on(id, tool));
                    }
                    found
                }
                None => bare(self, tool),
            });
            if let Some(found) = found {
                return found;
            }
        }
        unknown_on_known_server.unwrap_or(Resolution::Unknown)
    }
}

/// A bare name (no server): every tool of that name or sanitized form, on any server.
fn bare(index: &Index, name: &str) -> Option<Resolution> {
    let mut hits = Hits::default();
    for entries in [index.by_name.get(name), index.by_alias.get(name)]
        .into_iter()
        .flatten()
    {
        entries.iter().for_each(|e| hits.push(e));
    }
    hits.into_resolution(name)
}

/// The tools of one server a name may stand for: the tool of that name and every tool whose
/// sanitized form it is.
fn tools_for<'a>(
    tools: &'a ServerTools,
    name: &'a str,
) -> impl Iterator<Item = &'a Arc<ToolEntry>> {
    let aliased = tools
        .aliases
        .get(name)
        .into_iter()
        .flatten()
        .filter(move |real| real.as_str() != name)
        .filter_map(|real| tools.tools.get(real.as_str()));
    tools.tools.get(name).into_iter().chain(aliased)
}

/// Adds `name` to a sorted list of names, once.
fn insert_name(list: &mut Vec<String>, name: &str) {
    if let Err(at) = list.binary_search_by(|n| n.as_str().cmp(name)) {
        list.insert(at, name.to_string());
    }
}

fn unknown_on(server_id: &str, tool: &str) -> Resolution {
    Resolution::UnknownOnServer {
        server_id: server_id.to_string(),
        tool: tool.to_string(),
    }
}

/// Replaces the entry of the same server and tool, or inserts keeping the list sorted by
/// server id, then tool (one alias can stand for several tools of one server).
fn upsert_sorted(list: &mut Vec<Arc<ToolEntry>>, entry: &Arc<ToolEntry>) {
    let key = (entry.server_id.as_str(), entry.tool.as_str());
    match list.binary_search_by(|e| (e.server_id.as_str(), e.tool.as_str()).cmp(&key)) {
        Ok(at) => list[at] = entry.clone(),
        Err(at) => list.insert(at, entry.clone()),
    }
}
