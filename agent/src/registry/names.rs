//! The forms in which agents name MCP tools, and how to take them apart.
//!
//! Claude Code calls tool `get-sum` of server `everything` `mcp__everything__get-sum`; Codex
//! sends the function `get_sum` in the namespace `mcp__everything`; other hosts use other
//! prefixes. Policy rules name the server's own tool name, so every form has to be mapped back
//! or the rules match nothing in real use. A [`NamePattern`] is one such form, written in the
//! config as `name_patterns: ["{server}.{tool}", "mcp_{server}_{tool}", "myhost_{tool}"]`:
//! literal text around a `{server}` placeholder (optional) followed by a `{tool}` placeholder,
//! with non-empty text between the two. Server ids may contain the separator (`my__srv`), so a
//! name is split at every occurrence of it and each split is tried against the registry.

/// Claude Code's form (Qwen Code's too), always understood.
pub(crate) const CLAUDE_CODE_PATTERN: &str = "mcp__{server}__{tool}";

/// The other agents' forms, always understood after Claude Code's: Gemini CLI's
/// (`mcp_everything_echo`, a prefix of its own: a tool of any server, known or not) and
/// OpenCode's (`everything_echo`: no prefix, so only a server toolwall knows is read from it).
const BUILT_IN_PATTERNS: [&str; 2] = ["mcp_{server}_{tool}", "{server}_{tool}"];

/// Codex's namespace prefix: `mcp__<server>`.
pub(crate) const CODEX_NAMESPACE_PREFIX: &str = "mcp__";

/// One compiled name form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NamePattern {
    source: String,
    prefix: String,
    /// Text between `{server}` and `{tool}`; `None` when the form has no `{server}`.
    separator: Option<String>,
    suffix: String,
}

impl NamePattern {
    /// Parses `prefix{server}separator{tool}suffix` or `prefix{tool}suffix`; the error says
    /// what is wrong in words.
    pub(crate) fn parse(source: &str) -> Result<Self, String> {
        const SERVER: &str = "{server}";
        const TOOL: &str = "{tool}";
        if source.matches(TOOL).count() != 1 {
            return Err("must contain `{tool}` exactly once".to_string());
        }
        if source.matches(SERVER).count() > 1 {
            return Err("may contain `{server}` at most once".to_string());
        }
        let tool_at = source.find(TOOL).unwrap_or_default();
        let (prefix, separator) = match source.find(SERVER) {
            Some(server_at) if server_at > tool_at => {
                return Err("`{server}` must come before `{tool}`".to_string());
            }
            Some(server_at) => {
                let separator = &source[server_at + SERVER.len()..tool_at];
                if separator.is_empty() {
                    return Err(
                        "needs text between `{server}` and `{tool}` to split them at".to_string(),
                    );
                }
                (&source[..server_at], Some(separator.to_string()))
            }
            None => (&source[..tool_at], None),
        };
        let suffix = &source[tool_at + TOOL.len()..];
        for part in [prefix, separator.as_deref().unwrap_or(""), suffix] {
            if part.contains(['{', '}']) {
                return Err("only `{server}` and `{tool}` placeholders are known".to_string());
            }
        }
        if prefix.is_empty() && suffix.is_empty() && separator.is_none() {
            return Err("`{tool}` alone is the bare name, which is always understood".to_string());
        }
        Ok(NamePattern {
            source: source.to_string(),
            prefix: prefix.to_string(),
            separator,
            suffix: suffix.to_string(),
        })
    }

    /// Whether a name of this form is an MCP tool of some server whether or not the server is
    /// known: the form names a server and starts with a prefix of its own (`mcp__`), so a
    /// native tool (`read_file`) does not fit it by chance.
    pub(crate) fn marks_servers(&self) -> bool {
        self.separator.is_some() && !self.prefix.is_empty()
    }

    /// Calls `try_split(server, tool)` for each way `name` fits this form (server `None` for a
    /// form without `{server}`), stopping at the first `Some`. Allocates nothing.
    pub(crate) fn find_map<'n, R>(
        &self,
        name: &'n str,
        mut try_split: impl FnMut(Option<&'n str>, &'n str) -> Option<R>,
    ) -> Option<R> {
        let middle = name
            .strip_prefix(self.prefix.as_str())?
            .strip_suffix(self.suffix.as_str())?;
        let Some(separator) = self.separator.as_deref() else {
            return if middle.is_empty() {
                None
            } else {
                try_split(None, middle)
            };
        };
        // A plain byte scan: names are short, and `match_indices` sets up a substring searcher
        // per call that costs more than the scan itself.
        let (bytes, sep) = (middle.as_bytes(), separator.as_bytes());
        for at in 0..bytes.len().saturating_sub(sep.len() - 1) {
            if !bytes[at..].starts_with(sep) || !middle.is_char_boundary(at) {
                continue;
            }
            let (server, tool) = (&middle[..at], &middle[at + sep.len()..]);
            if server.is_empty() || tool.is_empty() {
                continue;
            }
            if let Some(found) = try_split(Some(server), tool) {
                return Some(found);
            }
        }
        None
    }
}

