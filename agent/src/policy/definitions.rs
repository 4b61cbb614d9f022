//! Poisoned and shadowing tool definitions (issue 16): what a listed tool says to the model
//! besides what it does.
//!
//! Every string of a definition (name, title, description, the input schema's descriptions,
//! enums and defaults, annotations) is read for text aimed at the model rather than at a
//! person: characters a person cannot see (zero-width, bidirectional controls, Unicode tag
//! characters — "ASCII smuggling"), terminal escapes, instruction-like phrases ("ignore the
//! previous instructions", `<IMPORTANT>`, "do not tell the user"), references to credentials
//! and agent configuration files, and names of other servers' tools. A tool named like another
//! server's tool (equal once case, separators and look-alike letters are set aside) shadows it.
//! What a finding does is the config's (`sandbox.mcp.definition_checks`): alert (recorded in
//! the listing's `mcp_tool_seen` reason), hide the tool, or block the server.

use regex::{Regex, RegexSet};
use serde_json::Value;

use crate::config::{DefinitionAction, DefinitionChecksConfig};

/// Longest piece of evidence quoted in a reason.
const EVIDENCE: usize = 80;

/// Phrases addressed to the model, not to a person reading the description.
const INSTRUCTIONS: &[&str] = &[
    r"(?i)\b(ignore|disregard|forget|override)\b.{0,40}\b(previous|prior|above|earlier|all|other|system)\b.{0,30}\b(instructions?|rules|prompts?|guidelines|directions)\b",
    r"(?i)<\s*/?\s*(important|system|instructions?|secret|hidden)\s*>",
    r"(?i)\b(do not|don't|never)\s+(tell|mention|inform|reveal|show|notify|alert)\b.{0,40}\b(user|human|operator)\b",
    r"(?i)\bbefore (using|calling|invoking|running) (this|any|the other|other)\b.{0,20}\btools?\b",
    r"(?i)\b(you|the assistant|the model|the ai)\s+(must|should|have to|need to)\s+(first\s+)?(call|use|invoke|read|send|include|pass|forward)\b",
    r"(?i)\b(system prompt|hidden instructions?|secret instructions?)\b",
];

/// Credentials and files an agent's host keeps that a tool has no business naming.
const FILES: &str = r"(?i)(~|\$HOME|/home/[^/\s]+|/root)/\.(ssh|aws|gnupg|docker|kube|netrc|npmrc|pypirc|git-credentials)\b|\bid_(rsa|dsa|ecdsa|ed25519)\b|/etc/(passwd|shadow|sudoers)\b|\.env\b|\b(mcp|claude_desktop_config|settings\.local)\.json\b|\.cursor/|\.codex/|\bauthorized_keys\b|\bcredentials\.json\b";

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
}

/// Characters a person reading the text does not see.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}' | '\u{FEFF}' | '\u{00AD}' | '\u{180E}'
        | '\u{E0000}'..='\u{E007F}' | '\u{FE00}'..='\u{FE0F}' | '\u{E0100}'..='\u{E01EF}')
        || (c.is_control() && !matches!(c, '\n' | '\t' | '\r' | '\u{1B}' | '\u{9B}'))
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

/// A tool name with case, separators and look-alike letters set aside.
pub(crate) fn skeleton(name: &str) -> String {
    name.chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| {
            let c = match c {
                'а' | 'ɑ' | 'α' => 'a',
                'с' | 'ϲ' => 'c',
                'ԁ' => 'd',
                'е' | 'ε' => 'e',
                'ɡ' => 'g',
                'һ' => 'h',
                'і' | 'ι' | 'ӏ' | 'l' | '1' | '|' => 'i',
                'ј' => 'j',
                'κ' | 'к' => 'k',
                'о' | 'ο' | '0' => 'o',
                'р' | 'ρ' => 'p',
                'ѕ' => 's',
                'τ' | 'т' => 't',
                'υ' | 'ս' => 'u',
                'ν' => 'v',
                'х' | 'χ' => 'x',
                'у' | 'γ' => 'y',
                c => c,
            };
            c.is_alphanumeric().then_some(c)
        })
        .collect()
}

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

    /// What `tool` (a definition `server` lists) holds. `others` are the other servers' tools
    /// as `(server, tool, skeleton)`.
    pub(crate) fn check(
        &self,
        tool: &Value,
        others: &[(String, String, String)],
    ) -> Vec<DefinitionFinding> {
        let mut found = Vec::new();
        let name = tool.get("name").and_then(Value::as_str).unwrap_or("");
        if self.poisoning != DefinitionAction::Off {
            let mut strings = Vec::new();
            collect_strings(tool, &mut strings);
            for text in strings {
                self.poisoned(text, name, others, &mut found);
            }
        }
        if self.shadowing != DefinitionAction::Off && !name.is_empty() {
            let own = skeleton(name);
            if let Some((server, other, _)) = others.iter().find(|(_, _, s)| *s == own) {
                found.push(DefinitionFinding {
                    check: "shadowing",
                    evidence: format!("{} is named like {server}/{} ", quote(name), quote(other))
                        .trim_end()
                        .to_owned(),
                    action: self.shadowing,
                });
            }
        }
        found
    }

    fn poisoned(
        &self,
        text: &str,
        name: &str,
        others: &[(String, String, String)],
        found: &mut Vec<DefinitionFinding>,
    ) {
        let action = self.poisoning;
        let mut push = |check, evidence: String| {
            if !found.iter().any(|f| f.check == check) {
                found.push(DefinitionFinding {
                    check,
                    evidence,
                    action,
                });
            }
        };
        if let Some(at) = text.find(invisible) {
            let c = text[at..].chars().next().unwrap_or(' ');
            push(
                "invisible-characters",
                format!(
                    "U+{:04X} in {}",
                    c as u32,
                    quote(&text[..at.min(text.len())])
                ),
            );
        }
        if text.contains(['\u{1B}', '\u{9B}']) {
            push("terminal-escape", quote(text));
        }
        if let Some(i) = self.instructions.matches(text).into_iter().next()
            && let Some(m) = self.instruction_list.get(i).and_then(|re| re.find(text))
        {
            push("instruction", quote(m.as_str()));
        }
        if let Some(m) = self.files.find(text) {
            push("credential-reference", quote(m.as_str()));
        }
        // Another server's tool named in the text, by a name distinctive enough (a separator or
        // an inner capital, at least 5 characters) not to be a common word.
        for (server, other, _) in others {
            let distinctive = other.len() >= 5
                && other != name
                && (other.contains(['_', '-'])
                    || other.chars().skip(1).any(|c| c.is_ascii_uppercase()));
            if distinctive && contains_word(text, other) {
                push("tool-reference", format!("names {server}/{}", quote(other)));
                break;
            }
        }
    }
}

/// Whether `word` stands in `text` on its own (not inside a longer name).
fn contains_word(text: &str, word: &str) -> bool {
    let part = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    text.match_indices(word).any(|(at, _)| {
        !text[..at].chars().next_back().is_some_and(part)
            && !text[at + word.len()..].chars().next().is_some_and(part)
    })
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
