//! A shim's own `--deny` patterns on top of the daemon's policy: a gate that can only take
//! more away than the policy it wraps.

use std::sync::Arc;

use regex::Regex;

use crate::decision::{CallQuery, Decision, Gate};

/// The daemon's policy plus a shim's `--deny` patterns: they can only take more away.
pub(super) struct ExtraDeny {
    inner: Arc<dyn Gate>,
    patterns: Vec<(String, Regex)>,
}

impl ExtraDeny {
    pub(super) fn wrap(inner: Arc<dyn Gate>, patterns: &[String]) -> anyhow::Result<Arc<dyn Gate>> {
        if patterns.is_empty() {
            return Ok(inner);
        }
        let patterns = crate::mcp::enforce::deny_patterns(patterns)?
            .into_iter()
            .map(|p| {
                crate::config::compile_deny_regex(&p)
                    .map(|r| (p.clone(), r))
                    .map_err(|why| anyhow::anyhow!("--deny {p:?}: {why}"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Arc::new(ExtraDeny { inner, patterns }))
    }

    fn denies(&self, name: &str, decision: Decision) -> Decision {
        match self.patterns.iter().find(|(_, r)| r.is_match(name)) {
            // An asked call is a block until approved: the shim's own deny holds first.
            Some((pattern, _)) if !decision.is_blocked() || decision.ask.is_some() => {
                decision.overruled(format!("tool denied by the shim's --deny {pattern:?}"))
            }
            _ => decision,
        }
    }
}

impl Gate for ExtraDeny {
    fn needs_arguments(&self, call: &CallQuery<'_>) -> bool {
        self.inner.needs_arguments(call)
    }

    fn dispatched(
        &self,
        name: &str,
        arguments: &serde_json::Value,
    ) -> Option<(String, serde_json::Value)> {
        self.inner.dispatched(name, arguments)
    }

    fn declared_url(&self, server_id: &str) -> Option<String> {
        self.inner.declared_url(server_id)
    }

    fn inspect_result(
        &self,
        server_id: &str,
        tool: Option<&str>,
        message: &[u8],
    ) -> Option<crate::decision::ResultVerdict> {
        self.inner.inspect_result(server_id, tool, message)
    }

    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
        self.denies(call.name, self.inner.check_call(call))
    }

    fn check_listed(
        &self,
        server_id: &str,
        server_type: &str,
        tool: &serde_json::Value,
    ) -> Decision {
        let name = tool["name"].as_str().unwrap_or_default();
        self.denies(name, self.inner.check_listed(server_id, server_type, tool))
    }

    fn check_listed_all(
        &self,
        server_id: &str,
        server_type: &str,
        tools: &[serde_json::Value],
    ) -> Vec<Decision> {
        self.inner
            .check_listed_all(server_id, server_type, tools)
            .into_iter()
            .zip(tools)
            .map(|(d, tool)| self.denies(tool["name"].as_str().unwrap_or_default(), d))
            .collect()
    }
}
