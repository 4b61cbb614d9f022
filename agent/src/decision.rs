//! The contract between the enforcement layers and the policy engine.
//!
//! The LLM interceptor, the stdio shim and the MCP filter proxy all ask the same question —
//! "may this tool be called / shown?" — through [`Gate`]; `policy::Policy` answers it with the
//! registry, the configured rules, version pinning and rate limits. Keeping the question this
//! narrow lets each layer be tested with a tiny gate, and the engine without any layer.

use serde::{Deserialize, Serialize};

/// What happens to a tool call or a listed tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Let it through (and record it).
    Allow,
    /// Stop it: strip it from the LLM response, refuse the `tools/call`, hide it from `tools/list`.
    Block,
}

impl Action {
    /// `"allow"` or `"block"`, as stored in events.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Block => "block",
        }
    }
}

/// What the result rules do with a server's message that holds what they look for
/// (`sandbox.mcp.result_inspection`, `policy/results.rs`); ordered from weakest to strongest.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ResultAction {
    /// Not looked for.
    Off,
    /// Recorded; the message passes unchanged.
    Alert,
    /// Recorded; the message passes with each finding replaced by `[toolwall:redacted:RULE]`.
    #[default]
    Redact,
    /// Recorded; the client gets an error saying why instead of the message.
    Withhold,
}

impl ResultAction {
    /// The YAML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ResultAction::Off => "off",
            ResultAction::Alert => "alert",
            ResultAction::Redact => "redact",
            ResultAction::Withhold => "withhold",
        }
    }
}

/// One thing a result rule found in a server's message: where, never the value itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultFinding {
    /// The rule: a gitleaks rule id (`aws-access-token`) or a configured pattern's name.
    pub rule: String,
    /// `secret` (the built-in rule set) or `pattern` (a configured regex).
    pub kind: String,
    /// RFC 6901 pointer to the string in the message that holds it (`/result/content/0/text`).
    pub pointer: String,
    /// Byte range in that string (decoded).
    pub start: usize,
    /// End of the byte range.
    pub end: usize,
    /// Found in the object key the pointer's last segment stands for (written
    /// `[toolwall:redacted]` there: the record never names a key that holds a finding).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_key: bool,
    /// What this rule does.
    pub action: ResultAction,
}

/// The result rules' answer for one server message that holds findings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResultVerdict {
    /// The strongest action of the findings (what happens to the message).
    pub action: ResultAction,
    /// The findings, at most [`ResultVerdict::MAX_FINDINGS`] of them.
    pub findings: Vec<ResultFinding>,
    /// How many there were in all.
    pub total: usize,
    /// Under `redact`: the message to forward instead, each redacted finding replaced.
    pub redacted: Option<Vec<u8>>,
    /// Why, in words.
    pub reason: String,
    /// The message's own `id` holds a finding: a record must not keep it.
    pub id_holds_finding: bool,
}

impl ResultVerdict {
    /// Findings kept per message (the rest are counted in `total`): a result of a million
    /// keys must not make a record of a million entries.
    pub const MAX_FINDINGS: usize = 64;
}

/// The registry's view of the tool a decision was about, when it is a known MCP tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolIdentity {
    /// Server id as declared in the config (or given to the shim).
    pub server_id: String,
    /// `stdio`, `http` or `sse`.
    pub server_type: String,
    /// `host:port` for network servers, empty for stdio.
    pub server_addr: String,
    /// The tool's own name on its server (`get-sum`, not `mcp__everything__get-sum`).
    pub tool: String,
    /// SHA-256 (hex) of the canonical JSON of the tool definition; empty if never listed.
    pub tool_hash: String,
}

/// The answer to one question, with a reason a person can read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Allow or block.
    pub action: Action,
    /// Why, in words (e.g. `tool denied by rule deny[0] "^delete_"`); empty for a plain allow.
    pub reason: String,
    /// The registered tool, or `None` when the name is not a known MCP tool. An allowed call
    /// with no identity is "not MCP" (a native tool of the agent): layers record nothing for it.
    pub tool: Option<ToolIdentity>,
    /// JSON pointers into the call's `arguments` whose values the record must not keep (an
    /// argument rule's `action: redact`); the call itself runs unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redact: Vec<String>,
    /// An argument rule wants a person to decide (`action: ask`), and why. The decision is a
    /// block until someone approves: a layer that cannot ask refuses the call, so no layer
    /// lets an asked call through by not knowing about asking (`approval.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<String>,
}

impl Decision {
    /// A plain allow of a tool that is not a known MCP tool.
    pub fn not_mcp() -> Self {
        Decision {
            action: Action::Allow,
            reason: String::new(),
            tool: None,
            redact: Vec::new(),
            ask: None,
        }
    }

