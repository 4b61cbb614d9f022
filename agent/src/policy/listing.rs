//! A server's listing as the policy sees it: its tools registered (and pinned on first sight
//! when pinning trusts first hashes), each decided for visibility without spending budget.

use serde_json::Value;

use super::Policy;
use crate::{
    decision::{Action, Decision},
    registry::{ChangeKind, ToolEntry, tool_hash},
};

impl Policy {
    /// Registers listed tools: each one's entry, or why it is not registered (no string
    /// `name`, or one more than a server may have: `registry::MAX_TOOLS_PER_SERVER`).
    pub(super) fn register_listed(
        &self,
        server_id: &str,
        server_type: &str,
        tools: &[Value],
    ) -> Vec<Result<ToolEntry, String>> {
        let addr = self
            .declared
            .get(server_id)
            .map(|d| d.1.clone())
            .unwrap_or_default();
        let refused: Vec<Option<String>> = match self.registry.register(
            server_id,
            server_type,
            &addr,
            tools,
        ) {
            Ok(changes) => changes
                .into_iter()
                .map(|change| match change.kind {
                    ChangeKind::Invalid { reason } => Some(reason),
                    _ => None,
                })
                .collect(),
            Err(error) => {
                tracing::error!(server_id, %error, "cannot persist listed tools; deciding on them anyway");
                Vec::new()
            }
        };
        self.registered_since_compared(server_id, tools);
        tools
            .iter()
            .enumerate()
            .map(|(i, tool)| {
                let Some(name) = tool.get("name").and_then(Value::as_str) else {
                    return Err("listed tool has no string \"name\"; hidden".to_owned());
                };
                if let Some(Some(why)) = refused.get(i) {
                    return Err(why.clone());
                }
                Ok(ToolEntry {
                    tool: name.to_string(),
                    server_id: server_id.to_string(),
                    server_type: server_type.to_string(),
                    server_addr: addr.clone(),
                    tool_hash: tool_hash(tool),
                    registered_at: chrono::Utc::now(),
                })
            })
            .collect()
    }

    /// Decides visibility of a listed, registered definition (no rate limit spent).
    pub(super) fn decide_listed(&self, entry: Result<ToolEntry, String>) -> Decision {
        match entry {
            Ok(entry) => self.decide_entry(&entry, None, None),
            Err(why) => self.finish(Action::Block, why, None),
        }
    }

    /// Pins first-seen definitions when `auto_trust_first` (one tool: per tool, the server's
    /// set stays open; a whole listing: every tool, and the set is sealed).
    pub(super) fn trust_first(
        &self,
        server_id: &str,
        entries: &[Result<ToolEntry, String>],
        whole_listing: bool,
    ) {
        if !(self.pinning.enabled && self.pinning.auto_trust_first) {
            return;
        }
        let tools: Vec<(&str, &str)> = entries
            .iter()
            .flatten()
            .map(|e| (e.tool.as_str(), e.tool_hash.as_str()))
            .collect();
        if let Err(error) = self.registry.trust_first(server_id, &tools, whole_listing) {
            tracing::error!(server_id, %error, "cannot persist pins");
        }
    }
}
