//! Server and tool rules (`allowed_servers`/`denied_servers`, `allowed_tools`/`denied_tools`)
//! and how they combine.
//!
//! The seed checks deny rules first, yet its own example pairs `denied_servers: [{id: "*"}]`
//! with an allowlist and means "deny everything not explicitly allowed". toolwall resolves
//! that by specificity: of all matching rules, the most specific decides — a rule pinned to a
//! `content_hash` beats one that is not, then more literal characters in the tool glob win,
//! then more in the server glob — and a tie goes to the deny rule. So `*` denies act as
//! defaults, an exact allow can carve out an exception from them, and an exact deny always
//! beats a wildcard allow. The `deny:` regexes are not part of this: they always block.

use std::cmp::Ordering;

use super::glob::Glob;
use crate::config::{ListPolicy, ServerRule, ToolRule};

/// How specific a rule is; compared lexicographically.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Specificity {
    pinned_to_hash: bool,
    tool_literals: usize,
    server_literals: usize,
}

/// A compiled server rule with its place in the config (for reasons).
#[derive(Debug)]
struct CompiledServerRule {
    index: usize,
    id: Glob,
}

/// `server_policy` with its two lists.
#[derive(Debug)]
pub(crate) struct ServerRules {
    policy: ListPolicy,
    allowed: Vec<CompiledServerRule>,
    denied: Vec<CompiledServerRule>,
}

impl ServerRules {
    /// Compiles the config's server rules.
    pub(crate) fn new(policy: ListPolicy, allowed: &[ServerRule], denied: &[ServerRule]) -> Self {
        let compile = |rules: &[ServerRule]| {
            rules
                .iter()
                .enumerate()
                .map(|(index, r)| CompiledServerRule {
                    index,
                    id: Glob::new(&r.id),
                })
                .collect()
        };
        ServerRules {
            policy,
            allowed: compile(allowed),
            denied: compile(denied),
        }
    }

    /// `None` if `server_id` passes, else why it is blocked.
    pub(crate) fn check(&self, server_id: &str) -> Option<String> {
        let best = |rules| best_server_rule(rules, server_id);
        let allow = best(&self.allowed);
        if let Some(deny) = best(&self.denied)
            && allow.is_none_or(|a| a.id.literals() <= deny.id.literals())
        {
            return Some(format!(
                "server {server_id:?} denied by denied_servers[{}] ({:?})",
                deny.index,
                deny.id.as_str()
            ));
        }
        if self.policy == ListPolicy::Allowlist && allow.is_none() {
            return Some(format!(
                "server {server_id:?} is not in allowed_servers (server_policy: allowlist)"
            ));
        }
        None
    }
}

/// A compiled tool rule with its place in the config.
#[derive(Debug)]
struct CompiledToolRule {
    index: usize,
    server: Glob,
    tool: Glob,
    content_hash: Option<String>,
}

impl CompiledToolRule {
    fn matches(&self, server_id: &str, tool: &str, hash: &str) -> bool {
        self.content_hash.as_deref().is_none_or(|h| h == hash)
            && self.tool.matches(tool)
            && self.server.matches(server_id)
    }

    fn specificity(&self) -> Specificity {
        Specificity {
            pinned_to_hash: self.content_hash.is_some(),
            tool_literals: self.tool.literals(),
            server_literals: self.server.literals(),
        }
    }

    fn describe(&self, list: &str) -> String {
        format!(
            "{list}[{}] (server {:?}, tool {:?}{})",
            self.index,
            self.server.as_str(),
            self.tool.as_str(),
            self.content_hash
                .as_deref()
                .map(|h| format!(", content_hash {h}"))
                .unwrap_or_default()
        )
    }
}

/// `tool_policy` with its two lists.
#[derive(Debug)]
pub(crate) struct ToolRules {
    policy: ListPolicy,
    allowed: Vec<CompiledToolRule>,
    denied: Vec<CompiledToolRule>,
}

impl ToolRules {
    /// Compiles the config's tool rules.
    pub(crate) fn new(policy: ListPolicy, allowed: &[ToolRule], denied: &[ToolRule]) -> Self {
        let compile = |rules: &[ToolRule]| {
            rules
                .iter()
                .enumerate()
                .map(|(index, r)| CompiledToolRule {
                    index,
                    server: Glob::new(&r.server),
                    tool: Glob::new(&r.tool),
                    content_hash: r.content_hash.as_ref().map(|h| h.to_ascii_lowercase()),
                })
                .collect()
        };
        ToolRules {
            policy,
            allowed: compile(allowed),
            denied: compile(denied),
        }
    }

    /// `None` if `tool` (with definition `hash`, empty if unknown) on `server_id` passes,
    /// else why it is blocked.
    pub(crate) fn check(&self, server_id: &str, tool: &str, hash: &str) -> Option<String> {
        let best = |rules| best_tool_rule(rules, server_id, tool, hash);
        let allow = best(&self.allowed);
        if let Some((deny, deny_spec)) = best(&self.denied)
            && allow.as_ref().is_none_or(|(_, a)| *a <= deny_spec)
        {
            return Some(format!("tool denied by {}", deny.describe("denied_tools")));
        }
        if self.policy == ListPolicy::Allowlist && allow.is_none() {
            return Some(format!(
                "tool {tool:?} of server {server_id:?} matches no allowed_tools rule (tool_policy: allowlist)"
            ));
        }
        None
    }
}

impl ToolRules {
    /// Why a `denied_tools` rule blocks `tool` on `server_id` (empty when unknown), if one
    /// does and no allowed rule is more specific; the list policy is not applied (a name
    /// nobody registered is decided by `fail_closed`, not by an allowlist).
    pub(crate) fn denied(&self, server_id: &str, tool: &str) -> Option<String> {
        let allow = best_tool_rule(&self.allowed, server_id, tool, "");
        let (deny, deny_spec) = best_tool_rule(&self.denied, server_id, tool, "")?;
        allow
            .as_ref()
            .is_none_or(|(_, a)| *a <= deny_spec)
            .then(|| format!("tool denied by {}", deny.describe("denied_tools")))
    }
}

/// The most specific matching server rule (the first in the file among equals).
fn best_server_rule<'r>(
    rules: &'r [CompiledServerRule],
    server_id: &str,
) -> Option<&'r CompiledServerRule> {
    rules
        .iter()
        .filter(|r| r.id.matches(server_id))
        // max_by keeps the last of equal maxima; comparing indexes reversed keeps the first.
        .max_by(|a, b| {
            a.id.literals()
                .cmp(&b.id.literals())
                .then(b.index.cmp(&a.index))
        })
}

/// The most specific matching tool rule (the first in the file among equals).
fn best_tool_rule<'r>(
    rules: &'r [CompiledToolRule],
    server_id: &str,
    tool: &str,
    hash: &str,
) -> Option<(&'r CompiledToolRule, Specificity)> {
    rules
        .iter()
        .filter(|r| r.matches(server_id, tool, hash))
        .max_by(|a, b| match a.specificity().cmp(&b.specificity()) {
            Ordering::Equal => b.index.cmp(&a.index),
            other => other,
        })
        .map(|r| (r, r.specificity()))
}