    /// Whether the call must be stopped.
    pub fn is_blocked(&self) -> bool {
        self.action == Action::Block
    }

    /// The same tool, blocked for `reason`: what a gate layered over the policy answers when
    /// it refuses what the policy allowed.
    pub fn overruled(self, reason: String) -> Self {
        Decision {
            action: Action::Block,
            reason,
            tool: self.tool,
            redact: Vec::new(),
            ask: None,
        }
    }
}

/// Where in a tool call's life a layer sees it. A call the LLM layer saw proposed and a shim
/// or filter proxy then runs is one call: it spends one unit of the server's rate budget, not
/// two (see `policy::RateLimiter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallStage {
    /// The model asked for the call (the LLM interceptor); it may never run.
    Proposed,
    /// The call is about to run (the stdio shim, the filter proxy).
    Executing,
    /// A second look at a call a layer already decided (the LLM layer's backstop over what it
    /// forwards, `llm/backstop.rs`): judged by the same rules, spends no rate-limit budget.
    Inspected,
}

impl CallStage {
    /// The stage that spends rate-limit budget, if this one does.
    pub fn spends(self) -> Option<CallStage> {
        (self != CallStage::Inspected).then_some(self)
    }
}

/// A tool call as a layer sees it.
#[derive(Clone, Copy, Debug)]
pub struct CallQuery<'a> {
    /// The server, when the layer knows it (the shim and the filter proxy do; the LLM layer
    /// does not and passes `None`).
    pub server_id: Option<&'a str>,
    /// The name as the caller wrote it: `get-sum`, `mcp__everything__get-sum`, or Codex's
    /// `get_sum` with a namespace.
    pub name: &'a str,
    /// Codex's namespace for a function (`mcp__everything`), if any.
    pub namespace: Option<&'a str>,
    /// Proposed by the model or about to run.
    pub stage: CallStage,
    /// The call's `arguments`, when the layer has them whole; `None` judges the name alone
    /// (argument rules are then not asked: a layer that can get them first asks
    /// [`Gate::needs_arguments`]).
    pub arguments: Option<&'a serde_json::Value>,
}

/// The policy engine as the layers see it. Implementations are shared across tasks and threads.
pub trait Gate: Send + Sync {
    /// A tool call about to happen. An allow spends the server's rate-limit budget.
    fn check_call(&self, call: &CallQuery<'_>) -> Decision;

    /// Whether rules on the arguments may judge this call (its `arguments` are ignored): a
    /// layer that sees arguments arrive in pieces holds such a call until they are whole and
    /// then asks [`Gate::check_call`] with them. No default: a gate that wraps another must
    /// pass the question on, or streamed calls would go unjudged.
    fn needs_arguments(&self, call: &CallQuery<'_>) -> bool;

    /// The call a dispatcher call makes (`tool_call {"name", "arguments"}`: the tool it names
    /// and the arguments it passes), when `name` is a dispatcher's: what a record of it holds.
    /// No default, as above.
    fn dispatched(
        &self,
        name: &str,
        arguments: &serde_json::Value,
    ) -> Option<(String, serde_json::Value)>;

    /// The URL of the network server the configuration declares as `server_id`, if any: a
    /// provider-hosted MCP server is taken for that server only when it is at this URL. No
    /// default, as above.
    fn declared_url(&self, server_id: &str) -> Option<String>;

    /// A message `server_id` sends toward the client (a tool's result, a resource, a
    /// notification; whole JSON-RPC text): what the result rules find in it, or `None` when
    /// nothing (it passes as it is). `tool` is the tool whose `tools/call` it answers, when
    /// the layer knows it (per-tool exemptions apply only then). No default, as above.
    fn inspect_result(
        &self,
        server_id: &str,
        tool: Option<&str>,
        message: &[u8],
    ) -> Option<ResultVerdict>;

    /// A tool definition (`tools/list` entry, as JSON) that `server_id` offers: registers it
    /// (hash, version pinning) and says whether clients may see it.
    fn check_listed(
        &self,
        server_id: &str,
        server_type: &str,
        tool: &serde_json::Value,
    ) -> Decision;

    /// A whole `tools/list` result (one page) of `server_id`: like [`Gate::check_listed`] for
    /// each tool, in order. A gate that pins versions treats it as the server's complete set on
    /// first sight, so a tool appearing later is recognised as drift — prefer it whenever the
    /// layer has the whole listing.
    fn check_listed_all(
        &self,
        server_id: &str,
        server_type: &str,
        tools: &[serde_json::Value],
    ) -> Vec<Decision> {
        tools
            .iter()
            .map(|tool| self.check_listed(server_id, server_type, tool))
            .collect()
    }
}
