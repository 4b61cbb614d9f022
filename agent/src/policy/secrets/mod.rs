//! Secrets in text, found with gitleaks' maintained rule set (for result inspection).
//!
//! `gitleaks.toml` is gitleaks' default configuration as published (v8.30.0-27-gb58d3f10,
//! MIT, `LICENSE-gitleaks`), read as gitleaks reads it: a rule runs only on text holding one
//! of its keywords (one Aho-Corasick pass, ASCII case-insensitive); its secret is the
//! `secretGroup` capture, else the first non-empty capture, else the match; a rule's
//! `entropy` is a floor the secret's Shannon entropy must pass; the global and the rule's
//! allowlists (regexes on the secret, the match or the line; stopwords in the secret) drop
//! known non-secrets. Rules that need a file path (`path = `) never apply: a tool result
//! has none. Not done: gitleaks' decoding passes (base64, hex, percent) and its multi-part
//! `requiredRules`.
//!
//! The rules are Go RE2 syntax. The two engines agree except that RE2's `\w`, `\d`, `\s` and
//! `\b` are ASCII; [`ascii_classes`] writes them as ASCII classes before compiling (Unicode
//! ones would match more than gitleaks does and make the `{0,50}` repetitions huge).

use std::ops::Range;
use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};
use regex::{Regex, RegexBuilder};
use serde::Deserialize;

/// The rule set, embedded: a daemon never depends on a file it could fail to read.
const GITLEAKS_TOML: &str = include_str!("gitleaks.toml");

/// Each compiled rule's bound (the regex crate's default is 10 MiB; gitleaks' largest rules
/// stay well under it once their classes are ASCII).
const REGEX_SIZE_LIMIT: usize = 8 * 1024 * 1024;

/// How far around a match its "line" reaches for the allowlists that read the line (bytes
/// each side; gitleaks reads lines of source files, which are short).
const LINE_REACH: usize = 1024;

