//! Argument rules: what a call may do, not only which tool it names.
//!
//! A rule picks calls by server and tool glob and holds when every one of its conditions holds
//! on the call's `arguments`; the first rule that holds decides (allow, block, or allow with
//! the matched values redacted from the record). They are call-time rules only: they never
//! hide a tool from `tools/list`, whose entries have no arguments.
//!
//! Fail closed: a condition that cannot be judged — a string test on a number, a relative path
//! under a path prefix, a value too deep to reach — makes a `block` rule block, saying why;
//! an `allow` or `redact` rule then does not hold.
//!
//! Which rules can apply to a (server, tool) is computed once per pair and cached, so a call
//! is judged by the few rules that name its tool however many rules there are
//! (`cargo xtask bench policy`).

mod conditions;
mod paths;
mod schema;

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use serde_json::Value;

use super::glob::Glob;
use crate::config::{
    ArgumentAction, ArgumentCondition, ArgumentRule, ArgumentTest as Test, compile_condition,
    normalized_path as normalized,
};
use conditions::Held;
use paths::{DirCache, Resolved};
pub(crate) use schema::schema_mismatch;

/// Most (server, tool) pairs whose applicable rules are cached; past it the cache is cleared.
const MAX_CACHED_PAIRS: usize = 100_000;
/// Longest server id plus tool name whose applicable rules are cached.
const MAX_CACHED_NAME: usize = 512;

/// What the record keeps instead of a redacted value.
pub(crate) const REDACTED: &str = "[toolwall:redacted]";

/// Indices of the rules that apply to one (server, tool).
type Applicable = HashMap<(String, String), Arc<[u32]>>;

/// The compiled `argument_rules`.
#[derive(Debug, Default)]
pub(crate) struct ArgumentRules {
    rules: Vec<Rule>,
    /// (server, tool) → indices of the rules whose globs match them.
    applicable: RwLock<Applicable>,
    /// Directories resolved for `path_prefix` lately.
    dirs: DirCache,
}

#[derive(Debug)]
struct Rule {
    /// `argument_rules[3] "no-etc"`, as reasons name it.
    label: String,
    server: Glob,
    tool: Glob,
    when: Vec<Condition>,
    action: ArgumentAction,
    reason: Option<String>,
}

#[derive(Debug)]
struct Condition {
    pointer: String,
    /// The pointer's segments, unescaped once (`None`: `*`).
    segments: Vec<Option<String>>,
    test: Test,
}

impl Condition {
    fn new(c: &ArgumentCondition) -> Result<Self, String> {
        let segments = match c.pointer.strip_prefix('/') {
            None => Vec::new(),
            Some(rest) => rest
                .split('/')
                .map(|raw| (raw != "*").then(|| raw.replace("~1", "/").replace("~0", "~")))
                .collect(),
        };
        Ok(Condition {
            pointer: c.pointer.clone(),
            segments,
            test: compile_condition(c)?,
        })
    }
}

/// What the argument rules say about one call.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Judgement {
    /// Why an allow/block rule refused it (the first of those that held decides).
    pub block: Option<String>,
    /// Why an ask rule wants a person to decide (when it held first).
    pub ask: Option<String>,
    /// Concrete pointers whose values the record must not keep: every redact rule that held
    /// (or could not be judged: redaction fails toward hiding), whatever else decided.
    pub redact: Vec<String>,
    /// The redact rules that held, for the decision's reason.
    pub redacted_by: Vec<String>,
}

impl ArgumentRules {
    /// Compiles the rules; `Err((index, key, why))` names the first that cannot be used (the
    /// config's validation reports it with its file and line first, `config/validate.rs`).
    pub(crate) fn new(rules: &[ArgumentRule]) -> Result<Self, (usize, String, String)> {
        let rules = rules
            .iter()
            .enumerate()
            .map(|(i, rule)| compile(i, rule))
            .collect::<Result<_, _>>()?;
        Ok(ArgumentRules {
            rules,
            applicable: RwLock::default(),
            dirs: DirCache::default(),
        })
    }

    /// Whether there are no argument rules at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether any rule may judge calls of `tool` on `server`: a layer that sees arguments
    /// arrive in pieces (a streamed LLM response) holds such a call until they are whole.
    pub(crate) fn apply_to(&self, server: &str, tool: &str) -> bool {
        !self.is_empty() && !self.applicable(server, tool).is_empty()
    }

