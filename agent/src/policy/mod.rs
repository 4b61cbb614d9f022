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
mod definitions;
mod deny;
mod glob;
mod listing_events;
mod live;
mod rate;
mod results;
mod rules;
mod secrets;

use std::{
    collections::HashMap,
    sync::{Arc, PoisonError, RwLock},
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
    config::{Config, ConfigError, DefinitionAction, Location, OnChange, VersionPinningConfig},
    decision::{
        Action, CallQuery, CallStage, Decision, Gate, ResultAction, ResultVerdict, ToolIdentity,
    },
    registry::{NamePatterns, PinState, Registry, Resolution, ToolEntry, tool_hash},
};

/// Most cached static verdicts; past it the cache is cleared (only reachable with a registry
/// of that many definitions, which is a deployment to size for, not to fail on).
const MAX_CACHED_VERDICTS: usize = 100_000;

/// How long the registered tools read for the definition checks are used again (a listing
/// judged tool by tool reads the registry once).
const OTHERS_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// The comparison set of the definition checks ([`Policy::others`]), when it was read, and
/// the servers whose newly registered tools it lacks.
#[derive(Debug)]
struct OthersCache {
    at: std::time::Instant,
    set: Arc<definitions::Others>,
    lacks: std::collections::HashSet<String>,
}

/// The outcome of the steps that depend only on the definition: `None` passes.
#[derive(Clone, Debug)]
struct CachedVerdict {
    tool_hash: String,
    block: Option<Arc<str>>,
}

/// What definitions the checks judge.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Judged {
    /// A server's listing, as it passes (findings logged).
    Listing,
    /// A listing the policy this one replaced judged after the swap.
    Forwarded,
    /// What the registry holds (`Policy::judge_stored`): rows of tools a server no longer
    /// lists among them, so a finding hides its tool and blocks no server (helper-42: a tool
    /// dropped from the listing kept its server blocked at every start).
    Stored,
}

/// A refusal by the definition checks: why, and which checks found it (a policy taking over
/// keeps it while it refuses on one of them too).
#[derive(Clone, Debug)]
struct Flag {
    why: String,
    checks: Vec<&'static str>,
    /// For a shadowing finding: the server whose tool it is named like.
    shadows: Option<String>,
}

