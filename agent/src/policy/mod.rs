//! The policy engine: answers [`Gate`] questions with the registry and the configured rules.
//!
//! Evaluation order (README "Policy"), first block wins:
//! 1. **identify** the tool in the registry (agent name forms resolved); unknown names are
//!    blocked under `fail_closed`, otherwise they are not MCP ([`Decision::not_mcp`]);
//! 2. **server**: undeclared servers under `fail_closed`, then `denied_servers` /
//!    `allowed_servers` (see [`rules`] for how allow and deny rules combine);
//! 3. **tool**: the `deny:` regexes (always block), then `denied_tools` / `allowed_tools` with
//!    their optional `content_hash`;
//! 4. **version pinning**: a changed definition, or a tool new since the server's set was
//!    sealed, blocks or alerts per `on_change`;
//! 5. **rate limit**: one token of the server's bucket, spent only if all of the above allow.
//!
//! Steps 2–3 depend only on (server, tool, definition hash) and the config, so their outcome
//! is computed once per registered definition and cached: with any number of rules a
//! repeated call costs a few hash lookups.

#![warn(missing_docs)]

mod arguments;
#[cfg(feature = "bench")]
mod bench;
mod decide;
mod definitions;
mod deny;
mod dispatch;
mod glob;
mod listing;
mod listing_events;
mod live;
mod rate;
mod results;
mod rules;
mod secrets;
mod unknown;

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use serde_json::Value;

pub(crate) use arguments::{ArgumentRules, redacted, schema_mismatch};
#[cfg(feature = "bench")]
pub use bench::{
    ResultText, bench_argument_decisions, bench_decisions, bench_result_inspection,
    bench_rule_evaluation, result_message,
};
pub(crate) use deny::DenyList;
pub(crate) use live::{InForce, LivePolicy};

/// A name glob as the rules compile it (`toolwall config check` selects tools with it).
pub(crate) fn glob(source: &str) -> glob::Glob {
    glob::Glob::new(source)
}
pub(crate) use rate::{Clock, MonotonicClock, RateLimiter};
#[cfg(test)]
pub(crate) use results::ResultRules;
pub(crate) use rules::{ServerRules, ToolRules};

use crate::{
    config::{Config, ConfigError, Location, VersionPinningConfig},
    decision::{CallQuery, Decision, Gate, ResultAction, ResultVerdict},
    registry::{NamePatterns, Registry, Resolution},
};
use decide::CachedVerdict;
use definitions::{Judged, merge_verdicts};

/// The configured policy, shared by every layer (`Arc<Policy>` or `&dyn Gate`).
#[derive(Debug)]
pub(crate) struct Policy {
    enforce: bool,
    fail_closed: bool,
    /// Declared server id → (type, `host:port`).
    declared: HashMap<String, (&'static str, String)>,
    /// Declared network server id → its URL.
    declared_urls: HashMap<String, String>,
    /// Every way agents write a declared server's id (itself, and as Claude Code and Codex
    /// sanitise it: `my.bank` → `my_bank`) → the id.
    declared_names: HashMap<String, String>,
    servers: ServerRules,
    tools: ToolRules,
    deny: DenyList,
    pinning: VersionPinningConfig,
    limits: RateLimiter,
    patterns: NamePatterns,
    /// Step 5: rules on a call's arguments.
    arguments: ArgumentRules,
    /// Tools whose arguments name the call they make (`dispatch.rs`).
    dispatchers: Vec<String>,
    /// What servers' answers may carry (not a step of a call's decision: asked per message).
    results: results::ResultRules,
    /// What listed definitions may say to the model.
    definitions: definitions::DefinitionChecks,
    /// What the definition checks refused and remember across listings and policies.
    definition_state: definitions::DefinitionState,
    registry: Arc<Registry>,
    /// server id → tool → verdict of steps 2–3.
    verdicts: RwLock<HashMap<String, HashMap<String, CachedVerdict>>>,
}

impl Policy {
    /// A call of a tool (not of a dispatcher: `dispatch.rs`).
    fn check_call_inner(&self, call: &CallQuery<'_>) -> Decision {
        if let Some(refusal) = self.declared_refusal(call) {
            return refusal;
        }
        match self.registry.resolve(call, &self.patterns) {
            // A registered tool of another server named like a declared server's tool whose
            // server has not registered it (`mcp__github__delete_repo` listed by server `x`):
            // it is the declared server's tool first, and is judged as such.
            Resolution::Found(entry)
                if call.server_id.is_none()
                    && self
                        .declared_form(call.name)
                        .is_some_and(|(server, _)| server != entry.server_id) =>
            {
                let (server_id, tool) = self.declared_form(call.name).unwrap_or_default();
                self.decide_unregistered(server_id, tool, call.stage.spends(), call.arguments)
            }
            Resolution::Found(entry) => {
                self.decide_entry(&entry, call.stage.spends(), call.arguments)
            }
            Resolution::Ambiguous { name, candidates } => {
                self.decide_ambiguous(&name, &candidates, call.stage, call.arguments)
            }
            Resolution::UnknownOnServer { server_id, tool } => {
                // Codex writes `-` as `_` in function names; until the server's tools are
                // registered the original spelling is unknown, so a rule on either blocks.
                if call.namespace.is_some() && tool.contains('_') {
                    let hyphenated = self.decide_unregistered(
                        &server_id,
                        &tool.replace('_', "-"),
                        None,
                        call.arguments,
                    );
                    if hyphenated.is_blocked() {
                        return hyphenated;
                    }
                }
                self.decide_unregistered(&server_id, &tool, call.stage.spends(), call.arguments)
            }
            // Not registered yet, but named in the form of a declared server's tool (a stdio
            // server whose shim has not listed its tools yet): that server's tool, decided by
            // the rules, never waved through as a native tool.
            Resolution::Unknown if self.declared_form(call.name).is_some() => {
                let (server_id, tool) = self.declared_form(call.name).unwrap_or_default();
                self.decide_unregistered(server_id, tool, call.stage.spends(), call.arguments)
            }
            // A name no registry knows and no declared server's form fits (`unknown.rs`).
            Resolution::Unknown => self.decide_unknown(call),
        }
    }