/// The nearest char boundary at or before `at`.
fn floor_char(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The nearest char boundary at or after `at` (`at` ≤ `text.len()`).
fn ceil_char(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// Most rules the scanner holds (the keyword pass marks woken rules in a fixed bitset);
/// a larger set is refused when compiled.
const MAX_RULES: usize = 512;

/// A secret found: which rule and where, in bytes of the scanned text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Finding<'s> {
    /// The gitleaks rule id (`aws-access-token`, `private-key`, `generic-api-key`, ...).
    pub rule: &'s str,
    /// The secret's byte range (on `char` boundaries).
    pub range: Range<usize>,
}

/// Which rules a text's keywords wake ([`Scanner::woken`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Woken([u64; MAX_RULES / 64]);

impl Woken {
    /// Whether no rule is woken.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }
}

/// The compiled rule set.
pub(crate) struct Scanner {
    rules: Vec<Rule>,
    /// One pattern per distinct keyword; `keyword_rules[pattern]` lists the rules it wakes.
    keywords: AhoCorasick,
    keyword_rules: Vec<Vec<usize>>,
    global: Vec<Allowlist>,
}

struct Rule {
    id: String,
    /// Its pattern, compiled when a keyword first wakes the rule: compiled all at once the
    /// rules held 16 MB, most of a filter proxy's memory, for rules most messages never wake.
    source: String,
    /// `None`: it did not compile (a defect of this build; every scan it would run in stops).
    regex: OnceLock<Option<Regex>>,
    secret_group: usize,
    entropy: f64,
    allowlists: Vec<Allowlist>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Secret,
    Match,
    Line,
}

struct Allowlist {
    target: Target,
    /// `condition = "AND"`: every check present must hold; a path check (there is no path
    /// here) never does.
    all: bool,
    has_paths: bool,
    regex: Option<Regex>,
    stopwords: Option<AhoCorasick>,
}

#[derive(Deserialize)]
struct RuleSet {
    #[serde(default)]
    allowlist: Option<AllowlistToml>,
    rules: Vec<RuleToml>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RuleToml {
    id: String,
    #[serde(default)]
    regex: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    secret_group: usize,
    #[serde(default)]
    entropy: f64,
    #[serde(default)]
    keywords: Vec<String>,
    #[serde(default)]
    allowlists: Vec<AllowlistToml>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AllowlistToml {
    #[serde(default)]
    condition: Option<String>,
    #[serde(default)]
    regex_target: Option<String>,
    #[serde(default)]
    regexes: Vec<String>,
    #[serde(default)]
    stopwords: Vec<String>,
    #[serde(default)]
    paths: Vec<String>,
}

/// Why the embedded rule set did not compile (a defect of this build, reported at start-up).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RuleSetError {
    #[error("the embedded gitleaks rule set is not valid TOML: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("gitleaks rule {rule}: {source}")]
    Regex {
        rule: String,
        #[source]
        source: regex::Error,
    },
    #[error("{0} gitleaks rules apply to text, more than the {MAX_RULES} the scanner holds")]
    TooMany(usize),
    #[error("the gitleaks keywords: {0}")]
    Keywords(#[from] aho_corasick::BuildError),
}

/// The embedded rule set, compiled once per process (≈ 0.1 s) and shared by every policy.
pub(crate) fn builtin() -> Result<&'static Scanner, &'static RuleSetError> {
    static SCANNER: OnceLock<Result<Scanner, RuleSetError>> = OnceLock::new();
    SCANNER
        .get_or_init(|| Scanner::from_toml(GITLEAKS_TOML))
        .as_ref()
}

/// `source` with RE2's literal braces escaped and its ASCII-only Perl classes and word boundaries written out as ASCII.
fn ascii_classes(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + 32);
    let mut chars = source.chars().peekable();
    // Depth of `[...]`: inside a class a Perl class becomes its members, outside a class.
    let mut in_class = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(next) = chars.next() else {
                    out.push('\\');
                    break;
                };
                let (inside, outside) = match next {
                    'w' => ("0-9A-Za-z_", "[0-9A-Za-z_]"),
                    'W' => ("[:^word:]", "[^0-9A-Za-z_]"),
                    'd' => ("0-9", "[0-9]"),
                    'D' => ("[:^digit:]", "[^0-9]"),
                    's' => ("\\t\\n\\x0C\\r ", "[\\t\\n\\x0C\\r ]"),
                    'S' => ("[^\\t\\n\\x0C\\r ]", "[^\\t\\n\\x0C\\r ]"),
                    'b' if !in_class => ("", "(?-u:\\b)"),
                    'B' if !in_class => ("", "(?-u:\\B)"),
                    other => {
                        out.push('\\');
                        out.push(other);
                        continue;
                    }
                };
                out.push_str(if in_class { inside } else { outside });
            }
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                // A `]` or `^]` right after the opening bracket is a member, not the end.
                if chars.peek() == Some(&'^') {
                    out.push('^');
                    chars.next();
                }
                if chars.peek() == Some(&']') {
                    out.push(']');
                    chars.next();
                }
            }
            '[' if chars.peek() == Some(&':') => {
                // A POSIX class inside a class: copy through its closing `:]`.
                out.push('[');
                for c in chars.by_ref() {
                    out.push(c);
                    if c == ']' {
                        break;
                    }
                }
            }
            // RE2 reads a `{` that opens no repetition as itself; the regex crate refuses it.
            '{' if !in_class && !opens_repetition(chars.clone()) => out.push_str("\\{"),
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            c => out.push(c),
        }
    }
    out
}

/// Whether what follows a `{` makes it a repetition (`{n}`, `{n,}`, `{n,m}`).
fn opens_repetition(mut rest: impl Iterator<Item = char>) -> bool {
    let mut digits = 0;
    let mut comma = false;
    for c in rest.by_ref() {
        match c {
            '0'..='9' => digits += 1,
            ',' if !comma && digits > 0 => comma = true,
            '}' => return digits > 0,
            _ => return false,
        }
    }
    false
}

fn compile(rule: &str, source: &str) -> Result<Regex, RuleSetError> {
    RegexBuilder::new(&ascii_classes(source))
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|source| RuleSetError::Regex {
            rule: rule.to_owned(),
            source,
        })
}

