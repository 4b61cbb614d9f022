//! Names no registry knows: what server and tool they may stand for, and how they are judged.
//!
//! A name in a form that marks an MCP tool (`mcp__<server>__<tool>`, a configured form with a
//! prefix of its own) is an MCP tool of the server it names, known or not: judged by the rules
//! and recorded, never passed as a native tool. Where an unknown server's id ends is not known
//! (`mcp__a__b__c`; with `mcp_{server}_{tool}`, any id with `_`), so every reading of the name
//! is judged and a refusal of any refuses the call; the record names the first reading. A name
//! of no marked form (a bare `transfer`, `bank.transfer` in a form without a prefix) is judged
//! only where an argument rule for its server names a reading of it: the rule holds wherever the
//! tool is from. A flat name's `_` may stand for `-` (Codex writes `get-sum` as `get_sum`), so a
//! rule on either spelling refuses it.

use std::collections::HashMap;

use super::Policy;
use crate::{
    decision::{Action, CallQuery, Decision},
    registry::{claude_form, codex_form},
};

/// Most readings of one name judged: a name with more ways to split than this is refused as
/// unreadable rather than judged in part (real names split one or two ways).
const MAX_READINGS: usize = 16;

/// Every way agents write the declared `ids` → the id: itself, then Claude Code's and Codex's
/// sanitised forms, the first declared id keeping a form two share.
pub(super) fn declared_names<'a>(ids: impl Iterator<Item = &'a str>) -> HashMap<String, String> {
    let ids: Vec<&str> = ids.collect();
    let mut names: HashMap<String, String> = ids
        .iter()
        .map(|id| (id.to_string(), id.to_string()))
        .collect();
    for id in &ids {
        for alias in [claude_form(id), codex_form(id)].into_iter().flatten() {
            names.entry(alias).or_insert_with(|| id.to_string());
        }
    }
    names
}

