//! Deciding one tool once it is identified: the steps that depend only on its definition
//! (cached per definition), version pinning, the argument rules and the rate limit, and audit
//! mode's rewriting of a block.

use std::{
    collections::HashMap,
    sync::{Arc, PoisonError},
};

use serde_json::Value;

use super::Policy;
use crate::{
    config::OnChange,
    decision::{Action, CallStage, Decision, ToolIdentity},
    registry::{PinState, ToolEntry},
};

/// Most cached static verdicts; past it the cache is cleared (only reachable with a registry
/// of that many definitions, which is a deployment to size for, not to fail on).
const MAX_CACHED_VERDICTS: usize = 100_000;

/// The outcome of the steps that depend only on the definition: `None` passes.
#[derive(Clone, Debug)]
pub(super) struct CachedVerdict {
    tool_hash: String,
    block: Option<Arc<str>>,
}

impl Policy {
    /// Steps 2–3 for a registered definition, from the cache when possible.
    fn static_verdict(&self, entry: &ToolEntry) -> Option<Arc<str>> {
        // Not cached: a listing sets and clears these.
        if let Some(why) = self.flagged(&entry.server_id, &entry.tool) {
            return Some(Arc::from(why));
        }
        {
            let cache = self.verdicts.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(hit) = cache
                .get(entry.server_id.as_str())
                .and_then(|tools| tools.get(entry.tool.as_str()))
                .filter(|hit| hit.tool_hash == entry.tool_hash)
            {
                return hit.block.clone();
            }
        }
        let block = self
            .evaluate_static(&entry.server_id, &entry.tool, &entry.tool_hash)
            .map(Arc::from);
        let mut cache = self
            .verdicts
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if cache.values().map(HashMap::len).sum::<usize>() >= MAX_CACHED_VERDICTS {
            cache.clear();
        }
        cache.entry(entry.server_id.clone()).or_default().insert(
            entry.tool.clone(),
            CachedVerdict {
                tool_hash: entry.tool_hash.clone(),
                block: block.clone(),
            },
        );
        block
    }

    /// Steps 2–3, uncached: server check, then tool check.
    pub(super) fn evaluate_static(
        &self,
        server_id: &str,
        tool: &str,
        hash: &str,
    ) -> Option<String> {
        if self.fail_closed && !self.declared.contains_key(server_id) {
            return Some(format!(
                "server {server_id:?} is not declared in sandbox.mcp.servers (fail_closed)"
            ));
        }
        self.flagged(server_id, tool)
            .or_else(|| self.servers.check(server_id))
            .or_else(|| self.deny.check(tool))
            .or_else(|| self.tools.check(server_id, tool, hash))
    }

    /// Step 4: `Err(block reason)`, `Ok(Some(alert))` or `Ok(None)`.
    fn pinning_verdict(
        &self,
        server_id: &str,
        tool: &str,
        hash: &str,
    ) -> Result<Option<String>, String> {
        if !self.pinning.enabled {
            return Ok(None);
        }
        let problem = match self.registry.pin_state(server_id, tool, hash) {
            PinState::Match => return Ok(None),
            PinState::Unpinned {
                server_sealed: false,
            } if self.pinning.auto_trust_first => return Ok(None),
            PinState::Changed { pinned_hash } => format!(
                "tool {tool:?} of server {server_id:?} changed since it was pinned (pinned {}, now {}): possible rug pull",
                short(&pinned_hash),
                short(hash)
            ),
            PinState::Unpinned {
                server_sealed: true,
            } => format!(
                "tool {tool:?} appeared on server {server_id:?} after its tool set was pinned (drift)"
            ),
            PinState::Unpinned {
                server_sealed: false,
            } => format!(
                "tool {tool:?} of server {server_id:?} is not pinned and version_pinning.auto_trust_first is off"
            ),
        };
        match self.pinning.on_change {
            OnChange::Block => Err(format!("{problem} (version_pinning.on_change: block)")),
            OnChange::Alert => Ok(Some(format!(
                "alert: {problem} (version_pinning.on_change: alert)"
            ))),
        }
    }

    /// Steps 2–5 for a registered tool; `spend`: the stage of a call, which spends budget
    /// (`None`: a listing, which does not).
    pub(super) fn decide_entry(
        &self,
        entry: &ToolEntry,
        spend: Option<CallStage>,
        arguments: Option<&Value>,
    ) -> Decision {
        let refuse = |why: String| {
            self.refused_with_redaction(
                why,
                entry.identity(),
                &entry.server_id,
                &entry.tool,
                arguments,
            )
        };
        if let Some(block) = self.static_verdict(entry) {
            return refuse(block.to_string());
        }
        let alert = match self.pinning_verdict(&entry.server_id, &entry.tool, &entry.tool_hash) {
            Err(block) => return refuse(block),
            Ok(alert) => alert,
        };
        self.decide_arguments(
            &entry.server_id,
            &entry.tool,
            arguments,
            spend,
            alert,
            || entry.identity(),
        )
    }

    /// A refusal on the name (or pinning): its record still hides what the redact rules hide
    /// (else a call blocked by name is recorded with its token:
    /// `redaction_holds_for_calls_refused_by_name_arguments_or_rate`).
    fn refused_with_redaction(
        &self,
        why: String,
        identity: ToolIdentity,
        server_id: &str,
        tool: &str,
        arguments: Option<&Value>,
    ) -> Decision {
        let mut decision = self.finish(Action::Block, why, Some(identity));
        if let Some(arguments) = arguments {
            decision.redact = self.arguments.judge(server_id, tool, arguments).redact;
        }
        decision
    }

