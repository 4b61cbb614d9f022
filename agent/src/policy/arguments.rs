//! Argument rules (issue 16): what a call may do, not only which tool it names.
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

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use serde_json::Value;

use super::glob::Glob;
use crate::config::{
    ArgumentAction, ArgumentCondition, ArgumentRule, ArgumentTest as Test, compile_condition,
    normalized_path as normalized,
};

/// Most (server, tool) pairs whose applicable rules are cached; past it the cache is cleared.
const MAX_CACHED_PAIRS: usize = 100_000;

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
    test: Test,
}

impl Condition {
    fn new(c: &ArgumentCondition) -> Result<Self, String> {
        Ok(Condition {
            pointer: c.pointer.clone(),
            test: compile_condition(c)?,
        })
    }
}

/// What the argument rules say about one call.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Verdict {
    /// No rule held (or one with `action: allow`): the name rules' decision stands.
    Pass,
    /// Refused, with the reason.
    Block(String),
    /// Runs; the record keeps [`REDACTED`] at these pointers. The reason names the rule.
    Redact {
        /// Which rule, for the decision's reason.
        reason: String,
        /// Where in `arguments`.
        pointers: Vec<String>,
    },
}

/// A condition's outcome.
enum Held {
    Yes,
    No,
    /// Cannot be judged; why.
    Unknown(String),
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
        })
    }

    /// Whether any rule may judge calls of `tool` on `server`: a layer that sees arguments
    /// arrive in pieces (a streamed LLM response) holds such a call until they are whole.
    pub(crate) fn apply_to(&self, server: &str, tool: &str) -> bool {
        !self.rules.is_empty() && !self.applicable(server, tool).is_empty()
    }

    /// Judges `arguments` of a call of `tool` on `server`.
    pub(crate) fn judge(&self, server: &str, tool: &str, arguments: &Value) -> Verdict {
        if self.rules.is_empty() {
            return Verdict::Pass;
        }
        for &i in self.applicable(server, tool).iter() {
            let rule = &self.rules[i as usize];
            let mut unknown = None;
            let mut holds = true;
            for condition in &rule.when {
                match condition.held(arguments) {
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
                    return Verdict::Block(format!(
                        "{} cannot judge the arguments ({why}); blocked{because}",
                        rule.label
                    ));
                }
                (ArgumentAction::Block, None) => {
                    return Verdict::Block(format!(
                        "arguments refused by {}{}",
                        rule.label,
                        if because.is_empty() {
                            format!(" ({})", rule.describe())
                        } else {
                            because
                        }
                    ));
                }
                (_, Some(_)) => continue,
                (ArgumentAction::Allow, None) => return Verdict::Pass,
                (ArgumentAction::Redact, None) => {
                    return Verdict::Redact {
                        reason: format!("arguments redacted by {}{because}", rule.label),
                        pointers: rule
                            .when
                            .iter()
                            .filter(|c| !matches!(c.test, Test::Present(false)))
                            .map(|c| c.pointer.clone())
                            .collect(),
                    };
                }
            }
        }
        Verdict::Pass
    }

    fn applicable(&self, server: &str, tool: &str) -> Arc<[u32]> {
        let key = (server.to_owned(), tool.to_owned());
        if let Some(hit) = self
            .applicable
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return hit.clone();
        }
        let found: Arc<[u32]> = self
            .rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.server.matches(server) && r.tool.matches(tool))
            .map(|(i, _)| i as u32)
            .collect();
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

impl Condition {
    fn held(&self, arguments: &Value) -> Held {
        let value = arguments.pointer(&self.pointer);
        let p = &self.pointer;
        match (&self.test, value) {
            (Test::Present(want), v) => yes_if(v.is_some() == *want),
            (_, None) => Held::No,
            (Test::Glob(_, m), Some(v)) => match v.as_str() {
                Some(s) => yes_if(m.is_match(s)),
                None => Held::Unknown(format!("{p} is {}, not a string", kind(v))),
            },
            (Test::Regex(r), Some(v)) => match v.as_str() {
                Some(s) => yes_if(r.is_match(s)),
                None => Held::Unknown(format!("{p} is {}, not a string", kind(v))),
            },
            (Test::PathPrefix(prefix), Some(v)) => match v.as_str() {
                Some(s) => match normalized(s) {
                    Some(path) => yes_if(under(&path, prefix)),
                    None => Held::Unknown(format!(
                        "{p} {s:?} is not an absolute path, so whether it lies under {prefix} depends on the server's directory"
                    )),
                },
                None => Held::Unknown(format!("{p} is {}, not a path", kind(v))),
            },
            (Test::Range(range), Some(v)) => match v.as_f64() {
                Some(n) => {
                    yes_if(range.min.is_none_or(|lo| n >= lo) && range.max.is_none_or(|hi| n <= hi))
                }
                None => Held::Unknown(format!("{p} is {}, not a number", kind(v))),
            },
        }
    }
}

fn yes_if(b: bool) -> Held {
    if b { Held::Yes } else { Held::No }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Whether normalized `path` is `prefix` or below it (by whole segments: `/etcx` is not
/// under `/etc`).
fn under(path: &str, prefix: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
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
