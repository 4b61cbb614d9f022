//! Result inspection: what a server's message may carry toward the client.
//!
//! Every string of the message, decoded (the model reads `\u0041KIA…` as `AKIA…`), meets the
//! built-in secret rules (`policy/secrets/`) and the owner's patterns; a finding is kept with
//! its rule and place, never its value. The strongest action of the findings decides: alert
//! passes the message, redact forwards it with each finding replaced by
//! `[toolwall:redacted:RULE]` (toolwall's serialisation of what it parsed, keys in sorted
//! order), withhold gives the client an error instead.
//!
//! Most messages hold nothing: unless a configured pattern must see every string, a message
//! whose raw text holds no keyword of any secret rule and no `\u` escape is not parsed at all
//! ([`super::secrets::Scanner::may_match`]).

use memchr::memmem;
use regex::Regex;
use serde_json::Value;

use super::glob::Glob;
use super::secrets::{self, Scanner, Woken};
use crate::config::ResultInspectionConfig;
use crate::decision::{ResultAction, ResultFinding, ResultVerdict};

/// `\u`, looked for in every server message: built once (`memmem::find` builds its searcher
/// on every call).
static ESCAPE: std::sync::LazyLock<memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memmem::Finder::new(b"\\u"));

/// The compiled `result_inspection:`.
#[derive(Debug)]
pub(crate) struct ResultRules {
    secrets: ResultAction,
    /// Whether the built-in secret rules run; they are compiled on first use
    /// ([`secrets::builtin`], once per process), not with every policy.
    scanning: bool,
    patterns: Vec<Pattern>,
    exempt: Vec<Exemption>,
}

#[derive(Debug)]
struct Pattern {
    name: String,
    regex: Regex,
    action: ResultAction,
}

#[derive(Debug)]
struct Exemption {
    server: Glob,
    tool: Glob,
    /// Empty: every rule.
    rules: Vec<String>,
}

/// What [`ResultRules::new`] refuses: the index of the offending entry, its key and why.
pub(crate) type ResultRulesError = (String, String);