    /// Steps 5–6 once the name passed: the argument rules (when the layer gave the
    /// arguments), then the rate limit.
    fn decide_arguments(
        &self,
        server_id: &str,
        tool: &str,
        arguments: Option<&Value>,
        spend: Option<CallStage>,
        alert: Option<String>,
        identity: impl Fn() -> ToolIdentity,
    ) -> Decision {
        let mut redact = Vec::new();
        let mut reasons: Vec<String> = alert.into_iter().collect();
        // Redaction holds whatever is decided: a refused call's record hides the values too.
        let refuse = |why: String, redact: Vec<String>| {
            let mut decision = self.finish(Action::Block, why, Some(identity()));
            decision.redact = redact;
            decision
        };
        // Asked only once the budget said yes: no one is asked about a call that could not
        // run anyway.
        let mut ask = None;
        if let Some(arguments) = arguments {
            let judged = self.arguments.judge(server_id, tool, arguments);
            redact = judged.redact;
            reasons.extend(judged.redacted_by);
            if let Some(block) = judged.block {
                return refuse(block, redact);
            }
            ask = judged.ask;
        }
        if let Some(stage) = spend
            && let Some(block) = self.limits.try_acquire(server_id, tool, stage)
        {
            return refuse(block, redact);
        }
        if let Some(why) = ask {
            let mut decision = refuse(why.clone(), redact);
            // Audit mode lets it run (`finish`): then no one is asked.
            if decision.is_blocked() {
                decision.ask = Some(why);
            }
            return decision;
        }
        Decision {
            action: Action::Allow,
            reason: reasons.join("; "),
            tool: Some(identity()),
            redact,
            ask: None,
        }
    }

    /// A call of a tool that is surely MCP (the layer or the name said which server) but not
    /// registered: blocked under `fail_closed`, else checked like a tool with no definition.
    pub(super) fn decide_unregistered(
        &self,
        server_id: &str,
        tool: &str,
        spend: Option<CallStage>,
        arguments: Option<&Value>,
    ) -> Decision {
        let declared = self.declared.get(server_id);
        let identity = ToolIdentity {
            server_id: server_id.to_string(),
            server_type: declared.map(|d| d.0.to_string()).unwrap_or_default(),
            server_addr: declared.map(|d| d.1.clone()).unwrap_or_default(),
            tool: tool.to_string(),
            tool_hash: String::new(),
        };
        let refuse = |why: String| {
            self.refused_with_redaction(why, identity.clone(), server_id, tool, arguments)
        };
        if self.fail_closed {
            return refuse(format!(
                "unknown tool {tool:?} of server {server_id:?}, fail closed"
            ));
        }
        if let Some(block) = self.evaluate_static(server_id, tool, "") {
            return refuse(block);
        }
        let alert = match self.pinning_verdict(server_id, tool, "") {
            Err(block) => return refuse(block),
            Ok(alert) => alert,
        };
        self.decide_arguments(server_id, tool, arguments, spend, alert, || {
            identity.clone()
        })
    }

    /// A bare name several servers offer.
    pub(super) fn decide_ambiguous(
        &self,
        name: &str,
        candidates: &[Arc<ToolEntry>],
        stage: CallStage,
        arguments: Option<&Value>,
    ) -> Decision {
        // A candidate whose own name differs (a colliding sanitized form, `a_b` for `a-b`)
        // is named with its tool.
        let servers = candidates
            .iter()
            .map(|c| {
                if c.tool == name {
                    format!("{:?}", c.server_id)
                } else {
                    format!("{:?} (tool {:?})", c.server_id, c.tool)
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let first = candidates.first().map(|c| c.identity());
        if self.fail_closed {
            return self.finish(
                Action::Block,
                format!("ambiguous tool name {name:?}: offered by servers {servers} (fail closed)"),
                first,
            );
        }
        // Not failing closed: the call must pass the policy of every server it could reach.
        for candidate in candidates {
            let decision = self.decide_entry(candidate, None, arguments);
            if decision.is_blocked() {
                return self.finish(
                    Action::Block,
                    format!(
                        "ambiguous tool name {name:?} (servers {servers}); on {:?}: {}",
                        candidate.server_id, decision.reason
                    ),
                    decision.tool,
                );
            }
        }
        let Some(first) = candidates.first() else {
            return Decision::not_mcp();
        };
        let mut decision = self.decide_entry(first, stage.spends(), arguments);
        if !decision.is_blocked() {
            decision.reason = format!(
                "ambiguous tool name {name:?} (servers {servers}); allowed by every one{}{}",
                if decision.reason.is_empty() { "" } else { "; " },
                decision.reason
            );
        }
        decision
    }

    /// Applies `enforce_policy: false` (audit mode): blocks become allows that say what they
    /// would have blocked.
    pub(super) fn finish(
        &self,
        action: Action,
        reason: String,
        tool: Option<ToolIdentity>,
    ) -> Decision {
        tracing::debug!(action = action.as_str(), %reason, enforced = self.enforce, "policy decision");
        if action == Action::Block && !self.enforce {
            return Decision {
                action: Action::Allow,
                reason: format!("not enforced (enforce_policy: false); would block: {reason}"),
                tool,
                redact: Vec::new(),
                ask: None,
            };
        }
        Decision {
            action,
            reason,
            tool,
            redact: Vec::new(),
            ask: None,
        }
    }
}

/// The first 12 hex digits of a hash, enough for a person to tell two apart.
fn short(hash: &str) -> &str {
    if hash.is_empty() {
        "none"
    } else {
        hash.get(..12).unwrap_or(hash)
    }
}
