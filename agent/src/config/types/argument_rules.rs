//! `sandbox.mcp.argument_rules[]`: rules on a call's arguments (compiled by
//! `config/arguments.rs`, judged by `policy/arguments.rs`).

use serde::{Deserialize, Serialize};

use super::defaults::star;

/// `argument_rules[]`: which calls (server and tool globs), when (every condition holds), and
/// what then happens.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ArgumentRule {
    /// A name for the rule, given in the reason of its decisions (default: its position).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Server id glob.
    #[serde(default = "star")]
    pub server: String,
    /// Tool name glob.
    #[serde(default = "star")]
    pub tool: String,
    /// Conditions on the arguments, all of which must hold (at least one).
    pub when: Vec<ArgumentCondition>,
    /// What a match does.
    pub action: ArgumentAction,
    /// Said in the decision's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One condition: a JSON pointer into `arguments` and one test of the value there.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ArgumentCondition {
    /// RFC 6901 pointer (`/path`, `/options/mode`, `/files/0`); a `*` segment stands for
    /// every element or member (`/files/*`: a block or redact rule holds if any does, an allow
    /// rule only if all do).
    pub pointer: String,
    /// A glob on a string value (`*` stays within one `/` segment, `**` crosses them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub glob: Option<String>,
    /// A regex (the `regex` crate, unanchored) on a string value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// An absolute, symlink-free directory: holds when the string value, an absolute path
    /// with its `.` and `..` resolved, is it or lies below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Bounds (inclusive) of a number value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<NumberRange>,
    /// Whether the pointer must reach a value (`true`) or must not (`false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
}

/// `range:` of a condition; either bound may be left out.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NumberRange {
    /// Smallest value that holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// Largest value that holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
}

/// What an argument rule does to a call it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ArgumentAction {
    /// The call runs; later argument rules are not asked.
    Allow,
    /// The call is refused, with the rule's reason.
    Block,
    /// The call runs; the record keeps `[toolwall:redacted]` instead of the values the
    /// rule's conditions point at.
    Redact,
    /// The call waits for a person to approve or deny it (`approval:`, `approval.rs`);
    /// denied when no one answers in time, and refused where no one can be asked.
    Ask,
}
