//! `sandbox.mcp.definition_checks:` and `sandbox.mcp.result_inspection:`: what servers'
//! definitions and answers may say (poisoning and shadowing, secrets and the owner's
//! patterns).

use serde::{Deserialize, Serialize};

use super::defaults::star;
use crate::decision::ResultAction;

/// `definition_checks:` — poisoned and shadowing tool definitions.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DefinitionChecksConfig {
    /// Hidden instructions in a definition: invisible characters, terminal escapes,
    /// instruction-like text, credential files, other servers' tools named.
    #[serde(default = "alert")]
    pub poisoning: DefinitionAction,
    /// A tool named like another server's tool.
    #[serde(default = "alert")]
    pub shadowing: DefinitionAction,
}

impl Default for DefinitionChecksConfig {
    fn default() -> Self {
        DefinitionChecksConfig {
            poisoning: DefinitionAction::Alert,
            shadowing: DefinitionAction::Alert,
        }
    }
}

fn alert() -> DefinitionAction {
    DefinitionAction::Alert
}

/// What a definition check's finding does; ordered weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DefinitionAction {
    /// Not checked.
    Off,
    /// Recorded in the listing's `mcp_tool_seen` reason; the tool stays.
    Alert,
    /// The tool is hidden from the listing and its calls refused.
    Hide,
    /// Every tool of the server is hidden and its calls refused, until the daemon restarts.
    BlockServer,
}

impl DefinitionAction {
    /// The YAML spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DefinitionAction::Off => "off",
            DefinitionAction::Alert => "alert",
            DefinitionAction::Hide => "hide",
            DefinitionAction::BlockServer => "block_server",
        }
    }
}

/// `result_inspection:` — detectors run on every message a server sends toward the client.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResultInspectionConfig {
    /// The built-in secret detectors (gitleaks' rule set, `policy/secrets/`).
    #[serde(default)]
    pub secrets: ResultAction,
    /// Regexes of the owner's own.
    #[serde(default)]
    pub patterns: Vec<ResultPattern>,
    /// Tools whose results some or all rules leave alone (a presigned-URL tool).
    #[serde(default)]
    pub exempt: Vec<ResultExemption>,
}

impl Default for ResultInspectionConfig {
    fn default() -> Self {
        ResultInspectionConfig {
            secrets: ResultAction::Redact,
            patterns: Vec::new(),
            exempt: Vec::new(),
        }
    }
}

/// `result_inspection.patterns[]`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResultPattern {
    /// Named in findings and in `[toolwall:redacted:NAME]`.
    pub name: String,
    /// A regex (the `regex` crate, unanchored) on every string of the message.
    pub regex: String,
    /// What a match does.
    #[serde(default)]
    pub action: ResultAction,
}

/// `result_inspection.exempt[]`: results of these tools are not inspected by these rules.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResultExemption {
    /// Server id glob.
    #[serde(default = "star")]
    pub server: String,
    /// Tool name glob.
    pub tool: String,
    /// Rule ids (gitleaks ids, pattern names) exempted; empty: every rule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
}