    /// Compiles `config`'s policy over `registry`; `extra_deny` are the `--deny` regexes of
    /// the shim or filter proxy command line. Fails on a pattern that cannot be applied.
    pub(crate) fn new(
        config: &Config,
        registry: Arc<Registry>,
        extra_deny: &[String],
    ) -> Result<Policy, ConfigError> {
        Policy::with_clock(
            config,
            registry,
            extra_deny,
            Arc::new(MonotonicClock::default()),
        )
    }

    /// [`Policy::new`] with the rate limiter's clock given (tests move time by hand).
    pub(crate) fn with_clock(
        config: &Config,
        registry: Arc<Registry>,
        extra_deny: &[String],
        clock: Arc<dyn Clock>,
    ) -> Result<Policy, ConfigError> {
        let mcp = &config.sandbox.mcp;
        let origin = if config.origin.is_empty() {
            "configuration"
        } else {
            config.origin.as_str()
        };
        let patterns =
            NamePatterns::new(&mcp.name_patterns).map_err(|(i, why)| ConfigError::Invalid {
                location: Location {
                    file: origin.to_string(),
                    line: None,
                    column: None,
                },
                key: format!("sandbox.mcp.name_patterns[{i}]"),
                message: why,
                hint: "write the form with placeholders, e.g. \"{server}.{tool}\"",
            })?;
        Ok(Policy {
            enforce: mcp.enforce_policy,
            fail_closed: mcp.fail_closed,
            declared: mcp
                .servers
                .iter()
                .map(|s| (s.id.clone(), (s.server_type.as_str(), s.addr())))
                .collect(),
            declared_urls: mcp
                .servers
                .iter()
                .filter_map(|s| Some((s.id.clone(), s.url.clone()?)))
                .collect(),
            declared_names: unknown::declared_names(mcp.servers.iter().map(|s| s.id.as_str())),
            servers: ServerRules::new(mcp.server_policy, &mcp.allowed_servers, &mcp.denied_servers),
            tools: ToolRules::new(mcp.tool_policy, &mcp.allowed_tools, &mcp.denied_tools),
            deny: DenyList::new(&mcp.deny, extra_deny, origin)?,
            pinning: mcp.version_pinning.clone(),
            limits: RateLimiter::new(&mcp.rate_limits, clock),
            patterns,
            dispatchers: dispatch::BUILT_IN
                .iter()
                .map(|d| (*d).to_owned())
                .chain(mcp.dispatchers.iter().cloned())
                .collect(),
            arguments: ArgumentRules::new(&mcp.argument_rules).map_err(|(i, key, why)| {
                ConfigError::Invalid {
                    location: Location {
                        file: origin.to_string(),
                        line: None,
                        column: None,
                    },
                    key: format!("sandbox.mcp.argument_rules[{i}].{key}"),
                    message: why,
                    hint: "see the README's \"Argument rules\"",
                }
            })?,
            results: results::ResultRules::new(&mcp.result_inspection).map_err(|(key, why)| {
                ConfigError::Invalid {
                    location: Location {
                        file: origin.to_string(),
                        line: None,
                        column: None,
                    },
                    key: format!("sandbox.mcp.result_inspection.{key}"),
                    message: why,
                    hint: "see the README's \"Result inspection\"",
                }
            })?,
            definitions: definitions::DefinitionChecks::new(&mcp.definition_checks).map_err(
                |error| ConfigError::Invalid {
                    location: Location {
                        file: origin.to_string(),
                        line: None,
                        column: None,
                    },
                    key: "sandbox.mcp.definition_checks".into(),
                    message: format!("the built-in patterns do not compile: {error}"),
                    hint: "a defect of this build; please report it",
                },
            )?,
            definition_state: definitions::DefinitionState::default(),
            registry,
            verdicts: RwLock::new(HashMap::new()),
        })
    }

