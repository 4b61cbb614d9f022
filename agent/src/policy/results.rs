//! Result inspection (issue 16): what a server's message may carry toward the client.
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
use super::secrets::{self, Scanner};
use crate::config::ResultInspectionConfig;
use crate::decision::{ResultAction, ResultFinding, ResultVerdict};

/// The compiled `result_inspection:`.
#[derive(Debug)]
pub(crate) struct ResultRules {
    secrets: ResultAction,
    scanner: Option<&'static Scanner>,
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

impl std::fmt::Debug for Scanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scanner({} rules)", self.rules())
    }
}

/// What [`ResultRules::new`] refuses: the index of the offending entry, its key and why.
pub(crate) type ResultRulesError = (String, String);

impl ResultRules {
    /// Compiles the config (its regexes were checked by `config/validate.rs`).
    pub(crate) fn new(config: &ResultInspectionConfig) -> Result<Self, ResultRulesError> {
        let scanner = match config.secrets {
            ResultAction::Off => None,
            _ => Some(secrets::builtin().map_err(|e| ("secrets".to_owned(), e.to_string()))?),
        };
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
                            "{rule:?} is neither a gitleaks rule id (`toolwall config check` lists none by that name) nor the name of a pattern"
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
            scanner,
            patterns,
            exempt,
        })
    }

    /// Whether nothing is looked for.
    pub(crate) fn is_off(&self) -> bool {
        self.scanner.is_none() && self.patterns.is_empty()
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
        if self.patterns.is_empty()
            && memmem::find(message, b"\\u").is_none()
            && !self.scanner.is_some_and(|s| s.may_match(message))
        {
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
                    reason: format!(
                        "the message could not be read for inspection ({error}): treated as holding what the rules look for ({})",
                        action.as_str()
                    ),
                });
            }
        };
        let mut walk = Walk {
            rules: self,
            skip: &skip,
            pointer: String::new(),
            findings: Vec::new(),
            total: 0,
            action: ResultAction::Off,
            redacted: false,
        };
        walk.value(&mut value);
        if walk.total == 0 {
            return None;
        }
        let action = walk.action;
        let mut rules: Vec<&str> = walk.findings.iter().map(|f| f.rule.as_str()).collect();
        rules.sort_unstable();
        rules.dedup();
        let redacted = match (action, walk.redacted) {
            (ResultAction::Redact, true) => serde_json::to_vec(&value).ok(),
            _ => None,
        };
        Some(ResultVerdict {
            action,
            reason: format!(
                "{} finding{} ({}) in the server's message: {}",
                walk.total,
                if walk.total == 1 { "" } else { "s" },
                rules.join(", "),
                match action {
                    ResultAction::Withhold => "withheld",
                    ResultAction::Redact => "redacted",
                    _ => "alert",
                }
            ),
            findings: walk.findings,
            total: walk.total,
            redacted,
        })
    }

    /// The strongest action any rule has.
    fn strongest(&self) -> ResultAction {
        self.patterns
            .iter()
            .map(|p| p.action)
            .chain(self.scanner.map(|_| self.secrets))
            .max()
            .unwrap_or(ResultAction::Off)
    }
}

/// One pass over a parsed message: findings in every string, redactions made in place.
struct Walk<'a> {
    rules: &'a ResultRules,
    skip: &'a dyn Fn(&str) -> bool,
    pointer: String,
    findings: Vec<ResultFinding>,
    total: usize,
    action: ResultAction,
    redacted: bool,
}

impl Walk<'_> {
    fn value(&mut self, value: &mut Value) {
        match value {
            Value::String(s) => self.string(s),
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
                for (key, item) in map.iter_mut() {
                    let len = self.pointer.len();
                    self.pointer.push('/');
                    self.pointer
                        .push_str(&key.replace('~', "~0").replace('/', "~1"));
                    self.value(item);
                    self.pointer.truncate(len);
                }
            }
            _ => {}
        }
    }

    fn string(&mut self, s: &mut String) {
        // (start, end, rule, action, kind) of each finding in `s`.
        let mut found: Vec<(usize, usize, String, ResultAction, &str)> = Vec::new();
        if let Some(scanner) = self.rules.scanner {
            let mut secrets = Vec::new();
            scanner.scan(s, &mut secrets);
            found.extend(
                secrets
                    .into_iter()
                    .filter(|f| !(self.skip)(f.rule))
                    .map(|f| {
                        let rule = f.rule.to_owned();
                        (
                            f.range.start,
                            f.range.end,
                            rule,
                            self.rules.secrets,
                            "secret",
                        )
                    }),
            );
        }
        for pattern in &self.rules.patterns {
            if (self.skip)(&pattern.name) {
                continue;
            }
            found.extend(
                pattern
                    .regex
                    .find_iter(s)
                    .filter(|m| !m.is_empty())
                    .map(|m| {
                        let rule = pattern.name.clone();
                        (m.start(), m.end(), rule, pattern.action, "pattern")
                    }),
            );
        }
        if found.is_empty() {
            return;
        }
        for (start, end, rule, action, kind) in &found {
            self.total += 1;
            self.action = self.action.max(*action);
            if self.findings.len() < ResultVerdict::MAX_FINDINGS {
                self.findings.push(ResultFinding {
                    rule: rule.clone(),
                    kind: (*kind).to_owned(),
                    pointer: self.pointer.clone(),
                    start: *start,
                    end: *end,
                    action: *action,
                });
            }
        }
        // Redact what asks for it (withhold makes the text moot): overlapping findings are
        // one span, named after the first.
        found.retain(|f| f.3 >= ResultAction::Redact);
        if found.is_empty() {
            return;
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
        *s = out;
        self.redacted = true;
    }
}

#[cfg(test)]
mod tests;
