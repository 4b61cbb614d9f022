//! Registering a server's listed tools: new and changed definitions persisted, the in-memory
//! index updated, and a server's tools bounded across its pages and listings.

use std::{sync::Arc, sync::PoisonError};

use chrono::Utc;
use serde_json::Value;

use super::{
    ChangeKind, MAX_TOOLS_PER_SERVER, RegistrationChange, Registry, RegistryError, ToolEntry,
    store, tool_hash,
};

impl Registry {
    /// Registers `tools` (`tools/list` entries) of a server, persisting new and changed
    /// definitions. Tools not in `tools` are kept (listings may be paginated), so a server's
    /// tools are bounded across its pages and listings, not per result: past
    /// [`MAX_TOOLS_PER_SERVER`] a new name is not registered (`ChangeKind::Invalid`).
    pub(crate) fn register(
        &self,
        server_id: &str,
        server_type: &str,
        server_addr: &str,
        tools: &[Value],
    ) -> Result<Vec<RegistrationChange>, RegistryError> {
        let mut db = self.db.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Utc::now();
        let mut changes = Vec::with_capacity(tools.len());
        let mut rows = Vec::new();
        {
            let index = self.read_index();
            let known = index.servers.get(server_id);
            let mut registered = known.map_or(0, |s| s.tools.len());
            for tool in tools {
                let Some(name) = tool.get("name").and_then(Value::as_str) else {
                    tracing::warn!(server_id, "a listed tool has no string \"name\"; ignored");
                    changes.push(RegistrationChange {
                        server_id: server_id.to_string(),
                        tool: String::new(),
                        tool_hash: String::new(),
                        kind: ChangeKind::Invalid {
                            reason: "tool definition without a string \"name\"".to_string(),
                        },
                    });
                    continue;
                };
                let hash = tool_hash(tool);
                let previous = known.and_then(|s| s.tools.get(name));
                if previous.is_none() && registered >= MAX_TOOLS_PER_SERVER {
                    changes.push(RegistrationChange {
                        server_id: server_id.to_string(),
                        tool: name.to_string(),
                        tool_hash: hash,
                        kind: ChangeKind::Invalid {
                            reason: format!(
                                "server {server_id:?} already has {MAX_TOOLS_PER_SERVER} tools registered; no more are (hidden)"
                            ),
                        },
                    });
                    continue;
                }
                let kind = match previous {
                    None => {
                        registered += 1;
                        ChangeKind::Added
                    }
                    Some(p) if p.tool_hash != hash => ChangeKind::Changed {
                        previous_hash: p.tool_hash.clone(),
                    },
                    Some(_) => ChangeKind::Unchanged,
                };
                // Same definition but the server moved: store the new address.
                let moved = previous
                    .is_some_and(|p| p.server_type != server_type || p.server_addr != server_addr);
                // Same hash, other text (a field the hash leaves out, `_meta` say): stored too,
                // since the definition checks read every field and a new process judges the
                // stored text (otherwise a poison in `_meta` is forgotten at restart).
                let text = tool.to_string();
                let restated = kind == ChangeKind::Unchanged
                    && !moved
                    && store::definition(&db, server_id, name)?.as_deref() != Some(text.as_str());
                if kind != ChangeKind::Unchanged || moved || restated {
                    let registered_at = match (&kind, previous) {
                        (ChangeKind::Unchanged, Some(p)) => p.registered_at,
                        _ => now,
                    };
                    rows.push((
                        store::ToolRow {
                            server_id: server_id.to_string(),
                            tool_name: name.to_string(),
                            server_type: server_type.to_string(),
                            server_addr: server_addr.to_string(),
                            tool_hash: hash.clone(),
                            registered_at,
                        },
                        text,
                    ));
                }
                changes.push(RegistrationChange {
                    server_id: server_id.to_string(),
                    tool: name.to_string(),
                    tool_hash: hash,
                    kind,
                });
            }
        }
        if rows.is_empty() {
            return Ok(changes);
        }
        store::save_tools(&mut db, &rows)?;
        let mut index = self.write_index();
        for (row, _) in rows {
            index.insert(Arc::new(ToolEntry {
                tool: row.tool_name,
                server_id: row.server_id,
                server_type: row.server_type,
                server_addr: row.server_addr,
                tool_hash: row.tool_hash,
                registered_at: row.registered_at,
            }));
        }
        for change in &changes {
            match &change.kind {
                ChangeKind::Added => tracing::info!(
                    server_id,
                    tool = change.tool,
                    hash = change.tool_hash,
                    "tool registered"
                ),
                ChangeKind::Changed { previous_hash } => tracing::warn!(
                    server_id,
                    tool = change.tool,
                    previous_hash,
                    hash = change.tool_hash,
                    "tool definition changed"
                ),
                ChangeKind::Unchanged | ChangeKind::Invalid { .. } => {}
            }
        }
        Ok(changes)
    }
}