impl Allowlist {
    fn compile(rule: &str, toml: AllowlistToml) -> Result<Self, RuleSetError> {
        let regex = match toml.regexes.is_empty() {
            true => None,
            false => Some(compile(
                rule,
                &toml
                    .regexes
                    .iter()
                    .map(|r| format!("(?:{r})"))
                    .collect::<Vec<_>>()
                    .join("|"),
            )?),
        };
        let stopwords = match toml.stopwords.is_empty() {
            true => None,
            false => Some(
                AhoCorasickBuilder::new()
                    .ascii_case_insensitive(true)
                    .build(&toml.stopwords)?,
            ),
        };
        Ok(Allowlist {
            target: match toml.regex_target.as_deref() {
                Some("match") => Target::Match,
                Some("line") => Target::Line,
                _ => Target::Secret,
            },
            all: toml
                .condition
                .is_some_and(|c| c.eq_ignore_ascii_case("and")),
            has_paths: !toml.paths.is_empty(),
            regex,
            stopwords,
        })
    }

    /// Whether this list says the finding is no secret.
    fn allows(&self, secret: &str, matched: &str, line: &str) -> bool {
        let target = match self.target {
            Target::Secret => secret,
            Target::Match => matched,
            Target::Line => line,
        };
        let by_regex = self
            .regex
            .as_ref()
            .map(|r| !target.is_empty() && r.is_match(target));
        let by_stopword = self
            .stopwords
            .as_ref()
            .map(|s| !secret.is_empty() && s.is_match(secret));
        if self.all {
            !self.has_paths
                && (by_regex.is_some() || by_stopword.is_some())
                && by_regex.unwrap_or(true)
                && by_stopword.unwrap_or(true)
        } else {
            by_regex.unwrap_or(false) || by_stopword.unwrap_or(false)
        }
    }
}

/// Shannon entropy in bits per character, as gitleaks computes it (`detect/utils.go`:
/// counts per character over the length in bytes).
fn shannon_entropy(s: &str) -> f64 {
    if s.is_empty() {
        return 0.0;
    }
    let mut counts = std::collections::HashMap::<char, usize>::new();
    for c in s.chars() {
        *counts.entry(c).or_default() += 1;
    }
    let len = s.len() as f64;
    counts
        .values()
        .map(|&n| {
            let p = n as f64 / len;
            -p * p.log2()
        })
        .sum()
}

impl std::fmt::Debug for Scanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scanner({} rules)", self.rules())
    }
}