    /// The registry this policy reads.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The server-level verdict alone (step 1): why `server_id` is blocked, or `None` if it is
    /// allowed. The kernel layer uses it to DENY or FLAG connections to the server's addresses.
    pub(crate) fn server_block_reason(&self, server_id: &str) -> Option<String> {
        if !self.enforce {
            return None;
        }
        self.flagged_server(server_id)
            .or_else(|| self.servers.check(server_id))
    }
}

impl Gate for Policy {
    fn inspect_result(
        &self,
        server_id: &str,
        tool: Option<&str>,
        message: &[u8],
    ) -> Option<ResultVerdict> {
        let verdict = self.results.inspect(server_id, tool, message);
        let mut verdict = match self.poisoned_texts(server_id, message, verdict.as_ref()) {
            Some(poisoned) => Some(merge_verdicts(verdict, poisoned)),
            None => verdict,
        }?;
        if !self.enforce && verdict.action > ResultAction::Alert {
            verdict.reason = format!(
                "audit mode, would have been {}: {}",
                match verdict.action {
                    ResultAction::Withhold => "withheld",
                    _ => "redacted",
                },
                verdict.reason
            );
            verdict.action = ResultAction::Alert;
            verdict.redacted = None;
        }
        Some(verdict)
    }

    fn needs_arguments(&self, call: &CallQuery<'_>) -> bool {
        // A dispatcher is judged as the call its arguments name.
        if self.is_dispatcher(call) {
            return true;
        }
        let rules = &self.arguments;
        // Asked on every call by every layer: without argument rules, no registry lookup.
        if rules.is_empty() {
            return false;
        }
        match self.registry.resolve(call, &self.patterns) {
            Resolution::Found(entry) => {
                rules.apply_to(&entry.server_id, &entry.tool)
                    || self
                        .declared_form(call.name)
                        .is_some_and(|(server, tool)| rules.apply_to(server, tool))
            }
            Resolution::Ambiguous { candidates, .. } => candidates
                .iter()
                .any(|c| rules.apply_to(&c.server_id, &c.tool)),
            Resolution::UnknownOnServer { server_id, tool } => {
                rules.apply_to(&server_id, &tool)
                    || (call.namespace.is_some()
                        && rules.apply_to(&server_id, &tool.replace('_', "-")))
            }
            Resolution::Unknown => {
                self.declared_form(call.name)
                    .is_some_and(|(server, tool)| rules.apply_to(server, tool))
                    || self.unknown_needs_arguments(call.name)
            }
        }
    }

    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
        if self.is_dispatcher(call) {
            return self.check_dispatched(call);
        }
        self.check_call_inner(call)
    }

    fn dispatched(&self, name: &str, arguments: &Value) -> Option<(String, Value)> {
        self.dispatched_call(name, arguments)
    }

    fn declared_url(&self, server_id: &str) -> Option<String> {
        self.declared_urls.get(server_id).cloned()
    }

    fn check_listed(&self, server_id: &str, server_type: &str, tool: &Value) -> Decision {
        let notes =
            self.definition_findings(server_id, std::slice::from_ref(tool), Judged::Listing);
        let entries = self.register_listed(server_id, server_type, std::slice::from_ref(tool));
        self.trust_first(server_id, &entries, false);
        let mut decisions: Vec<Decision> = entries
            .into_iter()
            .map(|entry| self.decide_listed(entry))
            .collect();
        Self::with_notes(&mut decisions, notes);
        decisions.pop().unwrap_or_else(Decision::not_mcp)
    }

    fn check_listed_all(
        &self,
        server_id: &str,
        server_type: &str,
        tools: &[Value],
    ) -> Vec<Decision> {
        let notes = self.definition_findings(server_id, tools, Judged::Listing);
        let entries = self.register_listed(server_id, server_type, tools);
        self.trust_first(server_id, &entries, true);
        let mut decisions: Vec<Decision> = entries
            .into_iter()
            .map(|entry| self.decide_listed(entry))
            .collect();
        Self::with_notes(&mut decisions, notes);
        decisions
    }
}

#[cfg(test)]
mod tests;
