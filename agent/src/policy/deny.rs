//! The `deny:` regex list (and the shim's and proxy's `--deny` flags): a tool whose name
//! matches any of them is blocked, whatever else the rules say.
//!
//! All patterns go into one `RegexSet`, so "does any match?" is a single pass over the name;
//! which one matched is only worked out for the reason of a block.

use regex::{Regex, RegexSet, RegexSetBuilder};

use crate::config::{
    ConfigError, DENY_REGEX_DFA_SIZE_LIMIT, DENY_REGEX_SIZE_LIMIT, Location, compile_deny_regex,
};

/// The compiled deny list.
#[derive(Debug)]
pub(crate) struct DenyList {
    set: RegexSet,
    /// Each pattern with where it came from (`deny[0]`, `--deny[1]`).
    patterns: Vec<(String, Regex)>,
}

impl DenyList {
    /// Compiles the config's patterns and the command line's (`--deny`), checking each
    /// against the size limits; `origin` names the config file in errors.
    pub(crate) fn new(
        config: &[String],
        extra: &[String],
        origin: &str,
    ) -> Result<Self, ConfigError> {
        let mut patterns = Vec::with_capacity(config.len() + extra.len());
        for (list, file, sources) in [("deny", origin, config), ("--deny", "command line", extra)] {
            for (i, source) in sources.iter().enumerate() {
                let regex = compile_deny_regex(source).map_err(|why| ConfigError::Invalid {
                    location: Location {
                        file: file.to_string(),
                        line: None,
                        column: None,
                    },
                    key: format!("{list}[{i}]"),
                    message: format!("{source:?}: {why}"),
                    hint: "fix or remove the pattern; toolwall will not start with a deny rule it cannot apply",
                })?;
                patterns.push((format!("{list}[{i}]"), regex));
            }
        }
        let set = RegexSetBuilder::new(patterns.iter().map(|(_, r)| r.as_str()))
            .size_limit(DENY_REGEX_SIZE_LIMIT.saturating_mul(patterns.len().max(1)))
            .dfa_size_limit(DENY_REGEX_DFA_SIZE_LIMIT.saturating_mul(4))
            .build()
            .map_err(|e| ConfigError::Invalid {
                location: Location {
                    file: origin.to_string(),
                    line: None,
                    column: None,
                },
                key: "deny".to_string(),
                message: format!("the deny patterns together are too large: {e}"),
                hint: "merge or simplify patterns",
            })?;
        Ok(DenyList { set, patterns })
    }

    /// `None` if `tool` matches no pattern, else the reason naming the first one that does.
    pub(crate) fn check(&self, tool: &str) -> Option<String> {
        if self.patterns.is_empty() || !self.set.is_match(tool) {
            return None;
        }
        self.patterns
            .iter()
            .find(|(_, regex)| regex.is_match(tool))
            .map(|(origin, regex)| {
                format!(
                    "tool name {tool:?} matches deny regex {origin} {:?}",
                    regex.as_str()
                )
            })
    }
}
