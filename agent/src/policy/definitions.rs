//! Poisoned and shadowing tool definitions: what a listed tool says to the model
//! besides what it does.
//!
//! Every string of a definition (name, title, description, the input schema's descriptions,
//! enums, defaults and keys, annotations, `_meta`) is read for text aimed at the model rather
//! than at a person: characters a person cannot see (the set every view escapes, `hidden.rs`:
//! controls, every format character — zero-width, bidirectional controls, Unicode tag
//! characters — line separators, fillers and variation selectors), terminal escapes, instruction-like phrases ("ignore the previous instructions", `<IMPORTANT>`, "do
//! not tell the user"; read with look-alike letters, fullwidth forms, curly quotes and spaces
//! folded), references to credentials and agent configuration files, and names of other
//! servers' tools. A tool named like another server's tool (equal once case, separators and
//! look-alike letters are set aside) shadows it. The phrases are a heuristic list, not a
//! classifier: a paraphrase, another language or an encoding passes. What a finding does is
//! the config's (`sandbox.mcp.definition_checks`): alert (recorded in the listing's
//! `mcp_tool_seen` reason), hide the tool, or block the server.

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use regex::{Regex, RegexSet};
use serde_json::Value;

use crate::config::{DefinitionAction, DefinitionChecksConfig};

mod cache;
mod carry;
mod judge;
mod server_texts;
mod state;

pub(super) use server_texts::merge_verdicts;
use state::Flag;
pub(crate) use state::{DefinitionState, Judged};

/// Longest piece of evidence quoted in a reason.
const EVIDENCE: usize = 80;

/// Phrases addressed to the model, not to a person reading the description; matched on the
/// text as [`fold`] writes it.
const INSTRUCTIONS: &[&str] = &[
    r"(?i)\b(ignore|disregard|forget|override)\b.{0,40}\b(previous|prior|above|earlier|preceding|original|system)\b.{0,30}\b(instructions?|rules|prompts?|guidelines|directions|messages?)\b",
    r"(?i)[<\[]\s*/?\s*(important|system|system-reminder|instructions?|secret|hidden|admin)\s*[>\]]",
    r"(?i)\b(do not|don't|never)\s+(tell|mention|inform|reveal|show|notify|alert)\b.{0,40}\b(user|human|operator)\b",
    r"(?i)\bkeep (this|it) (between us|secret|hidden|from the user)\b",
    r"(?i)\bbefore (using|calling|invoking|running) (this|any|the other|other)\b.{0,20}\btools?\b",
    r"(?i)\b(you|the assistant|the model|the ai|the agent|claude|chatgpt|codex)\s+(must|should|have to|need to|is required to)\s+(first\s+|always\s+)?(call|use|invoke|read|send|include|pass|forward|upload)\b",
    r"(?i)\b(hidden|secret) instructions?\b",
];

/// Credentials and files an agent's host keeps that a tool has no business naming.
const FILES: &str = r"(?i)(~|\$\{?HOME\}?|%USERPROFILE%|/home/[^/\s]+|/Users/[^/\s]+|/root)[/\\]\.(ssh|aws|gnupg|docker|kube|netrc|npmrc|pypirc|git-credentials|bash_history|zsh_history|config[/\\](gh|gcloud))\b|\bid_(rsa|dsa|ecdsa|ed25519)\b|/etc/(passwd|shadow|sudoers)\b|\b(mcp|claude_desktop_config|settings\.local)\.json\b|\.cursor/|\.codex/|\bauthorized_keys\b|\bapplication_default_credentials\.json\b|\b(ssh|private) key\b.{0,30}\b(folder|directory)\b";

/// The compiled `definition_checks:`.
#[derive(Debug)]
pub(crate) struct DefinitionChecks {
    poisoning: DefinitionAction,
    shadowing: DefinitionAction,
    instructions: RegexSet,
    /// The same patterns one by one, to quote what matched.
    instruction_list: Vec<Regex>,
    files: Regex,
}

/// One thing a definition check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DefinitionFinding {
    /// `invisible-characters`, `terminal-escape`, `instruction`, `credential-reference`,
    /// `tool-reference` or `shadowing`.
    pub check: &'static str,
    /// What was found, quoted with escapes (never more than [`EVIDENCE`] characters).
    pub evidence: String,
    /// What the config says it does.
    pub action: DefinitionAction,
    /// For `shadowing`: the server whose tool it is named like.
    pub shadows: Option<String>,
}

/// Longest tool name looked for in other tools' text, in bytes: the LLM APIs take names of
/// at most 64 characters (a longer one cannot be called by a model under that name), and
/// longer patterns make the set's build the cost of a listing (2,000 names of 512 bytes, the
/// set rebuilt as the listing registers them, run for minutes).
const MAX_NAMED: usize = 64;

