//! The poisoning checks on what a server says to the model besides its tools' definitions
//! (`initialize` instructions, prompts' and resources' descriptions), read per message like
//! the result rules, and merged with their verdict.

use serde_json::Value;

use crate::{
    config::DefinitionAction,
    decision::{ResultAction, ResultVerdict},
    policy::Policy,
};

/// What a message that may hold server texts shows: a `\u` escape (a key could hide behind
/// one) or one of the keys that hold them.
static SIGNS: std::sync::LazyLock<[memchr::memmem::Finder<'static>; 5]> =
    std::sync::LazyLock::new(|| {
        [
            b"\\u".as_slice(),
            b"\"instructions\"",
            b"\"prompts\"",
            b"\"resources\"",
            b"\"resourceTemplates\"",
        ]
        .map(memchr::memmem::Finder::new)
    });

impl Policy {
    /// The poisoning checks on what else a server says to the model, which reaches it as
    /// surely as a tool's description: `instructions` in its `initialize` result (Claude Code
    /// puts them in its system prompt), prompts' and resources' descriptions in its lists. A finding
    /// under `alert` is recorded, under `hide` the text is replaced by
    /// `[toolwall:redacted:poisoning]`, under `block_server` the message is withheld. Read from
    /// what the result rules would forward (their redactions kept).
    pub(in crate::policy) fn poisoned_texts(
        &self,
        server_id: &str,
        message: &[u8],
        before: Option<&ResultVerdict>,
    ) -> Option<ResultVerdict> {
        if !self.definitions.poisoning_on() {
            return None;
        }
        // Only a message that may hold such text is parsed (a `\u`-escaped key too). Every
        // server message is looked at: the searchers are built once, not per message.
        if !SIGNS.iter().any(|sign| sign.find(message).is_some()) {
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
}

/// The result rules' verdict and the poisoning checks' on one message, as one: the stronger
/// action, both sets of findings, and the later redaction (made on the earlier's output).
pub(in crate::policy) fn merge_verdicts(
    first: Option<ResultVerdict>,
    poisoned: ResultVerdict,
) -> ResultVerdict {
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
