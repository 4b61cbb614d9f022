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
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Judgement {
    /// Why an allow/block rule refused it (the first of those that held decides).
    pub block: Option<String>,
    /// Concrete pointers whose values the record must not keep: every redact rule that held
    /// (or could not be judged: redaction fails toward hiding), whatever else decided.
    pub redact: Vec<String>,
    /// The redact rules that held, for the decision's reason.
    pub redacted_by: Vec<String>,
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
    pub(crate) fn judge(&self, server: &str, tool: &str, arguments: &Value) -> Judgement {
        let mut out = Judgement::default();
        if self.rules.is_empty() {
            return out;
        }
        let mut decided = false;
        let mut paths = Resolved::default();
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
                match condition.held(arguments, every, &mut paths, &mut reached) {
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
        // Names are the caller's: a long one is matched each time, never kept (helper-28:
        // 1 MB names cached 100,000 deep).
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

/// Paths already resolved on the host during one judgement (`path_prefix`), by their text.
#[derive(Default)]
struct Resolved(HashMap<String, Option<String>>);

impl Resolved {
    /// `path` with symlinks resolved as the host resolves them now: the longest part of it
    /// that exists, made real, and the rest as written (normalized). `None` when nothing of it
    /// resolves.
    fn real(&mut self, path: &str) -> Option<String> {
        if let Some(hit) = self.0.get(path) {
            return hit.clone();
        }
        let mut head = std::path::PathBuf::from(path);
        let mut rest: Vec<std::ffi::OsString> = Vec::new();
        let real = loop {
            if let Ok(real) = std::fs::canonicalize(&head) {
                let mut real = real;
                for part in rest.iter().rev() {
                    real.push(part);
                }
                break real.to_str().and_then(normalized);
            }
            match (head.file_name().map(|f| f.to_owned()), head.parent()) {
                (Some(name), Some(parent)) => {
                    rest.push(name);
                    head = parent.to_path_buf();
                }
                _ => break None,
            }
        };
        self.0.insert(path.to_owned(), real.clone());
        real
    }
}

/// One value a pointer reaches: (its concrete pointer, the value), or why it cannot be
/// followed (a scalar where the pointer goes on: a server may decode a string holding JSON,
/// as the Python SDK does for non-`str` parameters; helper-28).
enum Reach<'v> {
    Value(String, &'v Value),
    Through(String),
}

/// Every value `pointer` reaches in `root`; a `*` segment stands for every element or member.
fn reach<'v>(root: &'v Value, pointer: &str) -> Vec<Reach<'v>> {
    if pointer.is_empty() {
        return vec![Reach::Value(String::new(), root)];
    }
    let mut at: Vec<(String, &'v Value)> = vec![(String::new(), root)];
    let mut through = Vec::new();
    for raw in pointer[1..].split('/') {
        let key = raw.replace("~1", "/").replace("~0", "~");
        let mut next = Vec::new();
        for (path, v) in at {
            match v {
                Value::Object(map) if raw == "*" => {
                    for (k, c) in map {
                        next.push((
                            format!("{path}/{}", k.replace('~', "~0").replace('/', "~1")),
                            c,
                        ));
                    }
                }
                Value::Array(items) if raw == "*" => {
                    for (i, c) in items.iter().enumerate() {
                        next.push((format!("{path}/{i}"), c));
                    }
                }
                Value::Object(map) => {
                    if let Some(c) = map.get(&key) {
                        next.push((format!("{path}/{raw}"), c));
                    }
                }
                Value::Array(items) => {
                    if let Some(c) = key.parse::<usize>().ok().and_then(|i| items.get(i)) {
                        next.push((format!("{path}/{raw}"), c));
                    }
                }
                Value::Null => {}
                scalar => through.push(Reach::Through(format!(
                    "{} is {} where {pointer} goes on (a server may read it as JSON)",
                    if path.is_empty() {
                        "the arguments"
                    } else {
                        &path
                    },
                    kind(scalar)
                ))),
            }
        }
        at = next;
    }
    let mut out: Vec<Reach<'v>> = at.into_iter().map(|(p, v)| Reach::Value(p, v)).collect();
    out.extend(through);
    out
}

impl Condition {
    /// Whether the condition holds; `every`: for every value a `*` reaches (else for any).
    /// `reached` gets the concrete pointers of the values it looked at.
    fn held(
        &self,
        arguments: &Value,
        every: bool,
        paths: &mut Resolved,
        reached: &mut Vec<String>,
    ) -> Held {
        let found = reach(arguments, &self.pointer);
        if let Test::Present(want) = self.test {
            if let Some(Reach::Through(why)) = found.iter().find(|r| matches!(r, Reach::Through(_)))
            {
                return Held::Unknown(why.clone());
            }
            let present = !found.is_empty();
            if present {
                reached.extend(found.iter().filter_map(|r| match r {
                    Reach::Value(p, _) => Some(p.clone()),
                    Reach::Through(_) => None,
                }));
            }
            return yes_if(present == want);
        }
        if found.is_empty() {
            return Held::No;
        }
        let (mut yes, mut no, mut unknown) = (false, false, None);
        for r in &found {
            let held = match r {
                Reach::Through(why) => Held::Unknown(why.clone()),
                Reach::Value(p, v) => {
                    reached.push(p.clone());
                    self.test_value(p, v, paths)
                }
            };
            match held {
                Held::Yes => yes = true,
                Held::No => no = true,
                Held::Unknown(why) => {
                    unknown.get_or_insert(why);
                }
            }
        }
        match (every, yes, no, unknown) {
            (true, _, true, _) => Held::No,
            (false, true, _, _) => Held::Yes,
            (_, _, _, Some(why)) => Held::Unknown(why),
            (true, _, false, None) => Held::Yes,
            (false, false, _, None) => Held::No,
        }
    }

    fn test_value(&self, p: &str, v: &Value, paths: &mut Resolved) -> Held {
        match &self.test {
            Test::Present(_) => Held::Yes,
            Test::Glob(_, m) => match v.as_str() {
                Some(s) => yes_if(m.is_match(s)),
                None => Held::Unknown(format!("{p} is {}, not a string", kind(v))),
            },
            Test::Regex(r) => match v.as_str() {
                Some(s) => yes_if(r.is_match(s)),
                None => Held::Unknown(format!("{p} is {}, not a string", kind(v))),
            },
            Test::PathPrefix(prefix) => match v.as_str() {
                Some(s) => match normalized(s) {
                    // As written and as the host resolves it now (symlinks, `..` after one,
                    // `/proc/self/root`): both under the prefix or both not, else unknown.
                    Some(path) => match (
                        under(&path, prefix),
                        paths.real(s).map(|r| under(&r, prefix)),
                    ) {
                        (true, Some(true)) => Held::Yes,
                        (false, Some(false)) => Held::No,
                        (lexical, None) => yes_if(lexical),
                        _ => Held::Unknown(format!(
                            "{p} {s:?} reads as one place and resolves through a symlink to another, one of them under {prefix}"
                        )),
                    },
                    None => Held::Unknown(format!(
                        "{p} {s:?} is not an absolute path, so whether it lies under {prefix} depends on the server's directory"
                    )),
                },
                None => Held::Unknown(format!("{p} is {}, not a path", kind(v))),
            },
            Test::Range(range) => match v.as_f64() {
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