/// The registered tools a listing is compared with: `(server, tool, skeleton)`, indexed by
/// skeleton, and an automaton of their distinctive names for finding them named in text (one
/// pass per string, however many there are). One set serves every server's listing: a
/// server's own tools are skipped when its listing is judged (a set per server makes judging a
/// large registry quadratic — 48 s and 1 GB for 1,000 servers of 5 tools).
#[derive(Debug)]
pub(crate) struct Others {
    tools: Vec<(String, String, String)>,
    /// Skeleton → indices into `tools`.
    by_skeleton: HashMap<String, Vec<usize>>,
    names: Option<AhoCorasick>,
    /// Pattern of `names` (one per name, any case) → indices into `tools` of the tools so
    /// named (a pattern per tool would make a name 2,000 servers share cost 2,000² per
    /// mention).
    named: Vec<Vec<usize>>,
}

impl Others {
    /// From `(server, tool)` pairs of the registry, with no set before it (the checks' tests).
    #[cfg(test)]
    pub(crate) fn new(tools: Vec<(String, String)>) -> Self {
        Self::reusing(tools, None)
    }

    /// From `(server, tool)` pairs of the registry, taking the skeletons of the tools
    /// `previous` already has from it: the set is rebuilt while a listing is judged, and a
    /// skeleton of a long look-alike name costs far more than a lookup.
    pub(crate) fn reusing(tools: Vec<(String, String)>, previous: Option<&Others>) -> Self {
        let known: HashMap<(&str, &str), &str> = previous
            .into_iter()
            .flat_map(|p| &p.tools)
            .map(|(server, tool, key)| ((server.as_str(), tool.as_str()), key.as_str()))
            .collect();
        let tools: Vec<(String, String, String)> = tools
            .into_iter()
            .map(|(server, tool)| {
                let key = match known.get(&(server.as_str(), tool.as_str())) {
                    Some(key) => (*key).to_owned(),
                    None => skeleton(&tool),
                };
                (server, tool, key)
            })
            .collect();
        let mut by_skeleton: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, (_, _, key)) in tools.iter().enumerate() {
            by_skeleton.entry(key.clone()).or_default().push(i);
        }
        // Names distinctive enough (a separator or an inner capital, at least 5 characters)
        // not to be common words, and no longer than a name can be (one 3 MB name would take
        // the automaton's build to 2.7 GB and minutes, in every listing of every server and
        // after a restart, the registry keeping it).
        let mut patterns: HashMap<String, usize> = HashMap::new();
        let mut named: Vec<Vec<usize>> = Vec::new();
        for (i, (_, t, _)) in tools.iter().enumerate() {
            if t.len() >= 5
                && t.len() <= MAX_NAMED
                && (t.contains(['_', '-']) || t.chars().skip(1).any(|c| c.is_ascii_uppercase()))
            {
                let pattern = *patterns.entry(t.to_ascii_lowercase()).or_insert_with(|| {
                    named.push(Vec::new());
                    named.len() - 1
                });
                named[pattern].push(i);
            }
        }
        let names = (!named.is_empty())
            .then(|| {
                AhoCorasickBuilder::new()
                    .ascii_case_insensitive(true)
                    .match_kind(MatchKind::Standard)
                    .build(
                        named
                            .iter()
                            .map(|tools_named| tools[tools_named[0]].1.as_str()),
                    )
                    .ok()
            })
            .flatten();
        Others {
            tools,
            by_skeleton,
            names,
            named,
        }
    }

    /// Whether `server_id`'s `tool` is in the set.
    pub(crate) fn contains(&self, server_id: &str, tool: &str) -> bool {
        self.by_skeleton
            .get(&skeleton(tool))
            .into_iter()
            .flatten()
            .any(|&i| self.tools[i].0 == server_id && self.tools[i].1 == tool)
    }
}

/// A character a person reading the text does not see (`hidden.rs`: controls, every format
/// character, fillers, variation selectors), other than the line ends and tab a description
/// may hold, and the escapes flagged as such.
///
/// Spaces of other widths are shown escaped in the views (a no-break space after a name hides
/// in a table) but are no hidden instruction in a description: they read as spaces (`fold`).
fn invisible(c: char) -> bool {
    let space = c.is_whitespace() && !c.is_control() && !matches!(c, '\u{2028}' | '\u{2029}');
    crate::hidden::is_hidden(c) && !space && !matches!(c, '\n' | '\t' | '\r' | '\u{1B}' | '\u{9B}')
}

/// `text` quoted for a reason: escaped, at most [`EVIDENCE`] characters.
fn quote(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars().take(EVIDENCE) {
        out.extend(c.escape_debug());
    }
    if text.chars().count() > EVIDENCE {
        out.push('…');
    }
    out
}

