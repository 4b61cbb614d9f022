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

/// Why `condition` can never hold for a tool whose `inputSchema` is `schema`, if it surely
/// cannot: its pointer names a property the schema closes out (`additionalProperties: false`)
/// or reaches a value of a declared type its test cannot read (a `range` on a string, a
/// `path_prefix` on a number — a block rule would then refuse every call). `None` when it may
/// hold, or the schema does not say (`toolwall config check`, issue 16).
pub(crate) fn schema_mismatch(condition: &ArgumentCondition, schema: &Value) -> Option<String> {
    let mut at = schema;
    let mut walked = String::new();
    if let Some(rest) = condition.pointer.strip_prefix('/') {
        for raw in rest.split('/') {
            let key = raw.replace("~1", "/").replace("~0", "~");
            let next = if let Some(items) = at.get("items") {
                (raw == "*" || key.parse::<usize>().is_ok()).then_some(items)
            } else if let Some(props) = at.get("properties").and_then(Value::as_object) {
                match props.get(&key) {
                    Some(p) => Some(p),
                    None if raw != "*"
                        && at.get("additionalProperties") == Some(&Value::Bool(false)) =>
                    {
                        let known: Vec<&str> = props.keys().map(String::as_str).collect();
                        return Some(format!(
                            "{walked}/{key} is no property of its inputSchema (additionalProperties: false; it has {})",
                            known.join(", ")
                        ));
                    }
                    None => None,
                }
            } else {
                None
            };
            match next {
                Some(n) => {
                    at = n;
                    walked.push('/');
                    walked.push_str(raw);
                }
                None => return None,
            }
        }
    }
    let declared: Vec<&str> = match at.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return None,
    };
    let (wants, test) = if condition.range.is_some() {
        (&["number", "integer"][..], "range")
    } else if condition.present.is_some() {
        return None;
    } else {
        (&["string"][..], "a string test")
    };
    (!declared.iter().any(|t| wants.contains(t))).then(|| {
        format!(
            "{} is declared {} in its inputSchema; {test} never holds on it",
            condition.pointer,
            declared.join(" or ")
        )
    })
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
struct Resolved<'r> {
    /// Text → (normalized as written, as the host resolves it).
    seen: HashMap<String, (Option<String>, Option<String>)>,
    dirs: &'r DirCache,
}

impl Resolved<'_> {
    /// `path` normalized as written (`None` unless absolute) and as the host resolves it now
    /// ([`Resolved::real`]), each computed once per judgement.
    fn both(&mut self, path: &str) -> &(Option<String>, Option<String>) {
        if !self.seen.contains_key(path) {
            let lexical = normalized(path);
            let real = lexical.as_ref().and_then(|_| self.real(path));
            self.seen.insert(path.to_owned(), (lexical, real));
        }
        &self.seen[path]
    }

    /// `path` with symlinks resolved as the host resolves them now: the longest part of it
    /// that exists, made real, and the rest as written (normalized). `None` when nothing of it
    /// resolves. Its directory comes from [`DirCache`]; the last component is looked at each
    /// time (a symlink there is resolved whole).
    fn real(&self, path: &str) -> Option<String> {
        match path.rsplit_once('/') {
            Some((dir, name))
                if !matches!(name, "" | "." | "..")
                    && !std::fs::symlink_metadata(path)
                        .is_ok_and(|m| m.file_type().is_symlink()) =>
            {
                let dir = if dir.is_empty() { "/" } else { dir };
                self.dirs
                    .real(dir)
                    .and_then(|d| normalized(&format!("{d}/{name}")))
            }
            _ => resolve(path),
        }
    }
}

/// Directories resolved in the last [`DIR_TTL`], shared by every call: calls name files in few
/// directories, and resolving one costs a system call per component (a decision with 1,000
/// rules took 26 µs, nearly all of it resolving one path).
#[derive(Debug, Default)]
struct DirCache(std::sync::Mutex<HashMap<String, (std::time::Instant, Option<String>)>>);

/// How long a resolved directory is trusted: a symlink swapped within it is seen that late
/// (the server opens the path later than the decision anyway).
const DIR_TTL: std::time::Duration = std::time::Duration::from_secs(1);
/// Most directories kept.
const MAX_DIRS: usize = 4096;