/// The forms in use: Claude Code's, then the configured ones in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NamePatterns {
    patterns: Vec<NamePattern>,
}

impl NamePatterns {
    /// Claude Code's form, the other built-in ones, then `extra` (config
    /// `sandbox.mcp.name_patterns`; one that repeats a built-in form is not added twice).
    pub(crate) fn new(extra: &[String]) -> Result<Self, (usize, String)> {
        let mut patterns = Vec::with_capacity(extra.len() + 1 + BUILT_IN_PATTERNS.len());
        for built_in in std::iter::once(CLAUDE_CODE_PATTERN).chain(BUILT_IN_PATTERNS) {
            patterns.push(NamePattern::parse(built_in).map_err(|e| (usize::MAX, e))?);
        }
        for (i, source) in extra.iter().enumerate() {
            let pattern = NamePattern::parse(source).map_err(|e| (i, e))?;
            if !patterns.contains(&pattern) {
                patterns.push(pattern);
            }
        }
        Ok(NamePatterns { patterns })
    }

    /// The forms, Claude Code's first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &NamePattern> {
        self.patterns.iter()
    }
}

impl Default for NamePatterns {
    fn default() -> Self {
        NamePatterns::new(&[]).unwrap_or(NamePatterns {
            patterns: Vec::new(),
        })
    }
}

/// The name as Codex and most OpenAI-style hosts sanitize it: every character outside
/// `[A-Za-z0-9_]` becomes `_` (`get-sum` → `get_sum`). `None` when that changes nothing.
pub(crate) fn codex_form(name: &str) -> Option<String> {
    sanitize(name, |c| c.is_ascii_alphanumeric() || c == '_')
}

/// The name as Claude Code sanitizes it: every character outside `[A-Za-z0-9_-]` becomes `_`
/// (`my.server` → `my_server`). `None` when that changes nothing.
pub(crate) fn claude_form(name: &str) -> Option<String> {
    sanitize(name, |c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn sanitize(name: &str, keep: impl Fn(char) -> bool) -> Option<String> {
    if name.chars().all(&keep) {
        return None;
    }
    Some(
        name.chars()
            .map(|c| if keep(c) { c } else { '_' })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn splits(pattern: &str, name: &str) -> Vec<(Option<String>, String)> {
        let pattern = NamePattern::parse(pattern).expect("valid pattern");
        let mut seen = Vec::new();
        let _: Option<()> = pattern.find_map(name, |server, tool| {
            seen.push((server.map(str::to_string), tool.to_string()));
            None
        });
        seen
    }

    #[test]
    fn claude_form_splits_at_every_separator() {
        assert_eq!(
            splits(CLAUDE_CODE_PATTERN, "mcp__my__srv__get-sum"),
            vec![
                (Some("my".to_string()), "srv__get-sum".to_string()),
                (Some("my__srv".to_string()), "get-sum".to_string()),
            ]
        );
        assert!(splits(CLAUDE_CODE_PATTERN, "get-sum").is_empty());
        assert!(splits(CLAUDE_CODE_PATTERN, "mcp____x").is_empty());
    }

    #[test]
    fn custom_forms() {
        assert_eq!(
            splits("{server}.{tool}", "fs.read"),
            vec![(Some("fs".to_string()), "read".to_string())]
        );
        assert_eq!(
            splits("host_{tool}_v1", "host_read_v1"),
            vec![(None, "read".to_string())]
        );
        assert!(splits("host_{tool}_v1", "host_read").is_empty());
    }

    #[test]
    fn bad_patterns_are_explained() {
        let cases = [
            ("mcp_{server}", "exactly once"),
            ("{tool}{tool}", "exactly once"),
            ("{tool}.{server}", "before"),
            ("{server}{tool}", "text between"),
            ("{server}.{tool}.{x}", "placeholders"),
            ("{tool}", "bare name"),
        ];
        for (pattern, want) in cases {
            let error = NamePattern::parse(pattern).expect_err(pattern);
            assert!(error.contains(want), "{pattern}: {error}");
        }
    }

    #[test]
    fn sanitized_forms() {
        assert_eq!(codex_form("get-sum").as_deref(), Some("get_sum"));
        assert_eq!(codex_form("get_sum"), None);
        assert_eq!(claude_form("my.server").as_deref(), Some("my_server"));
        assert_eq!(claude_form("my-server"), None);
    }
}