/// The configured policy, shared by every layer (`Arc<Policy>` or `&dyn Gate`).
#[derive(Debug)]
pub(crate) struct Policy {
    enforce: bool,
    fail_closed: bool,
    /// Declared server id → (type, `host:port`).
    declared: HashMap<String, (&'static str, String)>,
    servers: ServerRules,
    tools: ToolRules,
    deny: DenyList,
    pinning: VersionPinningConfig,
    limits: RateLimiter,
    patterns: NamePatterns,
    /// Step 5: rules on a call's arguments.
    arguments: ArgumentRules,
    /// What servers' answers may carry (not a step of a call's decision: asked per message).
    results: results::ResultRules,
    /// What listed definitions may say to the model.
    definitions: definitions::DefinitionChecks,
    /// Servers (tool `None`) and tools whose definitions a check refused. A tool's entry goes
    /// when a later listing shows it clean; a server's stays until the daemon restarts. Also
    /// made from the registry's stored definitions ([`Policy::judge_stored`]), and kept
    /// across a replacement (`Policy::take_over`).
    flagged: RwLock<HashMap<(String, Option<String>), Flag>>,
    /// The policy that replaced this one: a listing this one judges after the swap (it began
    /// before) is judged by that one too, so no refusal is lost between the two (held, not
    /// weak: two swaps during one listing still reach the last).
    successor: std::sync::OnceLock<Arc<Policy>>,
    /// Servers whose stored definitions were judged ([`Policy::judge_stored`]).
    judged: RwLock<std::collections::HashSet<String>>,
    /// Held while judging them.
    judging: std::sync::Mutex<()>,
    /// The registered tools listings were last compared with, and when.
    others: std::sync::Mutex<Option<OthersCache>>,
    registry: Arc<Registry>,
    /// server id → tool → verdict of steps 2–3.
    verdicts: RwLock<HashMap<String, HashMap<String, CachedVerdict>>>,
}

impl Policy {
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
            servers: ServerRules::new(mcp.server_policy, &mcp.allowed_servers, &mcp.denied_servers),
            tools: ToolRules::new(mcp.tool_policy, &mcp.allowed_tools, &mcp.denied_tools),
            deny: DenyList::new(&mcp.deny, extra_deny, origin)?,
            pinning: mcp.version_pinning.clone(),
            limits: RateLimiter::new(&mcp.rate_limits, clock),
            patterns,
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
            flagged: RwLock::new(HashMap::new()),
            successor: std::sync::OnceLock::new(),
            judged: RwLock::new(std::collections::HashSet::new()),
            judging: std::sync::Mutex::new(()),
            others: std::sync::Mutex::new(None),
            registry,
            verdicts: RwLock::new(HashMap::new()),
        })
    }

    /// Judges the definitions the registry holds for `server_id`, once per policy, before its
    /// refusals are first read: what an earlier listing hid stays hidden under a new process
    /// or revision until the server lists again (session 21's review: a new revision or a
    /// restart forgot the tools `poisoning: hide` hid). Per server, when first asked about:
    /// judging the whole registry at every start cost seconds with thousands of servers
    /// (helper-41). Only when a finding can refuse: under `alert` there is nothing to remember.
    fn judge_stored(&self, server_id: &str) {
        if !self.definitions.refuses()
            || self
                .judged
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(server_id)
        {
            return;
        }
        // One judge at a time: a second question waits for the answer, not past it.
        let _judging = self.judging.lock().unwrap_or_else(PoisonError::into_inner);
        if self
            .judged
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(server_id)
        {
            return;
        }
        match self.registry.definitions_of(server_id) {
            Ok(tools) if !tools.is_empty() => {
                let others = self.others(Some(server_id));
                self.findings_against(server_id, &tools, &others, Judged::Stored);
            }
            Ok(_) => {}
            // Judged on its next listing; a policy taking over keeps the refusals of the one
            // before (`take_over`).
            Err(error) => {
                tracing::error!(server_id, %error, "cannot read the registry's definitions to judge them")
            }
        }
        self.judged
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(server_id.to_owned());
    }

    /// What this policy keeps of `previous`'s listing verdicts when it replaces it
    /// (`policy/live.rs`): each refusal whose checks this policy refuses on too (a tool: one
    /// at `hide` or above; a server: one at `block_server`), until the server lists again —
    /// not judged again from the stored definition, which a later listing may not have
    /// replaced (helper-40: a poisoned `_meta` leaves the hash, and so the stored row, as it
    /// was). A listing `previous` finishes after the swap is judged here too.
    pub(crate) fn take_over(self: &Arc<Self>, previous: &Policy) {
        if !self.definitions.refuses() {
            return;
        }
        // First, so a listing `previous` flags after the copy below is forwarded here (its
        // write lock orders the two).
        let _ = previous.successor.set(self.clone());
        self.carry(previous);
    }

    /// The copy of [`Policy::take_over`], without the forwarding: what the kernel's rules of
    /// a new revision are computed with before the swap (`daemon/bundle.rs`).
    pub(crate) fn carry(&self, previous: &Policy) {
        if !self.definitions.refuses() {
            return;
        }
        let before = previous
            .flagged
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut flagged = self.flagged.write().unwrap_or_else(PoisonError::into_inner);
        for (key, flag) in before {
            let floor = match key.1 {
                None => DefinitionAction::BlockServer,
                Some(_) => DefinitionAction::Hide,
            };
            // Shadowing refuses only an undeclared server's twin of a declared server's tool:
            // judged with this policy's declarations (helper-41: a revision declaring the
            // server kept it blocked until a restart, which judged it as allowed).
            let refuses = |check: &&str| {
                self.definitions.action_of(check) >= floor
                    && (*check != "shadowing"
                        || (!self.declared.contains_key(&key.0)
                            && flag
                                .shadows
                                .as_deref()
                                .is_some_and(|s| self.declared.contains_key(s))))
            };
            if flag.checks.iter().any(refuses) {
                flagged.entry(key).or_insert(flag);
            }
        }
    }

    /// Why a definition check refused the whole of `server_id`, if it did.
    fn flagged_server(&self, server_id: &str) -> Option<String> {
        self.judge_stored(server_id);
        let flagged = self.flagged.read().unwrap_or_else(PoisonError::into_inner);
        if flagged.is_empty() {
            return None;
        }
        flagged
            .get(&(server_id.to_owned(), None))
            .map(|f| f.why.clone())
    }

    /// Why a definition check refused `server_id` or its `tool`, if it did.
    fn flagged(&self, server_id: &str, tool: &str) -> Option<String> {
        self.judge_stored(server_id);
        let flagged = self.flagged.read().unwrap_or_else(PoisonError::into_inner);
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
    fn definition_findings(
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
    fn findings_against(
        &self,
        server_id: &str,
        tools: &[Value],
        others: &definitions::Others,
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
        let mut flagged = self.flagged.write().unwrap_or_else(PoisonError::into_inner);
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
        if let Some(next) = self.successor.get() {
            next.definition_findings(server_id, tools, Judged::Forwarded);
        }
    }

    /// The poisoning checks on what else a server says to the model (issue 16; session 19's
    /// attack found them missing): `instructions` in its `initialize` result (Claude Code puts
    /// them in its system prompt), prompts' and resources' descriptions in its lists. A finding
    /// under `alert` is recorded, under `hide` the text is replaced by
    /// `[toolwall:redacted:poisoning]`, under `block_server` the message is withheld. Read from
    /// what the result rules would forward (their redactions kept).
    fn poisoned_texts(
        &self,
        server_id: &str,
        message: &[u8],
        before: Option<&ResultVerdict>,
    ) -> Option<ResultVerdict> {
        if !self.definitions.poisoning_on() {
            return None;
        }
        let keys: [&[u8]; 4] = [
            b"\"instructions\"",
            b"\"prompts\"",
            b"\"resources\"",
            b"\"resourceTemplates\"",
        ];
        // Only a message that may hold such text is parsed (a `\u`-escaped key too).
        let escaped = memchr::memmem::find(message, b"\\u").is_some();
        if !escaped
            && !keys
                .iter()
                .any(|k| memchr::memmem::find(message, k).is_some())
        {
            return None;
        }
        let source = before
            .and_then(|v| v.redacted.as_deref())
            .unwrap_or(message);
        let mut value: Value = serde_json::from_slice(source).ok()?;
        let others = self.others(None);
        let mut findings = Vec::new();
        let mut strongest = ResultAction::Off;
        let mut texts: Vec<(String, &mut Value)> = Vec::new();
        if let Some(result) = value.get_mut("result").and_then(Value::as_object_mut) {
            for (key, item) in result.iter_mut() {
                match (key.as_str(), item) {
                    ("instructions", text @ Value::String(_)) => {
                        texts.push(("/result/instructions".into(), text))
                    }
                    ("prompts" | "resources" | "resourceTemplates", Value::Array(items)) => {
                        for (i, entry) in items.iter_mut().enumerate() {
                            let Some(entry) = entry.as_object_mut() else {
                                continue;
                            };
                            for (field, text) in entry.iter_mut() {
                                match (field.as_str(), text) {
                                    ("description" | "title", text @ Value::String(_)) => {
                                        texts.push((format!("/result/{key}/{i}/{field}"), text))
                                    }
                                    ("arguments", Value::Array(arguments)) => {
                                        for (j, argument) in arguments.iter_mut().enumerate() {
                                            if let Some(text) = argument
                                                .get_mut("description")
                                                .filter(|d| d.is_string())
                                            {
                                                texts.push((
                                                    format!(
                                                        "/result/{key}/{i}/arguments/{j}/description"
                                                    ),
                                                    text,
                                                ));
                                            }
                                        }
                                    }
                                    _ => {}
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        for (pointer, text) in texts {
            let Some(s) = text.as_str() else { continue };
            let found = self.definitions.check_text(s, server_id, &others);
            let Some(action) = found.iter().map(|f| f.action).max() else {
                continue;
            };
            let action = match action {
                DefinitionAction::Off => continue,
                DefinitionAction::Alert => ResultAction::Alert,
                DefinitionAction::Hide => ResultAction::Redact,
                DefinitionAction::BlockServer => ResultAction::Withhold,
            };
            let end = s.len();
            for f in &found {
                findings.push(crate::decision::ResultFinding {
                    rule: f.check.to_owned(),
                    kind: "poisoning".into(),
                    pointer: pointer.clone(),
                    start: 0,
                    end,
                    in_key: false,
                    action,
                });
            }
            if action == ResultAction::Redact {
                *text = Value::String("[toolwall:redacted:poisoning]".into());
            }
            strongest = strongest.max(action);
        }
        if findings.is_empty() {
            return None;
        }
        let mut checks: Vec<&str> = findings.iter().map(|f| f.rule.as_str()).collect();
        checks.sort_unstable();
        checks.dedup();
        let total = findings.len();
        Some(ResultVerdict {
            action: strongest,
            reason: format!(
                "poisoned text the model would read ({}): {}",
                checks.join(", "),
                match strongest {
                    ResultAction::Withhold => "withheld (block_server)",
                    ResultAction::Redact => "replaced (hide)",
                    _ => "alert",
                }
            ),
            redacted: (strongest == ResultAction::Redact)
                .then(|| serde_json::to_vec(&value).ok())
                .flatten(),
            findings,
            total,
            id_holds_finding: false,
        })
    }

    /// The registered tools listings are compared with. Other processes (shims started with
    /// this one) register too, so the registry is read again — once per [`OTHERS_FRESH`], or
    /// when this process registered a tool the set lacks: the filter judges a listing tool by
    /// tool, and a read per tool made it quadratic.
    ///
    /// A set that lacks only tools of the server being judged serves as it is: its own tools
    /// are skipped anyway (helper-47: a listing registered tool by tool rebuilt the set per
    /// tool — 2,000 tools of 512-byte names ran for minutes).
    fn others(&self, judging: Option<&str>) -> Arc<definitions::Others> {
        if let Some(cache) = &*self.others.lock().unwrap_or_else(PoisonError::into_inner)
            && cache.at.elapsed() < OTHERS_FRESH
            && cache
                .lacks
                .iter()
                .all(|server| Some(server.as_str()) == judging)
        {
            return cache.set.clone();
        }
        if let Err(error) = self.registry.reload() {
            tracing::warn!(%error, "cannot re-read the registry before the definition checks");
        }
        let others = Arc::new(definitions::Others::new(
            self.registry
                .tools()
                .iter()
                .map(|e| (e.server_id.clone(), e.tool.clone()))
                .collect(),
        ));
        *self.others.lock().unwrap_or_else(PoisonError::into_inner) = Some(OthersCache {
            at: std::time::Instant::now(),
            set: others.clone(),
            lacks: std::collections::HashSet::new(),
        });
        others
    }

    /// Adds each alert of [`Policy::definition_findings`] to its decision's reason.
    fn with_notes(decisions: &mut [Decision], notes: Vec<Option<String>>) {
        for (decision, note) in decisions.iter_mut().zip(notes) {
            if let Some(note) = note {
                decision.reason = match decision.reason.is_empty() {
                    true => note,
                    false => format!("{}; {note}", decision.reason),
                };
            }
        }
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
    fn evaluate_static(&self, server_id: &str, tool: &str, hash: &str) -> Option<String> {
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
    fn decide_entry(
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
    /// (helper-30: a call blocked by name was recorded with its token).
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
    fn decide_unregistered(
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
    fn decide_ambiguous(
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
    fn finish(&self, action: Action, reason: String, tool: Option<ToolIdentity>) -> Decision {
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

    /// Registers one listed tool and pins it on first sight when pinning trusts first hashes.
    fn register_listed(
        &self,
        server_id: &str,
        server_type: &str,
        tools: &[Value],
    ) -> Vec<Option<ToolEntry>> {
        let addr = self
            .declared
            .get(server_id)
            .map(|d| d.1.clone())
            .unwrap_or_default();
        if let Err(error) = self.registry.register(server_id, server_type, &addr, tools) {
            tracing::error!(server_id, %error, "cannot persist listed tools; deciding on them anyway");
        }
        // The comparison set may lack these tools now: rebuilt before it judges another server.
        let mut others = self.others.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cache) = others.as_mut()
            && tools
                .iter()
                .filter_map(|t| t.get("name").and_then(Value::as_str))
                .any(|name| !cache.set.contains(server_id, name))
        {
            cache.lacks.insert(server_id.to_owned());
        }
        drop(others);
        tools
            .iter()
            .map(|tool| {
                let name = tool.get("name").and_then(Value::as_str)?;
                let hash = tool_hash(tool);
                Some(ToolEntry {
                    tool: name.to_string(),
                    server_id: server_id.to_string(),
                    server_type: server_type.to_string(),
                    server_addr: addr.clone(),
                    tool_hash: hash,
                    registered_at: chrono::Utc::now(),
                })
            })
            .collect()
    }

    /// Decides visibility of a listed, registered definition (no rate limit spent).
    fn decide_listed(&self, entry: Option<ToolEntry>) -> Decision {
        match entry {
            Some(entry) => self.decide_entry(&entry, None, None),
            None => self.finish(
                Action::Block,
                "listed tool has no string \"name\"; hidden".to_string(),
                None,
            ),
        }
    }

    /// Pins first-seen definitions when `auto_trust_first` (one tool: per tool, the server's
    /// set stays open; a whole listing: every tool, and the set is sealed).
    fn trust_first(&self, server_id: &str, entries: &[Option<ToolEntry>], whole_listing: bool) {
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

impl Policy {
    /// `(server, tool)` when `name` fits a known name form (`mcp__{server}__{tool}`, the
    /// configured ones) with a server declared in the configuration.
    fn declared_form<'n>(&self, name: &'n str) -> Option<(&'n str, &'n str)> {
        self.patterns.iter().find_map(|pattern| {
            pattern.find_map(name, |server, tool| {
                server
                    .filter(|s| self.declared.contains_key(*s))
                    .map(|s| (s, tool))
            })
        })
    }
}

impl Policy {
    /// Why the deny rules block a name that is in no registry: the name as written, and the
    /// tool part of `mcp__<server>__<tool>` or of Codex's namespace `mcp__<server>`, each with
    /// the server it names (if any).
    fn denied_unknown(&self, call: &CallQuery<'_>) -> Option<String> {
        let mut forms: Vec<(&str, &str)> = vec![("", call.name)];
        if let Some(rest) = call.name.strip_prefix("mcp__")
            && let Some((server, tool)) = rest.split_once("__")
        {
            forms.push((server, tool));
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

/// The result rules' verdict and the poisoning checks' on one message, as one: the stronger
/// action, both sets of findings, and the later redaction (made on the earlier's output).
fn merge_verdicts(first: Option<ResultVerdict>, poisoned: ResultVerdict) -> ResultVerdict {
    let Some(mut first) = first else {
        return poisoned;
    };
    first.action = first.action.max(poisoned.action);
    first.total += poisoned.total;
    let room = ResultVerdict::MAX_FINDINGS.saturating_sub(first.findings.len());
    first
        .findings
        .extend(poisoned.findings.into_iter().take(room));
    first.reason = format!("{}; {}", first.reason, poisoned.reason);
    if poisoned.redacted.is_some() {
        first.redacted = poisoned.redacted;
    }
    if first.action != ResultAction::Redact {
        first.redacted = None;
    }
    first
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
            Resolution::Unknown => self
                .declared_form(call.name)
                .is_some_and(|(server, tool)| rules.apply_to(server, tool)),
        }
    }

    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
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
            // A name nobody registered still meets the deny rules: a `deny:` regex or a
            // `denied_tools` glob that matches it always blocks (issue 12, class 7).
            Resolution::Unknown => match self.denied_unknown(call) {
                Some(reason) => self.finish(Action::Block, reason, None),
                None if self.fail_closed => self.finish(
                    Action::Block,
                    format!("unknown tool {:?}, fail closed", call.name),
                    None,
                ),
                None => Decision::not_mcp(),
            },
        }
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

/// The first 12 hex digits of a hash, enough for a person to tell two apart.
fn short(hash: &str) -> &str {
    if hash.is_empty() {
        "none"
    } else {
        hash.get(..12).unwrap_or(hash)
    }
}

#[cfg(test)]
mod tests;