impl Scanner {
    fn from_toml(text: &str) -> Result<Self, RuleSetError> {
        let set: RuleSet = toml::from_str(text)?;
        let global = match set.allowlist {
            Some(list) => vec![Allowlist::compile("(global allowlist)", list)?],
            None => Vec::new(),
        };
        let mut rules = Vec::new();
        let mut words: Vec<String> = Vec::new();
        let mut keyword_rules: Vec<Vec<usize>> = Vec::new();
        for rule in set.rules {
            // A rule that needs a path, or has no regex, cannot apply to a tool's result.
            let (Some(regex), None) = (&rule.regex, &rule.path) else {
                continue;
            };
            let index = rules.len();
            for keyword in &rule.keywords {
                let keyword = keyword.to_ascii_lowercase();
                match words.iter().position(|w| *w == keyword) {
                    Some(at) => keyword_rules[at].push(index),
                    None => {
                        words.push(keyword);
                        keyword_rules.push(vec![index]);
                    }
                }
            }
            if rule.keywords.is_empty() {
                // Every rule of the set has keywords; one without would run on all text, so
                // it is kept out rather than made the cost of every scan.
                tracing::warn!(rule = %rule.id, "gitleaks rule without keywords skipped");
                continue;
            }
            rules.push(Rule {
                source: regex.clone(),
                regex: OnceLock::new(),
                secret_group: rule.secret_group,
                entropy: rule.entropy,
                allowlists: rule
                    .allowlists
                    .into_iter()
                    .map(|a| Allowlist::compile(&rule.id, a))
                    .collect::<Result<_, _>>()?,
                id: rule.id,
            });
        }
        if rules.len() > MAX_RULES {
            return Err(RuleSetError::TooMany(rules.len()));
        }
        // A DFA (a few hundred KiB for ~250 short keywords): one table step per byte, where
        // the default (a contiguous NFA) made the keyword pass a third of the scan.
        let keywords = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::Standard)
            .kind(Some(AhoCorasickKind::DFA))
            .build(&words)?;
        Ok(Scanner {
            rules,
            keywords,
            keyword_rules,
            global,
        })
    }

    /// Compiles every rule now (the tests: the embedded set must compile whole).
    #[cfg(test)]
    pub(crate) fn compile_all(&self) -> Result<(), RuleSetError> {
        for rule in &self.rules {
            compile(&rule.id, &rule.source)?;
        }
        Ok(())
    }

    /// Whether a rule of this id applies to text.
    pub(crate) fn has_rule(&self, id: &str) -> bool {
        self.rules.iter().any(|r| r.id == id)
    }

    /// How many rules apply to text.
    pub(crate) fn rules(&self) -> usize {
        self.rules.len()
    }

    /// The rules whose keywords `bytes` hold: no other rule can match in them.
    ///
    /// Of the raw JSON of a message these are the rules for all its decoded strings as long as
    /// the message has no `\u` escape: no keyword holds a character JSON must escape, so each
    /// keyword of a decoded string is in the raw text too. One pass over the message then
    /// serves all its strings (a pass per string was a third of the scan).
    pub(crate) fn woken(&self, bytes: &[u8]) -> Woken {
        let mut woken = Woken::default();
        for m in self.keywords.find_overlapping_iter(bytes) {
            for &rule in &self.keyword_rules[m.pattern().as_usize()] {
                woken.0[rule / 64] |= 1 << (rule % 64);
            }
        }
        woken
    }

    /// Appends the secrets in `text` to `out`, in rule order then position, and says whether
    /// it looked at all of it: it stops once `out` holds `limit` findings (each costs an
    /// allowlist check; a string of a million keys must not cost a million). Only the rules
    /// in `woken` run: [`Scanner::woken`] of `text` or of text that holds it.
    pub(crate) fn scan<'s>(
        &'s self,
        text: &str,
        woken: &Woken,
        out: &mut Vec<Finding<'s>>,
        limit: usize,
    ) -> bool {
        for (index, rule) in self.rules.iter().enumerate() {
            if woken.0[index / 64] & (1 << (index % 64)) != 0
                && !self.scan_rule(rule, text, out, limit)
            {
                return false;
            }
        }
        true
    }

    fn scan_rule<'s>(
        &'s self,
        rule: &'s Rule,
        text: &str,
        out: &mut Vec<Finding<'s>>,
        limit: usize,
    ) -> bool {
        let compiled = rule.regex.get_or_init(|| {
            compile(&rule.id, &rule.source)
                .map_err(|error| tracing::error!("{error}; a message it wakes is not passed on"))
                .ok()
        });
        // Not looked at: the caller treats it as a scan that stopped (withheld, or alerted).
        let Some(regex) = compiled else {
            return false;
        };
        for caps in regex.captures_iter(text) {
            if out.len() >= limit {
                return false;
            }
            let Some(whole) = caps.get(0) else { continue };
            // gitleaks trims newlines off the match (`strings.Trim(match, "\n")`).
            let matched = whole.as_str().trim_matches('\n');
            let match_start = whole.start()
                + (whole.as_str().len() - whole.as_str().trim_start_matches('\n').len());
            let secret = match rule.secret_group {
                0 => (1..caps.len())
                    .filter_map(|g| caps.get(g))
                    .find(|g| !g.as_str().is_empty())
                    .map_or(match_start..match_start + matched.len(), |g| g.range()),
                group => match caps.get(group) {
                    Some(g) => g.range(),
                    None => continue,
                },
            };
            let secret_text = &text[secret.clone()];
            if rule.entropy != 0.0 && shannon_entropy(secret_text) <= rule.entropy {
                continue;
            }
            // The line, as far as [`LINE_REACH`] either side: a string with no newline is one
            // line, and reading all of it for every finding made a scan quadratic.
            let match_end = match_start + matched.len();
            let from = floor_char(text, match_start.saturating_sub(LINE_REACH));
            let to = ceil_char(text, match_end.saturating_add(LINE_REACH).min(text.len()));
            let line_start = memchr::memrchr(b'\n', &text.as_bytes()[from..match_start])
                .map_or(from, |i| from + i + 1);
            let line_end = memchr::memchr(b'\n', &text.as_bytes()[match_end..to])
                .map_or(to, |i| match_end + i);
            let line = &text[line_start..line_end];
            if self
                .global
                .iter()
                .chain(&rule.allowlists)
                .any(|a| a.allows(secret_text, matched, line))
            {
                continue;
            }
            out.push(Finding {
                rule: &rule.id,
                range: secret,
            });
        }
        out.len() < limit
    }
}

#[cfg(test)]
mod tests;