impl DirCache {
    fn real(&self, dir: &str) -> Option<String> {
        let now = std::time::Instant::now();
        if let Some((at, real)) = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(dir)
            && now.duration_since(*at) < DIR_TTL
        {
            return real.clone();
        }
        let real = resolve(dir);
        if dir.len() <= MAX_CACHED_NAME {
            let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            if cache.len() >= MAX_DIRS {
                cache.retain(|_, (at, _)| now.duration_since(*at) < DIR_TTL);
                if cache.len() >= MAX_DIRS {
                    cache.clear();
                }
            }
            cache.insert(dir.to_owned(), (now, real.clone()));
        }
        real
    }
}

/// `path` resolved by the host: the longest part of it that exists made real (symlinks, `..`
/// after them), the rest appended as written, normalized.
fn resolve(path: &str) -> Option<String> {
    let mut head = std::path::PathBuf::from(path);
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        if let Ok(mut real) = std::fs::canonicalize(&head) {
            for part in rest.iter().rev() {
                real.push(part);
            }
            return real.to_str().and_then(normalized);
        }
        match (head.file_name().map(|f| f.to_owned()), head.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                head = parent.to_path_buf();
            }
            _ => return None,
        }
    }
}

/// Calls `f` with every value `segments` reach below `v` (`path`: the concrete pointer so far,
/// kept only when `want_paths`), or with why a branch cannot be followed: a scalar where the
/// pointer goes on (a server may decode a string holding JSON, as the Python SDK does for
/// non-`str` parameters; helper-28). A `None` segment (`*`) stands for every element or member.
fn reach<'v>(
    v: &'v Value,
    segments: &[Option<String>],
    path: &mut String,
    want_paths: bool,
    f: &mut dyn FnMut(&str, Result<&'v Value, String>),
) {
    let Some((segment, rest)) = segments.split_first() else {
        f(path, Ok(v));
        return;
    };
    let mut down = |key: &str, c: &'v Value, path: &mut String| {
        let len = path.len();
        if want_paths {
            path.push('/');
            path.push_str(&key.replace('~', "~0").replace('/', "~1"));
        }
        reach(c, rest, path, want_paths, f);
        path.truncate(len);
    };
    match (v, segment) {
        (Value::Object(map), None) => {
            for (k, c) in map {
                down(k, c, path);
            }
        }
        (Value::Array(items), None) => {
            for (i, c) in items.iter().enumerate() {
                down(&i.to_string(), c, path);
            }
        }
        (Value::Object(map), Some(key)) => {
            if let Some(c) = map.get(key) {
                down(key, c, path);
            }
        }
        (Value::Array(items), Some(key)) => {
            if let Some(c) = key.parse::<usize>().ok().and_then(|i| items.get(i)) {
                down(key, c, path);
            }
        }
        (Value::Null, _) => {}
        (scalar, _) => f(
            path,
            Err(format!(
                "{} is {} where the pointer goes on (a server may read it as JSON)",
                if path.is_empty() {
                    "a value"
                } else {
                    path.as_str()
                },
                kind(scalar)
            )),
        ),
    }
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
        want_paths: bool,
    ) -> Held {
        let (mut found, mut yes, mut no, mut unknown) = (false, false, false, None::<String>);
        let mut path = String::new();
        let test = &self.test;
        reach(
            arguments,
            &self.segments,
            &mut path,
            want_paths,
            &mut |at, value| {
                let held = match value {
                    Err(why) => Held::Unknown(why),
                    Ok(v) => {
                        found = true;
                        if want_paths {
                            reached.push(at.to_owned());
                        }
                        match test {
                            Test::Present(_) => Held::Yes,
                            _ => self.test_value(&self.pointer, v, paths),
                        }
                    }
                };
                match held {
                    Held::Yes => yes = true,
                    Held::No => no = true,
                    Held::Unknown(why) => {
                        unknown.get_or_insert(why);
                    }
                }
            },
        );
        if let Test::Present(want) = self.test {
            return match unknown {
                Some(why) => Held::Unknown(why),
                None => yes_if(found == want),
            };
        }
        if !found && unknown.is_none() {
            return Held::No;
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
                Some(s) => match paths.both(s) {
                    // As written and as the host resolves it now (symlinks, `..` after one,
                    // `/proc/self/root`): both under the prefix or both not, else unknown.
                    (Some(path), real) => match (
                        under(path, prefix),
                        real.as_deref().map(|r| under(r, prefix)),
                    ) {
                        (true, Some(true)) => Held::Yes,
                        (false, Some(false)) => Held::No,
                        (lexical, None) => yes_if(lexical),
                        _ => Held::Unknown(format!(
                            "{p} {s:?} reads as one place and resolves through a symlink to another, one of them under {prefix}"
                        )),
                    },
                    (None, _) => Held::Unknown(format!(
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
