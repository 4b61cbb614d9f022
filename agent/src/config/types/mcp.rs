//! `sandbox.mcp:`: the MCP policy's servers, server and tool rules, version pinning and rate
//! limits (its argument rules, content checks and approval have files of their own).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::defaults::{star, yes};
use super::{ApprovalConfig, ArgumentRule, DefinitionChecksConfig, ResultInspectionConfig};
use crate::config::ServerDecl;

/// `sandbox:`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SandboxConfig {
    /// `sandbox.mcp:` — the MCP policy.
    #[serde(default)]
    pub mcp: McpConfig,
}

/// `sandbox.mcp:` — servers, server and tool rules, pinning and rate limits.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct McpConfig {
    /// `false` is audit mode: every decision allows, with the reason it would have blocked.
    #[serde(default = "yes")]
    pub enforce_policy: bool,
    /// Block tools that are not in the registry and servers that are not declared.
    #[serde(default)]
    pub fail_closed: bool,
    /// Declared MCP servers.
    #[serde(default)]
    pub servers: Vec<ServerDecl>,
    /// How `allowed_servers` is used.
    #[serde(default)]
    pub server_policy: ListPolicy,
    /// Servers allowed (required under `server_policy: allowlist`).
    #[serde(default)]
    pub allowed_servers: Vec<ServerRule>,
    /// Servers denied.
    #[serde(default)]
    pub denied_servers: Vec<ServerRule>,
    /// How `allowed_tools` is used.
    #[serde(default)]
    pub tool_policy: ListPolicy,
    /// Tools allowed (required under `tool_policy: allowlist`).
    #[serde(default)]
    pub allowed_tools: Vec<ToolRule>,
    /// Tools denied.
    #[serde(default)]
    pub denied_tools: Vec<ToolRule>,
    /// Regexes on tool names: a match always blocks.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Extra agent-side name forms, e.g. `"{server}.{tool}"`; Claude Code's
    /// `mcp__{server}__{tool}`, Gemini CLI's `mcp_{server}_{tool}` and OpenCode's
    /// `{server}_{tool}` are always understood.
    #[serde(default)]
    pub name_patterns: Vec<String>,
    /// Tools whose arguments name the call they make, `{"name": TOOL, "arguments": {…}}`,
    /// judged and recorded as that call; Qwen Code's `tool_call` is always one.
    #[serde(default)]
    pub dispatchers: Vec<String>,
    /// Rug-pull protection.
    #[serde(default)]
    pub version_pinning: VersionPinningConfig,
    /// Per-server call budgets.
    #[serde(default)]
    pub rate_limits: RateLimitsConfig,
    /// Rules on a call's `arguments`, judged at call time after the name rules allowed it
    /// (`policy/arguments.rs`); first match decides.
    #[serde(default)]
    pub argument_rules: Vec<ArgumentRule>,
    /// What servers' answers may carry to the client: secrets, configured patterns
    /// (`policy/results.rs`).
    #[serde(default)]
    pub result_inspection: ResultInspectionConfig,
    /// What listed definitions may say to the model (`policy/definitions.rs`).
    #[serde(default)]
    pub definition_checks: DefinitionChecksConfig,
    /// How calls an argument rule asks about (`action: ask`) are put to a person.
    #[serde(default)]
    pub approval: ApprovalConfig,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            enforce_policy: true,
            fail_closed: false,
            servers: Vec::new(),
            server_policy: ListPolicy::None,
            allowed_servers: Vec::new(),
            denied_servers: Vec::new(),
            tool_policy: ListPolicy::None,
            allowed_tools: Vec::new(),
            denied_tools: Vec::new(),
            deny: Vec::new(),
            name_patterns: Vec::new(),
            dispatchers: Vec::new(),
            version_pinning: VersionPinningConfig::default(),
            rate_limits: RateLimitsConfig::default(),
            argument_rules: Vec::new(),
            result_inspection: ResultInspectionConfig::default(),
            definition_checks: DefinitionChecksConfig::default(),
            approval: ApprovalConfig::default(),
        }
    }
}

/// How an allow list is used (`server_policy`, `tool_policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ListPolicy {
    /// Only what the allow list matches passes; deny rules still apply.
    Allowlist,
    /// Everything passes unless a deny rule matches.
    Denylist,
    /// Same as `denylist` (deny rules always apply, so a typo in the policy name cannot
    /// switch them off).
    #[default]
    None,
}

impl ListPolicy {
    /// The YAML spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ListPolicy::Allowlist => "allowlist",
            ListPolicy::Denylist => "denylist",
            ListPolicy::None => "none",
        }
    }
}

/// A server rule: an id or a glob (`*`, `?`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServerRule {
    /// Server id glob.
    pub id: String,
}

/// A tool rule: server glob, tool glob and optionally the exact definition hash.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolRule {
    /// Server id glob (`*` for any).
    #[serde(default = "star")]
    pub server: String,
    /// Tool name glob.
    pub tool: String,
    /// SHA-256 hex of the tool definition; the rule only matches that exact definition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_hash: Option<String>,
}

/// `version_pinning:`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VersionPinningConfig {
    /// Check tool definitions against pinned hashes.
    #[serde(default)]
    pub enabled: bool,
    /// What a changed definition (or a tool new since pinning) does.
    #[serde(default)]
    pub on_change: OnChange,
    /// Pin the first definition seen; without it only explicitly trusted tools pass.
    #[serde(default = "yes")]
    pub auto_trust_first: bool,
}

impl Default for VersionPinningConfig {
    fn default() -> Self {
        VersionPinningConfig {
            enabled: false,
            on_change: OnChange::Block,
            auto_trust_first: true,
        }
    }
}

/// `version_pinning.on_change`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnChange {
    /// Block (and hide) the tool.
    #[default]
    Block,
    /// Allow it, with a reason saying it changed (layers record a `mcp_tool_changed`).
    Alert,
}

/// `rate_limits:`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimitsConfig {
    /// Apply the budgets.
    #[serde(default)]
    pub enabled: bool,
    /// Sustained calls per minute per server.
    #[serde(default = "default_rpm")]
    pub default_rpm: u32,
    /// Calls a server may take at once before the per-minute rate applies.
    #[serde(default = "default_burst")]
    pub default_burst: u32,
    /// Budgets of particular servers, by id.
    #[serde(default)]
    pub per_server: BTreeMap<String, ServerRateLimit>,
}

impl Default for RateLimitsConfig {
    fn default() -> Self {
        RateLimitsConfig {
            enabled: false,
            default_rpm: default_rpm(),
            default_burst: default_burst(),
            per_server: BTreeMap::new(),
        }
    }
}

/// `rate_limits.per_server.<id>:`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServerRateLimit {
    /// Sustained calls per minute.
    pub calls_per_minute: u32,
    /// Burst; `rate_limits.default_burst` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

fn default_rpm() -> u32 {
    60
}

fn default_burst() -> u32 {
    10
}