    /// Judges `arguments` of a call of `tool` on `server`.
    pub(crate) fn judge(&self, server: &str, tool: &str, arguments: &Value) -> Judgement {
        let mut out = Judgement::default();
        if self.rules.is_empty() {
            return out;
        }
        let mut decided = false;
        let mut paths = Resolved {
            seen: HashMap::new(),
            dirs: &self.dirs,
        };
        for &i in self.applicable(server, tool).iter() {
            let rule = &self.rules[i as usize];
            if decided && rule.action != ArgumentAction::Redact {
                continue;
            }
            // An allow rule must hold for every value a `*` reaches; the others for any.
            let every = rule.action == ArgumentAction::Allow;
            let mut unknown = None;
            let mut holds = true;
            let mut reached = Vec::new();
            for condition in &rule.when {
                let want_paths = rule.action == ArgumentAction::Redact;
                match condition.held(arguments, every, &mut paths, &mut reached, want_paths) {
                    Held::Yes => {}
                    Held::No => {
                        holds = false;
                        break;
                    }
                    Held::Unknown(why) => {
                        unknown.get_or_insert(why);
                    }
                }
            }
            if !holds {
                continue;
            }
            let because = rule
                .reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            match (rule.action, unknown) {
                (ArgumentAction::Block, Some(why)) => {
                    out.block = Some(format!(
                        "{} cannot judge the arguments ({why}); blocked{because}",
                        rule.label
                    ));
                    decided = true;
                }
                (ArgumentAction::Block, None) => {
                    out.block = Some(format!(
                        "arguments refused by {}{}",
                        rule.label,
                        if because.is_empty() {
                            format!(" ({})", rule.describe())
                        } else {
                            because
                        }
                    ));
                    decided = true;
                }
                // A person sees the arguments: one the rule cannot read is theirs to judge.
                (ArgumentAction::Ask, unknown) => {
                    out.ask = Some(format!(
                        "{} asks a person{}{}",
                        rule.label,
                        unknown
                            .map(|why| format!(" (cannot judge the arguments: {why})"))
                            .unwrap_or_default(),
                        if because.is_empty() {
                            format!(" ({})", rule.describe())
                        } else {
                            because
                        }
                    ));
                    decided = true;
                }
                (ArgumentAction::Allow, None) => decided = true,
                (ArgumentAction::Allow, Some(_)) => {}
                (ArgumentAction::Redact, _) => {
                    for pointer in reached {
                        if !out.redact.contains(&pointer) {
                            out.redact.push(pointer);
                        }
                    }
                    out.redacted_by
                        .push(format!("arguments redacted by {}{because}", rule.label));
                }
            }
        }
        out
    }

    fn applicable(&self, server: &str, tool: &str) -> Arc<[u32]> {
        // Names are the caller's: a long one is matched each time, never kept (else 1 MB names
        // could be cached 100,000 deep).
        if server.len() + tool.len() > MAX_CACHED_NAME {
            return self.matching(server, tool);
        }
        let key = (server.to_owned(), tool.to_owned());
        if let Some(hit) = self
            .applicable
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return hit.clone();
        }
        let found = self.matching(server, tool);
        let mut cache = self
            .applicable
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= MAX_CACHED_PAIRS {
            cache.clear();
        }
        cache.insert(key, found.clone());
        found
    }
}

impl ArgumentRules {
    fn matching(&self, server: &str, tool: &str) -> Arc<[u32]> {
        self.rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.server.matches(server) && r.tool.matches(tool))
            .map(|(i, _)| i as u32)
            .collect()
    }
}

/// `arguments` with [`REDACTED`] at `pointers` (those that reach a value).
pub(crate) fn redacted(arguments: &Value, pointers: &[String]) -> Value {
    let mut copy = arguments.clone();
    for pointer in pointers {
        if let Some(v) = copy.pointer_mut(pointer) {
            *v = Value::String(REDACTED.to_owned());
        }
    }
    copy
}

impl Rule {
    /// The conditions in words, for a reason without one of the config's.
    fn describe(&self) -> String {
        self.when
            .iter()
            .map(|c| {
                let p = &c.pointer;
                match &c.test {
                    Test::Glob(g, _) => format!("{p} matches {g:?}"),
                    Test::Regex(r) => format!("{p} matches /{}/", r.as_str()),
                    Test::PathPrefix(prefix) => format!("{p} is under {prefix}"),
                    Test::Range(r) => match (r.min, r.max) {
                        (Some(lo), Some(hi)) => format!("{p} in [{lo}, {hi}]"),
                        (Some(lo), None) => format!("{p} ≥ {lo}"),
                        (None, Some(hi)) => format!("{p} ≤ {hi}"),
                        (None, None) => format!("{p} is a number"),
                    },
                    Test::Present(true) => format!("{p} is present"),
                    Test::Present(false) => format!("{p} is absent"),
                }
            })
            .collect::<Vec<_>>()
            .join(" and ")
    }
}

fn compile(i: usize, rule: &ArgumentRule) -> Result<Rule, (usize, String, String)> {
    let label = match &rule.name {
        Some(name) => format!("argument rule {name:?}"),
        None => format!("argument_rules[{i}]"),
    };
    if rule.when.is_empty() {
        return Err((
            i,
            "when".into(),
            "an argument rule needs at least one condition under `when:` (a rule on the name alone belongs in allowed_tools / denied_tools)".into(),
        ));
    }
    let when = rule
        .when
        .iter()
        .enumerate()
        .map(|(j, c)| Condition::new(c).map_err(|why| (i, format!("when[{j}]"), why)))
        .collect::<Result<_, _>>()?;
    Ok(Rule {
        label,
        server: Glob::new(&rule.server),
        tool: Glob::new(&rule.tool),
        when,
        action: rule.action,
        reason: rule.reason.clone(),
    })
}

#[cfg(test)]
mod tests;
