//! Compiling deny-list regexes the same way for the config file and
//! the `--deny` flags of the shim and filter proxy.
//!
//! The `regex` crate matches in time linear in the input (finite automata, no backtracking),
//! so catastrophic backtracking cannot happen whatever the pattern. What a pattern *can* do is
//! compile into a huge automaton (`\w{1000}` with Unicode classes); the size limits below turn
//! that into a start-up error instead of memory and CPU spent on every decision.

use regex::{Regex, RegexBuilder};

/// Most bytes one compiled deny pattern may take (the `regex` default is 10 MiB, far more
/// than any tool-name pattern needs).
pub(crate) const DENY_REGEX_SIZE_LIMIT: usize = 256 * 1024;

/// Most bytes of lazy-DFA cache per pattern.
pub(crate) const DENY_REGEX_DFA_SIZE_LIMIT: usize = 1024 * 1024;

/// Longest accepted pattern text.
pub(crate) const DENY_REGEX_MAX_LEN: usize = 1024;

/// Compiles one deny pattern, or says in words why it cannot be used.
pub(crate) fn compile_deny_regex(pattern: &str) -> Result<Regex, String> {
    if pattern.is_empty() {
        return Err("empty pattern (it would match every tool name)".to_string());
    }
    if pattern.len() > DENY_REGEX_MAX_LEN {
        return Err(format!(
            "pattern is {} bytes long; the limit is {DENY_REGEX_MAX_LEN}",
            pattern.len()
        ));
    }
    RegexBuilder::new(pattern)
        .size_limit(DENY_REGEX_SIZE_LIMIT)
        .dfa_size_limit(DENY_REGEX_DFA_SIZE_LIMIT)
        .build()
        .map_err(|error| match error {
            regex::Error::CompiledTooBig(limit) => format!(
                "pattern compiles to more than {limit} bytes (too big to evaluate on every \
                 call); simplify it, e.g. lower repetition counts or use ASCII classes like \
                 [a-z0-9_] instead of \\w"
            ),
            other => format!("invalid regex: {other}"),
        })
}