impl Policy {
    /// `(declared id, tool)` when `name` fits a known name form (`mcp__{server}__{tool}`, the
    /// configured ones) with a server declared in the configuration, by its id or as agents
    /// sanitise it (`mcp__my_bank__ping` is declared server `my.bank`'s).
    pub(super) fn declared_form<'n>(&self, name: &'n str) -> Option<(&str, &'n str)> {
        self.patterns.iter().find_map(|pattern| {
            pattern.find_map(name, |server, tool| {
                let id = self.declared_names.get(server?)?;
                Some((id.as_str(), tool))
            })
        })
    }

    /// A refusal of any reading of `name` as a declared server's tool: where a server id
    /// ends is not known (`mcp_google_drive_x` is `google`'s or `google_drive`'s tool), and a
    /// flat name's `_` may stand for `-` (`get_sum` for `get-sum`), so each is judged (no
    /// rate budget spent) and any refusal refuses the call, whichever reading the record
    /// names.
    pub(super) fn declared_refusal(&self, call: &CallQuery<'_>) -> Option<Decision> {
        if call.server_id.is_some() || call.namespace.is_some() {
            return None;
        }
        let mut refusal = None;
        for pattern in self.patterns.iter() {
            let _: Option<()> = pattern.find_map(call.name, |server, tool| {
                let id = self.declared_names.get(server?)?;
                let whole = CallQuery {
                    server_id: Some(id.as_str()),
                    name: call.name,
                    namespace: None,
                    stage: crate::decision::CallStage::Inspected,
                    arguments: None,
                };
                // In a form without a prefix, a tool the server lists under the whole name
                // (`github`'s `github_search`) is that tool, not a reading.
                if !pattern.marks_servers()
                    && matches!(
                        self.registry.resolve(&whole, &self.patterns),
                        crate::registry::Resolution::Found(e) if e.tool == call.name
                    )
                {
                    return None;
                }
                // As the server's layers would judge it: its listed tool, or an unlisted one.
                let reading = CallQuery {
                    server_id: Some(id.as_str()),
                    name: tool,
                    namespace: None,
                    stage: crate::decision::CallStage::Inspected,
                    arguments: call.arguments,
                };
                let listed = matches!(
                    self.registry.resolve(&reading, &self.patterns),
                    crate::registry::Resolution::Found(_)
                );
                let mut decision = self.check_call_inner(&reading);
                if !decision.is_blocked() && !listed && tool.contains('_') {
                    let hyphenated = tool.replace('_', "-");
                    decision = self.decide_unregistered(id, &hyphenated, None, call.arguments);
                }
                decision.is_blocked().then(|| refusal = Some(decision))
            });
            if refusal.is_some() {
                break;
            }
        }
        refusal
    }

    /// The readings of `name` in forms that mark an MCP tool, each `(server, tool)`; `None`
    /// when there are more than [`MAX_READINGS`].
    fn marked_readings<'n>(&self, name: &'n str) -> Option<Vec<(&'n str, &'n str)>> {
        let mut out = Vec::new();
        for pattern in self.patterns.iter().filter(|p| p.marks_servers()) {
            let too_many: Option<()> = pattern.find_map(name, |server, tool| {
                out.push((server?, tool));
                (out.len() > MAX_READINGS).then_some(())
            });
            if too_many.is_some() {
                return None;
            }
        }
        Some(out)
    }

    /// The readings of `name` (bare, or in any form) that an argument rule names.
    fn ruled_readings<'n>(&self, name: &'n str) -> Vec<(&'n str, &'n str)> {
        let rules = &self.arguments;
        if rules.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let names = |server: &str, tool: &str| {
            rules.apply_to(server, tool) || rules.apply_to(server, &tool.replace('_', "-"))
        };
        if names("", name) {
            out.push(("", name));
        }
        for pattern in self.patterns.iter() {
            let _: Option<()> = pattern.find_map(name, |server, tool| {
                let server = server.unwrap_or("");
                if names(server, tool) {
                    out.push((server, tool));
                }
                (out.len() >= MAX_READINGS).then_some(())
            });
        }
        out
    }

    /// Whether a streamed call of `name` must be held until its arguments are whole: some
    /// reading of it is one an argument rule judges.
    pub(super) fn unknown_needs_arguments(&self, name: &str) -> bool {
        let rules = &self.arguments;
        let marked = self.marked_readings(name).unwrap_or_default();
        marked.iter().any(|(server, tool)| {
            rules.apply_to(server, tool) || rules.apply_to(server, &tool.replace('_', "-"))
        }) || !self.ruled_readings(name).is_empty()
    }

    /// The decision on a name no registry knows and no declared server's form fits.
    pub(super) fn decide_unknown(&self, call: &CallQuery<'_>) -> Decision {
        if let Some(reason) = self.denied_unknown(call) {
            return self.finish(Action::Block, reason, None);
        }
        if self.fail_closed {
            return self.finish(
                Action::Block,
                format!("unknown tool {:?}, fail closed", call.name),
                None,
            );
        }
        let Some(marked) = self.marked_readings(call.name) else {
            return self.finish(
                Action::Block,
                format!(
                    "tool {:?} splits into more than {MAX_READINGS} (server, tool) readings; refused unjudged",
                    call.name
                ),
                None,
            );
        };
        let readings = if marked.is_empty() {
            self.ruled_readings(call.name)
        } else {
            marked
        };
        if readings.is_empty() {
            return Decision::not_mcp();
        }
        self.decide_readings(&readings, call)
    }

    /// Judges every reading (and its `_`-as-`-` spelling) without spending a rate limit: a hard
    /// refusal of any is the call's, else a question of any; otherwise the first reading's
    /// decision, spending.
    fn decide_readings(&self, readings: &[(&str, &str)], call: &CallQuery<'_>) -> Decision {
        let mut asked = None;
        for (server, tool) in readings {
            let hyphenated = tool.contains('_').then(|| tool.replace('_', "-"));
            for tool in std::iter::once(*tool).chain(hyphenated.as_deref()) {
                let decision = self.decide_unregistered(server, tool, None, call.arguments);
                if decision.is_blocked() {
                    if decision.ask.is_none() {
                        return decision;
                    }
                    asked.get_or_insert(decision);
                }
            }
        }
        if let Some(asked) = asked {
            return asked;
        }
        let (server, tool) = readings[0];
        self.decide_unregistered(server, tool, call.stage.spends(), call.arguments)
    }

    /// Why the deny rules block a name that is in no registry: the name as written, and the
    /// tool part of every reading of `mcp__<server>__<tool>` and of Codex's namespace
    /// `mcp__<server>`, each with the server it names (if any).
    fn denied_unknown(&self, call: &CallQuery<'_>) -> Option<String> {
        let mut forms: Vec<(&str, &str)> = vec![("", call.name)];
        if let Some(rest) = call.name.strip_prefix("mcp__") {
            forms.extend(
                rest.match_indices("__")
                    .take(MAX_READINGS)
                    .map(|(at, _)| (&rest[..at], &rest[at + 2..])),
            );
        }
        if let Some(server) = call.namespace.and_then(|ns| ns.strip_prefix("mcp__")) {
            forms.push((server, call.name));
        }
        forms.into_iter().find_map(|(server, tool)| {
            self.deny
                .check(tool)
                .or_else(|| self.tools.denied(server, tool))
                .map(|why| format!("unregistered tool {:?}: {why}", call.name))
        })
    }
}
