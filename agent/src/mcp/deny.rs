//! The `--deny REGEX` lists of `toolwall shim` and `toolwall mcp-proxy` as a [`Gate`].
//!
//! The policy engine takes the same extra regexes; this gate is what the MCP layers use when
//! they run on command-line flags alone, and what their tests use.

use regex::{Regex, RegexBuilder};
use sha2::{Digest, Sha256};

use crate::decision::{Action, CallQuery, Decision, Gate, ToolIdentity};

/// Compiled size limit per pattern. Rust's regex engine runs in linear time (no backtracking),
/// so a pattern cannot be catastrophically slow; the limit stops patterns whose automaton would
/// be huge (`(a{1000}){1000}`) from eating memory at start-up.
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// Why a deny list was refused at start-up.
#[derive(Debug, thiserror::Error)]
pub enum DenyError {
    /// The pattern does not compile (syntax, or over the size limit).
    #[error("invalid --deny pattern {pattern:?}: {source}")]
    Invalid {
        /// The pattern as given.
        pattern: String,
        /// The regex crate's explanation.
        source: regex::Error,
    },
    /// An empty pattern would match every tool; almost certainly a stray comma.
    #[error("empty --deny pattern in {0:?} (to deny every tool, write '.*')")]
    Empty(String),
}

/// Splits one `--deny` value into patterns at commas that are not inside `{}`, `[]` or `()`
/// and not escaped, so `^file_.*$,.*_database$` is two patterns and `a{1,3}` stays one.
pub fn split_patterns(value: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start, mut escaped) = (0i32, 0usize, false);
    for (i, c) in value.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&value[start..]);
    out
}

/// SHA-256 (hex) of a tool definition's canonical JSON (keys sorted, no whitespace), the
/// hash `mcp_tool_seen` carries for version pinning.
pub fn tool_hash(tool: &serde_json::Value) -> String {
    // serde_json's default map is ordered by key, so serialising a parsed value is canonical.
    let bytes = serde_json::to_vec(tool).unwrap_or_default();
    hex::encode(Sha256::digest(&bytes))
}

/// Tools whose name matches any pattern are hidden and refused; everything else is allowed.
#[derive(Debug)]
pub struct DenyList {
    server_id: String,
    server_type: String,
    patterns: Vec<Regex>,
}

impl DenyList {
    /// Compiles the `--deny` values (each may hold several comma-separated patterns). Matching
    /// is a regex search: `delete` denies `bulk_delete` too; anchor (`^delete$`) for one name.
    pub fn new(
        server_id: impl Into<String>,
        server_type: impl Into<String>,
        values: &[String],
    ) -> Result<Self, DenyError> {
        let mut patterns = Vec::new();
        for value in values {
            for pattern in split_patterns(value) {
                if pattern.is_empty() {
                    return Err(DenyError::Empty(value.clone()));
                }
                let regex = RegexBuilder::new(pattern)
                    .size_limit(PATTERN_SIZE_LIMIT)
                    .dfa_size_limit(PATTERN_SIZE_LIMIT)
                    .build()
                    .map_err(|source| DenyError::Invalid {
                        pattern: pattern.to_owned(),
                        source,
                    })?;
                patterns.push(regex);
            }
        }
        Ok(Self {
            server_id: server_id.into(),
            server_type: server_type.into(),
            patterns,
        })
    }

    /// The first pattern that matches `name`.
    fn matching(&self, name: &str) -> Option<&Regex> {
        self.patterns.iter().find(|p| p.is_match(name))
    }

    fn decide(&self, server_id: &str, name: &str, tool_hash: String) -> Decision {
        let identity = Some(ToolIdentity {
            server_id: server_id.to_owned(),
            server_type: self.server_type.clone(),
            server_addr: String::new(),
            tool: name.to_owned(),
            tool_hash,
        });
        match self.matching(name) {
            Some(p) => Decision {
                action: Action::Block,
                reason: format!("tool denied by --deny {:?}", p.as_str()),
                tool: identity,
            },
            None => Decision {
                action: Action::Allow,
                reason: String::new(),
                tool: identity,
            },
        }
    }
}

impl Gate for DenyList {
    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
        let server = call.server_id.unwrap_or(&self.server_id);
        self.decide(server, call.name, String::new())
    }

    fn check_listed(
        &self,
        server_id: &str,
        _server_type: &str,
        tool: &serde_json::Value,
    ) -> Decision {
        let hash = tool_hash(tool);
        match tool.get("name").and_then(|n| n.as_str()) {
            Some(name) => self.decide(server_id, name, hash),
            // A nameless entry cannot be matched against the deny list: hide it (fail closed).
            None => Decision {
                action: Action::Block,
                reason: "tool definition has no name".to_owned(),
                tool: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_top_level_commas_only() {
        assert_eq!(
            split_patterns("^file_.*$,.*_database$"),
            ["^file_.*$", ".*_database$"]
        );
        assert_eq!(
            split_patterns("a{1,3},[,]x,\\,y"),
            ["a{1,3}", "[,]x", "\\,y"]
        );
    }

    #[test]
    fn invalid_and_empty_patterns_are_refused() {
        let err = DenyList::new("s", "stdio", &["ok,(unclosed".into()]).unwrap_err();
        assert!(err.to_string().contains("(unclosed"), "{err}");
        assert!(DenyList::new("s", "stdio", &["a,,b".into()]).is_err());
        assert!(DenyList::new("s", "stdio", &["(a{1000}){1000}".into()]).is_err());
    }

    #[test]
    fn denies_matching_names() {
        let gate = DenyList::new("s", "stdio", &["^echo$,^get-".into()]).unwrap();
        let call = |name| {
            gate.check_call(&CallQuery {
                server_id: Some("s"),
                name,
                namespace: None,
            })
        };
        assert!(call("echo").is_blocked());
        assert!(call("get-sum").is_blocked());
        assert!(!call("echoes").is_blocked());
        let listed = gate.check_listed("s", "stdio", &serde_json::json!({"name": "echo"}));
        assert!(listed.is_blocked());
        assert!(
            gate.check_listed("s", "stdio", &serde_json::json!({}))
                .is_blocked()
        );
    }
}