/// A Cyrillic or Greek letter (and a few others) that looks like a Latin one, as that one.
fn latin(c: char) -> char {
    match c {
        'а' | 'ɑ' | 'α' | 'А' | 'Α' => 'a',
        'с' | 'ϲ' | 'С' => 'c',
        'ԁ' => 'd',
        'е' | 'ε' | 'Е' | 'Ε' => 'e',
        'ɡ' => 'g',
        'һ' | 'Н' | 'Η' => 'h',
        'і' | 'ι' | 'ӏ' | 'ı' | 'ɩ' | 'І' | 'Ι' => 'i',
        'ј' | 'Ј' => 'j',
        'κ' | 'к' | 'К' | 'Κ' => 'k',
        'ⅼ' => 'l',
        'м' | 'М' | 'Μ' => 'm',
        'о' | 'ο' | 'О' | 'Ο' => 'o',
        'р' | 'ρ' | 'Р' | 'Ρ' => 'p',
        'ѕ' | 'Ѕ' => 's',
        'τ' | 'т' | 'Т' | 'Τ' => 't',
        'υ' | 'ս' => 'u',
        'ν' => 'v',
        'х' | 'χ' | 'Х' | 'Χ' => 'x',
        'у' | 'γ' | 'У' => 'y',
        '\u{FF01}'..='\u{FF5E}' => char::from_u32(c as u32 - 0xFEE0).unwrap_or(c),
        c => c,
    }
}

/// `text` as the phrase patterns read it: look-alike and fullwidth letters as Latin ones,
/// curly quotes straight, every space (line ends and separators too) one blank, hidden
/// characters gone.
fn fold(text: &str) -> String {
    text.chars()
        .filter_map(|c| match c {
            '\u{2018}' | '\u{2019}' | '\u{02BC}' => Some('\''),
            '\u{201C}' | '\u{201D}' => Some('"'),
            c if c.is_whitespace() => Some(' '),
            c if crate::hidden::is_hidden(c) => None,
            c => Some(latin(c)),
        })
        .collect()
}

