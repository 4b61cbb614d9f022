//! Compiling the tests of `argument_rules` conditions, shared by the config's validation
//! (which reports the file and line) and the policy engine (`policy/arguments.rs`).

use globset::{GlobBuilder, GlobMatcher};
use regex::Regex;

use super::deny_regex::compile_deny_regex;
use super::types::{ArgumentCondition, NumberRange};

/// One condition's test, compiled.
#[derive(Debug)]
pub(crate) enum ArgumentTest {
    /// The pattern as written and its matcher.
    Glob(String, GlobMatcher),
    /// A regex on a string value.
    Regex(Regex),
    /// A normalized absolute directory.
    PathPrefix(String),
    /// Bounds of a number.
    Range(NumberRange),
    /// Whether the pointer must reach a value.
    Present(bool),
}

/// One condition compiled, or why it cannot be.
pub(crate) fn compile_condition(c: &ArgumentCondition) -> Result<ArgumentTest, String> {
    if !(c.pointer.is_empty() || c.pointer.starts_with('/')) {
        return Err(format!(
            "pointer {:?} is not a JSON pointer: it starts with `/` (`/path`, `/options/mode`), or is empty for the whole arguments",
            c.pointer
        ));
    }
    let tests = [
        c.glob.is_some(),
        c.regex.is_some(),
        c.path_prefix.is_some(),
        c.range.is_some(),
        c.present.is_some(),
    ];
    if tests.iter().filter(|t| **t).count() != 1 {
        return Err(
            "a condition has exactly one test: glob, regex, path_prefix, range or present".into(),
        );
    }
    let test = if let Some(glob) = &c.glob {
        let matcher = GlobBuilder::new(glob)
            .literal_separator(true)
            .build()
            .map_err(|e| format!("glob {glob:?}: {e}"))?
            .compile_matcher();
        ArgumentTest::Glob(glob.clone(), matcher)
    } else if let Some(regex) = &c.regex {
        ArgumentTest::Regex(compile_deny_regex(regex).map_err(|e| format!("regex {regex:?}: {e}"))?)
    } else if let Some(prefix) = &c.path_prefix {
        let clean = normalized_path(prefix)
            .filter(|n| n == prefix || n.as_str() == prefix.trim_end_matches('/'))
            .ok_or_else(|| {
                format!(
                    "path_prefix {prefix:?} must be an absolute path without `.`, `..` or `//` (write it as the kernel resolves it)"
                )
            })?;
        ArgumentTest::PathPrefix(clean)
    } else if let Some(range) = c.range {
        let finite = |b: Option<f64>| b.is_none_or(f64::is_finite);
        if !(finite(range.min) && finite(range.max)) {
            return Err("range bounds must be finite numbers".into());
        }
        if let (Some(lo), Some(hi)) = (range.min, range.max)
            && lo > hi
        {
            return Err(format!(
                "range min {lo} is above max {hi}; nothing would hold"
            ));
        }
        ArgumentTest::Range(range)
    } else {
        ArgumentTest::Present(c.present.unwrap_or(true))
    };
    Ok(test)
}

/// `path` with `.`, `..` and repeated `/` resolved, as the kernel would walk it without
/// symlinks; `None` unless it is absolute. `..` at the root stays at the root.
pub(crate) fn normalized_path(path: &str) -> Option<String> {
    let rest = path.strip_prefix('/')?;
    let mut parts: Vec<&str> = Vec::new();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    Some(format!("/{}", parts.join("/")))
}
