//! Judging a listing with the definition checks: the findings become refusals the decisions
//! read (a tool hidden, a server blocked) or notes added to a decision's reason.

use std::sync::PoisonError;

use serde_json::Value;

use super::{Flag, Judged, Others};
use crate::{config::DefinitionAction, decision::Decision, policy::Policy};

impl Policy {
    /// Why a definition check refused the whole of `server_id`, if it did.
    pub(in crate::policy) fn flagged_server(&self, server_id: &str) -> Option<String> {
        self.judge_stored(server_id);
        let flagged = self
            .definition_state
            .flagged
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        if flagged.is_empty() {
            return None;
        }
        flagged
            .get(&(server_id.to_owned(), None))
            .map(|f| f.why.clone())
    }

    /// Why a definition check refused `server_id` or its `tool`, if it did.
    pub(in crate::policy) fn flagged(&self, server_id: &str, tool: &str) -> Option<String> {
        self.judge_stored(server_id);
        let flagged = self
            .definition_state
            .flagged
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        if flagged.is_empty() {
            return None;
        }
        flagged
            .get(&(server_id.to_owned(), None))
            .or_else(|| flagged.get(&(server_id.to_owned(), Some(tool.to_owned()))))
            .map(|f| f.why.clone())
    }

    /// The definition checks over one listing of `server_id`, before its tools are decided
    /// (so the decisions see the flags it sets and clears): a tool to hide, or a server to
    /// block, is flagged; what only alerts is returned per tool, to join its decision's reason.
    ///
    /// Shadowing judges between servers: a tool of an undeclared server named like a declared
    /// server's is the shadow and meets the configured action; between two declared (or two
    /// undeclared) servers neither can be told from the other, and the finding alerts only.
    pub(in crate::policy) fn definition_findings(
        &self,
        server_id: &str,
        tools: &[Value],
        judged: Judged,
    ) -> Vec<Option<String>> {
        if self.definitions.is_off() {
            self.forward_listing(server_id, tools);
            return vec![None; tools.len()];
        }
        let others = self.others(Some(server_id));
        let notes = self.findings_against(server_id, tools, &others, judged);
        self.forward_listing(server_id, tools);
        notes
    }

    /// [`Policy::definition_findings`] against `others`.
    pub(super) fn findings_against(
        &self,
        server_id: &str,
        tools: &[Value],
        others: &Others,
        judged: Judged,
    ) -> Vec<Option<String>> {
        let declared = self.declared.contains_key(server_id);
        // The checks first (regex work), the flags after, under the lock only for that.
        let found: Vec<_> = tools
            .iter()
            .map(|tool| {
                self.definitions
                    .check(tool, server_id, others, &|s| self.declared.contains_key(s))
            })
            .collect();
        let mut notes = Vec::with_capacity(tools.len());
        let mut block_server = None;
        let mut flagged = self
            .definition_state
            .flagged
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        for (tool, mut found) in tools.iter().zip(found) {
            let name = tool.get("name").and_then(Value::as_str).unwrap_or("");
            let key = (server_id.to_owned(), Some(name.to_owned()));
            for finding in &mut found {
                let trusted_over = |other: &str| !declared && self.declared.contains_key(other);
                if finding.check == "shadowing"
                    && finding.action > DefinitionAction::Alert
                    && !finding.shadows.as_deref().is_some_and(trusted_over)
                {
                    finding.action = DefinitionAction::Alert;
                    finding.evidence.push_str(
                        " (alert only: neither server is declared while the other is not)",
                    );
                }
            }
            let Some(action) = found.iter().map(|f| f.action).max() else {
                flagged.remove(&key);
                notes.push(None);
                continue;
            };
            let evidence = found
                .iter()
                .map(|f| format!("{}: {}", f.check, f.evidence))
                .collect::<Vec<_>>()
                .join("; ");
            if judged == Judged::Listing {
                tracing::warn!(
                    server_id,
                    tool = name,
                    action = action.as_str(),
                    "definition check: {evidence}"
                );
            }
            let why = format!("definition check ({}): {evidence}", action.as_str());
            let flag = |floor, why| Flag {
                why,
                checks: found
                    .iter()
                    .filter(|f| f.action >= floor)
                    .map(|f| f.check)
                    .collect(),
                shadows: found.iter().find_map(|f| f.shadows.clone()),
            };
            match action {
                DefinitionAction::Hide => {
                    flagged.insert(key, flag(DefinitionAction::Hide, why));
                    notes.push(None);
                }
                DefinitionAction::BlockServer if judged == Judged::Stored => {
                    flagged.insert(key, flag(DefinitionAction::Hide, why));
                    notes.push(None);
                }
                DefinitionAction::BlockServer => {
                    block_server.get_or_insert(flag(
                        DefinitionAction::BlockServer,
                        format!("server {server_id:?} blocked: tool {name:?} failed a {why}"),
                    ));
                    notes.push(None);
                }
                _ => {
                    flagged.remove(&key);
                    notes.push(Some(why));
                }
            }
        }
        if let Some(flag) = block_server {
            flagged.insert((server_id.to_owned(), None), flag);
        }
        notes
    }

    /// Has the policy that replaced this one judge a listing this one judged late.
    fn forward_listing(&self, server_id: &str, tools: &[Value]) {
        if let Some(next) = self.definition_state.successor.get() {
            next.definition_findings(server_id, tools, Judged::Forwarded);
        }
    }

    /// Adds each alert of [`Policy::definition_findings`] to its decision's reason.
    pub(in crate::policy) fn with_notes(decisions: &mut [Decision], notes: Vec<Option<String>>) {
        for (decision, note) in decisions.iter_mut().zip(notes) {
            if let Some(note) = note {
                decision.reason = match decision.reason.is_empty() {
                    true => note,
                    false => format!("{}; {note}", decision.reason),
                };
            }
        }
    }
}