impl ResultRules {
    /// Compiles the config (its regexes were checked by `config/validate.rs`).
    pub(crate) fn new(config: &ResultInspectionConfig) -> Result<Self, ResultRulesError> {
        let patterns = config
            .patterns
            .iter()
            .enumerate()
            .filter(|(_, p)| p.action != ResultAction::Off)
            .map(|(i, p)| {
                crate::config::compile_deny_regex(&p.regex)
                    .map(|regex| Pattern {
                        name: p.name.clone(),
                        regex,
                        action: p.action,
                    })
                    .map_err(|why| (format!("patterns[{i}].regex"), why))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut exempt = Vec::new();
        for (i, e) in config.exempt.iter().enumerate() {
            for rule in &e.rules {
                let known = config.patterns.iter().any(|p| p.name == *rule)
                    || secrets::builtin().is_ok_and(|s| s.has_rule(rule));
                if !known {
                    return Err((
                        format!("exempt[{i}].rules"),
                        format!(
                            "{rule:?} is neither the id of a built-in secret rule (the `id`s of gitleaks.toml, e.g. aws-access-token, github-pat, private-key) nor the name of a pattern"
                        ),
                    ));
                }
            }
            exempt.push(Exemption {
                server: Glob::new(&e.server),
                tool: Glob::new(&e.tool),
                rules: e.rules.clone(),
            });
        }
        Ok(ResultRules {
            secrets: config.secrets,
            scanning: config.secrets != ResultAction::Off,
            patterns,
            exempt,
        })
    }

    /// Whether nothing is looked for.
    pub(crate) fn is_off(&self) -> bool {
        !self.scanning && self.patterns.is_empty()
    }

    /// What the rules find in `message` (one JSON-RPC message from `server`, answering a call
    /// of `tool` when known); `None` when nothing.
    pub(crate) fn inspect(
        &self,
        server: &str,
        tool: Option<&str>,
        message: &[u8],
    ) -> Option<ResultVerdict> {
        if self.is_off() {
            return None;
        }
        let exempt: Vec<&Exemption> = match tool {
            Some(tool) => self
                .exempt
                .iter()
                .filter(|e| e.server.matches(server) && e.tool.matches(tool))
                .collect(),
            None => Vec::new(),
        };
        if exempt.iter().any(|e| e.rules.is_empty()) {
            return None;
        }
        let skip = |rule: &str| exempt.iter().any(|e| e.rules.iter().any(|r| r == rule));
        let scanner = match self.scanning.then(secrets::builtin) {
            None => None,
            Some(Ok(scanner)) => Some(scanner),
            // A defect of the build (the set is tested whole): nothing passes unjudged.
            Some(Err(error)) => {
                return Some(ResultVerdict {
                    action: ResultAction::Withhold,
                    findings: Vec::new(),
                    total: 0,
                    redacted: None,
                    reason: format!("{error}: withheld, nothing can be inspected"),
                    id_holds_finding: true,
                });
            }
        };
        // With no `\u` escape the message's keywords are its strings' (`Scanner::woken`).
        let escaped = ESCAPE.find(message).is_some();
        let woken = scanner.map(|s| s.woken(message));
        if self.patterns.is_empty() && !escaped && woken.is_none_or(|w| w.is_empty()) {
            return None;
        }
        let mut value: Value = match serde_json::from_slice(message) {
            Ok(v) => v,
            Err(error) => {
                // The filter read it already; only nesting past serde_json's limit gets here.
                // What cannot be read cannot be redacted: withheld if any rule would redact.
                let action = match self.strongest() {
                    ResultAction::Alert => ResultAction::Alert,
                    _ => ResultAction::Withhold,
                };
                return Some(ResultVerdict {
                    action,
                    findings: Vec::new(),
                    total: 0,
                    redacted: None,
                    id_holds_finding: true,
                    reason: format!(
                        "the message could not be read for inspection ({error}): treated as holding what the rules look for ({})",
                        action.as_str()
                    ),
                });
            }
        };
        let mut walk = Walk {
            rules: self,
            scanner,
            woken: woken.filter(|_| !escaped),
            skip: &skip,
            pointer: String::new(),
            findings: Vec::new(),
            total: 0,
            action: ResultAction::Off,
            redacted: false,
            stopped: false,
            id: false,
        };
        walk.value(&mut value);
        if walk.total == 0 {
            return None;
        }
        let mut rules: Vec<&str> = walk.findings.iter().map(|f| f.rule.as_str()).collect();
        rules.sort_unstable();
        rules.dedup();
        let plural = if walk.total == 1 { "" } else { "s" };
        let mut reason = format!(
            "{} finding{plural} ({}) in the server's message",
            walk.total,
            rules.join(", ")
        );
        // Past the bound nothing more was looked at, so nothing can be promised redacted.
        let action = match walk.stopped {
            true if self.strongest() > ResultAction::Alert => ResultAction::Withhold,
            true => ResultAction::Alert,
            false => walk.action,
        };
        if walk.stopped {
            reason.push_str(&format!(
                ", where toolwall stopped looking (at most {MAX_MESSAGE_FINDINGS} per message)"
            ));
        }
        reason.push_str(match action {
            ResultAction::Withhold => ": withheld",
            ResultAction::Redact => ": redacted",
            _ => ": alert",
        });
        let redacted = match (action, walk.redacted) {
            (ResultAction::Redact, true) => serde_json::to_vec(&value).ok(),
            _ => None,
        };
        Some(ResultVerdict {
            action,
            reason,
            findings: walk.findings,
            total: walk.total,
            redacted,
            id_holds_finding: walk.id,
        })
    }

    /// The strongest action any rule has.
    fn strongest(&self) -> ResultAction {
        self.patterns
            .iter()
            .map(|p| p.action)
            .chain(self.scanning.then_some(self.secrets))
            .max()
            .unwrap_or(ResultAction::Off)
    }
}

/// Findings one message may hold: each costs allowlist checks and a redaction, so a message
/// of a million keys is withheld whole rather than looked at a million times.
const MAX_MESSAGE_FINDINGS: usize = 1024;

/// What a pointer says for an object key that holds a finding: the record never names it.
const HIDDEN_KEY: &str = "[toolwall:redacted]";

/// One finding in one string: (start, end, rule, action, kind).
type Found = (usize, usize, String, ResultAction, &'static str);

/// One pass over a parsed message: findings in every string (object keys included, and
/// numbers for the owner's patterns), redactions made in place.
struct Walk<'a> {
    rules: &'a ResultRules,
    scanner: Option<&'static Scanner>,
    /// The rules the whole message's keywords wake, or `None`: each string's own.
    woken: Option<Woken>,
    skip: &'a dyn Fn(&str) -> bool,
    pointer: String,
    findings: Vec<ResultFinding>,
    total: usize,
    action: ResultAction,
    redacted: bool,
    /// [`MAX_MESSAGE_FINDINGS`] reached: the rest was not looked at.
    stopped: bool,
    /// A finding in the top-level `id`.
    id: bool,
}

impl Walk<'_> {
    fn value(&mut self, value: &mut Value) {
        if self.stopped {
            return;
        }
        match value {
            Value::String(s) => {
                let found = self.find(s, true);
                self.note(&found, false);
                if let Some(text) = self.redact(s, found) {
                    *s = text;
                }
            }
            Value::Number(n) if !self.rules.patterns.is_empty() => {
                let text = n.to_string();
                let found = self.find(&text, false);
                self.note(&found, false);
                if let Some(text) = self.redact(&text, found) {
                    *value = Value::String(text);
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    let len = self.pointer.len();
                    self.pointer.push('/');
                    self.pointer.push_str(&i.to_string());
                    self.value(item);
                    self.pointer.truncate(len);
                }
            }
            Value::Object(map) => {
                let mut renames = Vec::new();
                for (key, item) in map.iter_mut() {
                    let len = self.pointer.len();
                    self.pointer.push('/');
                    let found = self.find(key, true);
                    if found.is_empty() {
                        self.pointer
                            .push_str(&key.replace('~', "~0").replace('/', "~1"));
                    } else {
                        self.pointer.push_str(HIDDEN_KEY);
                        self.note(&found, true);
                        if let Some(name) = self.redact(key, found) {
                            renames.push((key.clone(), name));
                        }
                    }
                    self.value(item);
                    self.pointer.truncate(len);
                }
                for (old, mut new) in renames {
                    if let Some(item) = map.remove(&old) {
                        // Two keys redacted alike stay two keys.
                        while map.contains_key(&new) {
                            new.push('#');
                        }
                        map.insert(new, item);
                    }
                }
            }
            _ => {}
        }
    }

    /// The findings in `s`: the secret rules (on text, not on a number's digits) and the
    /// patterns, less the exempted, within the message's bound.
    fn find(&mut self, s: &str, secrets: bool) -> Vec<Found> {
        let mut found: Vec<Found> = Vec::new();
        let room = MAX_MESSAGE_FINDINGS.saturating_sub(self.total);
        if let Some(scanner) = self.scanner.filter(|_| secrets) {
            let mut secrets = Vec::new();
            let woken = self.woken.unwrap_or_else(|| scanner.woken(s.as_bytes()));
            if !scanner.scan(s, &woken, &mut secrets, room + 1) {
                self.stopped = true;
            }
            let action = self.rules.secrets;
            found.extend(
                secrets
                    .into_iter()
                    .filter(|f| !(self.skip)(f.rule))
                    .map(|f| {
                        (
                            f.range.start,
                            f.range.end,
                            f.rule.to_owned(),
                            action,
                            "secret",
                        )
                    }),
            );
        }
        for pattern in &self.rules.patterns {
            if (self.skip)(&pattern.name) {
                continue;
            }
            for m in pattern.regex.find_iter(s).filter(|m| !m.is_empty()) {
                if found.len() > room {
                    self.stopped = true;
                    break;
                }
                found.push((
                    m.start(),
                    m.end(),
                    pattern.name.clone(),
                    pattern.action,
                    "pattern",
                ));
            }
        }
        found
    }

    /// Records `found` at the current pointer (`in_key`: in the last segment's key).
    fn note(&mut self, found: &[Found], in_key: bool) {
        for (start, end, rule, action, kind) in found {
            self.total += 1;
            self.action = self.action.max(*action);
            self.id |= self.pointer == "/id";
            if self.findings.len() < ResultVerdict::MAX_FINDINGS {
                self.findings.push(ResultFinding {
                    rule: rule.clone(),
                    kind: (*kind).to_owned(),
                    pointer: self.pointer.clone(),
                    start: *start,
                    end: *end,
                    in_key,
                    action: *action,
                });
            }
        }
    }

    /// `s` with each finding that asks for it (redact, withhold: the text is moot then)
    /// replaced by `[toolwall:redacted:RULE]`; overlapping findings are one span, named
    /// after the first. `None` when nothing was replaced.
    fn redact(&mut self, s: &str, mut found: Vec<Found>) -> Option<String> {
        found.retain(|f| f.3 >= ResultAction::Redact);
        if found.is_empty() {
            return None;
        }
        found.sort_by_key(|f| (f.0, std::cmp::Reverse(f.1)));
        let mut out = String::with_capacity(s.len());
        let mut at = 0;
        for (start, end, rule, ..) in &found {
            if *start < at {
                // Overlaps the span just redacted: that span grows.
                at = at.max(*end);
                continue;
            }
            out.push_str(&s[at..*start]);
            out.push_str("[toolwall:redacted:");
            out.push_str(rule);
            out.push(']');
            at = *end;
        }
        out.push_str(&s[at..]);
        self.redacted = true;
        Some(out)
    }
}

#[cfg(test)]
mod tests;