/// A tool name with case, separators and look-alike letters set aside (`1`, `l` and `|` as
/// `i`; `0` as `o`; `rn` as `m`; `vv` as `w`).
///
/// One pass, one allocation: a listing's every name is read this way on each judging (2,000
/// names of 7 kB took a second of the proxy's only thread when each character went through
/// `to_lowercase` and two `replace` passes copied the rest).
pub(crate) fn skeleton(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    // The last character kept: `rn` and `vv` are replaced as they complete, and a
    // replacement (`m`, `w`) never starts another, so this is the two left-to-right
    // replacements in turn.
    let mut last = None;
    let mut join = |c: char| match (c, last) {
        ('n', Some('r')) | ('v', Some('v')) => {
            out.pop();
            let joined = if c == 'n' { 'm' } else { 'w' };
            out.push(joined);
            last = Some(joined);
        }
        _ => {
            out.push(c);
            last = Some(c);
        }
    };
    let mut rest = name;
    while !rest.is_empty() {
        // A run of ASCII by table, then one other character the long way.
        let ascii = rest.bytes().take_while(u8::is_ascii).count();
        for &b in &rest.as_bytes()[..ascii] {
            let kept = ASCII_SKELETON[usize::from(b)];
            if kept != 0 {
                join(char::from(kept));
            }
        }
        rest = &rest[ascii..];
        if let Some(c) = rest.chars().next() {
            for c in c.to_lowercase() {
                let c = match latin(c) {
                    'l' | '1' | '|' => 'i',
                    '0' => 'o',
                    c => c,
                };
                if c.is_alphanumeric() {
                    join(c);
                }
            }
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Each ASCII byte as [`skeleton`] keeps it (lowercased, `l`, `1` and `|` as `i`, `0` as
/// `o`), or 0 when it is set aside (no letter or digit).
const ASCII_SKELETON: [u8; 128] = {
    let mut table = [0u8; 128];
    let mut b = 0;
    while b < 128 {
        let c = (b as u8).to_ascii_lowercase();
        table[b] = match c {
            b'l' | b'1' | b'|' => b'i',
            b'0' => b'o',
            c if c.is_ascii_alphanumeric() => c,
            _ => 0,
        };
        b += 1;
    }
    table
};

impl DefinitionChecks {
    /// Compiles the config (the built-in patterns are fixed and tested).
    pub(crate) fn new(config: &DefinitionChecksConfig) -> Result<Self, regex::Error> {
        Ok(DefinitionChecks {
            poisoning: config.poisoning,
            shadowing: config.shadowing,
            instructions: RegexSet::new(INSTRUCTIONS)?,
            instruction_list: INSTRUCTIONS
                .iter()
                .map(|p| Regex::new(p))
                .collect::<Result<_, _>>()?,
            files: Regex::new(FILES)?,
        })
    }

    /// Whether nothing is checked.
    pub(crate) fn is_off(&self) -> bool {
        self.poisoning == DefinitionAction::Off && self.shadowing == DefinitionAction::Off
    }

    /// Whether a finding can refuse anything (hide a tool, block a server): only then are
    /// stored definitions judged again.
    pub(crate) fn refuses(&self) -> bool {
        self.poisoning >= DefinitionAction::Hide || self.shadowing >= DefinitionAction::Hide
    }

    /// What this configuration does on a finding of `check` (a [`DefinitionFinding::check`]).
    pub(crate) fn action_of(&self, check: &str) -> DefinitionAction {
        match check {
            "shadowing" => self.shadowing,
            _ => self.poisoning,
        }
    }

    /// What the poisoning checks find in one text the model reads besides tool definitions
    /// (a server's `instructions`, a prompt's or resource's description).
    pub(crate) fn check_text(
        &self,
        text: &str,
        server_id: &str,
        others: &Others,
    ) -> Vec<DefinitionFinding> {
        let mut found = Vec::new();
        if self.poisoning != DefinitionAction::Off {
            self.poisoned(text, "", server_id, others, &mut found);
        }
        found
    }

    /// Whether the poisoning checks are on.
    pub(crate) fn poisoning_on(&self) -> bool {
        self.poisoning != DefinitionAction::Off
    }

    /// What `tool` (a definition `server_id` lists) holds, against the other servers' tools;
    /// a shadowing finding names a `declared` server's twin when there is one (otherwise the
    /// first twin found, an undeclared decoy's, would make the finding alert only).
    pub(crate) fn check(
        &self,
        tool: &Value,
        server_id: &str,
        others: &Others,
        declared: &dyn Fn(&str) -> bool,
    ) -> Vec<DefinitionFinding> {
        let mut found = Vec::new();
        let name = tool.get("name").and_then(Value::as_str).unwrap_or("");
        if self.poisoning != DefinitionAction::Off {
            let mut strings = Vec::new();
            collect_strings(tool, &mut strings);
            for text in strings {
                self.poisoned(text, name, server_id, others, &mut found);
            }
        }
        if self.shadowing != DefinitionAction::Off && !name.is_empty() {
            let twins = || {
                others
                    .by_skeleton
                    .get(&skeleton(name))
                    .into_iter()
                    .flatten()
                    .map(|&i| &others.tools[i])
                    .filter(|(server, _, _)| server != server_id)
            };
            let twin = twins()
                .find(|(server, _, _)| declared(server))
                .or_else(|| twins().next());
            if let Some((server, other, _)) = twin {
                found.push(DefinitionFinding {
                    check: "shadowing",
                    evidence: format!("{} is named like {server}/{}", quote(name), quote(other)),
                    action: self.shadowing,
                    shadows: Some(server.clone()),
                });
            }
        }
        found
    }

    fn poisoned(
        &self,
        text: &str,
        name: &str,
        server_id: &str,
        others: &Others,
        found: &mut Vec<DefinitionFinding>,
    ) {
        let action = self.poisoning;
        let mut push = |check, evidence: String| {
            if !found.iter().any(|f| f.check == check) {
                found.push(DefinitionFinding {
                    check,
                    evidence,
                    action,
                    shadows: None,
                });
            }
        };
        if let Some(at) = text.find(invisible) {
            let c = text[at..].chars().next().unwrap_or(' ');
            push(
                "invisible-characters",
                format!("U+{:04X} in {}", c as u32, quote(&text[..at])),
            );
        }
        if text.contains(['\u{1B}', '\u{9B}']) {
            push("terminal-escape", quote(text));
        }
        let folded = fold(text);
        let text = folded.as_str();
        if let Some(i) = self.instructions.matches(text).into_iter().next()
            && let Some(m) = self.instruction_list.get(i).and_then(|re| re.find(text))
        {
            push("instruction", quote(m.as_str()));
        }
        if let Some(m) = self.files.find(text) {
            push("credential-reference", quote(m.as_str()));
        }
        // Another server's tool named in the text (any case), standing as a word.
        let part = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
        for m in others
            .names
            .iter()
            .flat_map(|names| names.find_overlapping_iter(text))
        {
            let alone = !text[..m.start()].chars().next_back().is_some_and(part)
                && !text[m.end()..].chars().next().is_some_and(part);
            let named = &others.named[m.pattern().as_usize()];
            if !alone || others.tools[named[0]].1.eq_ignore_ascii_case(name) {
                continue;
            }
            if let Some((server, other, _)) = named
                .iter()
                .map(|&i| &others.tools[i])
                .find(|(server, _, _)| server != server_id)
            {
                push("tool-reference", format!("names {server}/{}", quote(other)));
                break;
            }
        }
    }
}

/// Every string in `value`, object keys included.
fn collect_strings<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        Value::Object(map) => {
            for (k, v) in map {
                out.push(k);
                collect_strings(v, out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
