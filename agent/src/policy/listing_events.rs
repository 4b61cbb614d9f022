//! The events a listing produces (`mcp_tool_seen` per tool, `mcp_tool_changed` for a rug pull
//! or drift), built from the decisions [`Gate::check_listed`](crate::decision::Gate) returned,
//! so every layer that lists tools records them the same way.

use chrono::Utc;

use super::Policy;
use crate::{
    decision::{Action, Decision},
    events::{Event, ToolChanged, ToolSeen},
    registry::PinState,
};

impl Policy {
    /// `mcp_tool_seen` for each identified tool in `decisions` (from `check_listed` /
    /// `check_listed_all`), plus `mcp_tool_changed` for each whose definition differs from its
    /// pin or that appeared after its server's set was sealed (only with version pinning on).
    pub(crate) fn listing_events(&self, session_id: &str, decisions: &[Decision]) -> Vec<Event> {
        let now = Utc::now();
        let mut events = Vec::with_capacity(decisions.len());
        for decision in decisions {
            let Some(tool) = &decision.tool else {
                continue;
            };
            events.push(Event::McpToolSeen(ToolSeen {
                policy_revision: None,
                timestamp: now,
                session_id: session_id.to_string(),
                server_id: tool.server_id.clone(),
                server_type: tool.server_type.clone(),
                tool_name: tool.tool.clone(),
                tool_hash: tool.tool_hash.clone(),
                action: decision.action,
                reason: decision.reason.clone(),
            }));
            if !self.pinning.enabled {
                continue;
            }
            let old_hash =
                match self
                    .registry
                    .pin_state(&tool.server_id, &tool.tool, &tool.tool_hash)
                {
                    PinState::Changed { pinned_hash } => pinned_hash,
                    PinState::Unpinned {
                        server_sealed: true,
                    } => String::new(),
                    PinState::Match | PinState::Unpinned { .. } => continue,
                };
            events.push(Event::McpToolChanged(ToolChanged {
                policy_revision: None,
                timestamp: now,
                session_id: session_id.to_string(),
                server_id: tool.server_id.clone(),
                tool_name: tool.tool.clone(),
                old_hash,
                new_hash: tool.tool_hash.clone(),
                action: match self.pinning.on_change {
                    crate::config::OnChange::Block => Action::Block,
                    crate::config::OnChange::Alert => Action::Allow,
                },
            }));
        }
        events
    }
}
