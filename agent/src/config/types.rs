//! The configuration schema: one struct per YAML section, with the defaults of every key.
//!
//! Every struct denies unknown fields: a misspelt key in a deny rule must stop start-up, not
//! silently turn the rule off. Defaults live here (not in the embedded YAML only) so a file
//! that leaves a section out gets the same behaviour as the embedded default.

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

use super::servers::ServerDecl;
use crate::decision::ResultAction;

/// The whole configuration file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    /// `sandbox:` — holds `mcp:`, the seed's policy section (kept so seed files carry over).
    #[serde(default)]
    pub sandbox: SandboxConfig,
    /// `proxy:` — the LLM interceptor proxy.
    #[serde(default)]
    pub proxy: ProxyConfig,
    /// `store:` — the event and registry database.
    #[serde(default)]
    pub store: StoreConfig,
    /// `netmon:` — the kernel connect hooks.
    #[serde(default)]
    pub netmon: NetmonConfig,
    /// `api:` — the local query API.
    #[serde(default)]
    pub api: ApiConfig,
    /// `correlator:` — joining events of one call across layers.
    #[serde(default)]
    pub correlator: CorrelatorConfig,
    /// `interceptor:` — how the LLM response interceptor treats what it cannot parse.
    #[serde(default)]
    pub interceptor: InterceptorConfig,
    /// `exec:` — how `toolwall exec` starts agents.
    #[serde(default)]
    pub exec: ExecConfig,
    /// `telemetry:` — sending the record to a fleet's pipeline (`daemon/otlp/mod.rs`).
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// `policy:` — where the policy comes from besides this file (`config/bundle.rs`).
    #[serde(default)]
    pub policy: PolicySourceConfig,
    /// Where this configuration came from (a file path or the embedded default); not a key.
    #[serde(skip)]
    pub origin: String,
}

/// `policy:`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicySourceConfig {
    /// `policy.bundle:` — a signed policy pulled from a URL; none, this file's `sandbox:` is
    /// the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<BundleConfig>,
}

/// `policy.bundle:` — the daemon pulls a bundle (`toolwall policy sign`), verifies its
/// ed25519 signature and applies its `sandbox:` to every layer without a restart
/// (`daemon/bundle.rs`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BundleConfig {
    /// `https://` (or `http://`: the signature is what is trusted) URL of the bundle.
    pub url: String,
    /// The publisher's key, `ed25519:BASE64` as `toolwall policy keygen` writes it.
    pub public_key: String,
    /// Seconds between polls (with `If-None-Match`).
    #[serde(default = "default_poll_secs")]
    pub poll_secs: u64,
    /// PEM file of the CAs to trust for the bundle server instead of the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The oldest revision this host accepts, for a host with no bundle kept yet (a new
    /// install): a replayed older bundle, validly signed, must not be its first.
    #[serde(default)]
    pub min_revision: u64,
}

fn default_poll_secs() -> u64 {
    60
}

/// `telemetry:`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TelemetryConfig {
    /// `telemetry.otlp:` — OpenTelemetry export; none configured, nothing leaves the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp: Option<OtlpConfig>,
}

/// `telemetry.otlp:` — every stored event as an OTLP log record, every correlated call as a
/// span, read from the store behind a persisted cursor (at-least-once).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OtlpConfig {
    /// The collector: `http://host:4317` for grpc; for http/protobuf the base URL, to which
    /// `/v1/logs` and `/v1/traces` are added (as `OTEL_EXPORTER_OTLP_ENDPOINT` is read).
    pub endpoint: String,
    /// `grpc` or `http/protobuf`.
    #[serde(default)]
    pub protocol: OtlpProtocol,
    /// Sent with every export (gRPC metadata or HTTP headers), e.g. an API key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// `tls: {ca_file}` — a PEM file of the CAs to trust for an `https://` endpoint instead of
    /// the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<OtlpTls>,
    /// Which event types leave as log records (empty: all). Spans are made from the call
    /// events whatever this says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
    /// Export correlated calls as spans.
    #[serde(default = "yes")]
    pub spans: bool,
    /// Most events read and sent in one export.
    #[serde(default = "default_otlp_batch")]
    pub batch_size: usize,
    /// Milliseconds between looks at the store when it had nothing new.
    #[serde(default = "default_otlp_interval")]
    pub interval_ms: u64,
    /// Seconds one export may take before it counts as failed (and is sent again).
    #[serde(default = "default_otlp_timeout")]
    pub timeout_secs: u64,
}

/// `telemetry.otlp.protocol`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub(crate) enum OtlpProtocol {
    /// OTLP/gRPC (port 4317 by convention).
    #[default]
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP/HTTP with protobuf bodies (port 4318 by convention).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

impl OtlpProtocol {
    /// As written in the configuration.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OtlpProtocol::Grpc => "grpc",
            OtlpProtocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// `telemetry.otlp.tls`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OtlpTls {
    /// PEM file of the CA certificates to trust.
    pub ca_file: PathBuf,
}

fn default_otlp_batch() -> usize {
    512
}

fn default_otlp_interval() -> u64 {
    1000
}

fn default_otlp_timeout() -> u64 {
    10
}

/// `exec:`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecConfig {
    /// The user agents run as when `toolwall exec` is started by root without `--user` or
    /// `SUDO_USER` (an agent running as root could leave its session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

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
    /// `mcp__{server}__{tool}` is always understood.
    #[serde(default)]
    pub name_patterns: Vec<String>,
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

/// `approval:` — asking a person (`approval.rs`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApprovalConfig {
    /// Seconds a call waits for an answer; then it is denied.
    #[serde(default = "default_approval_timeout")]
    pub timeout_secs: u64,
    /// Calls that may wait at once; one more is denied at once (a flood of asks must not
    /// hold the daemon's memory or a person's attention without bound).
    #[serde(default = "default_max_pending")]
    pub max_pending: usize,
    /// Where each question is also POSTed (a chat bridge, a pager); the answer comes back
    /// through `toolwall approve|deny` or the API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookConfig>,
}

impl Default for ApprovalConfig {
    fn default() -> Self {
        ApprovalConfig {
            timeout_secs: default_approval_timeout(),
            max_pending: default_max_pending(),
            webhook: None,
        }
    }
}

fn default_approval_timeout() -> u64 {
    120
}

fn default_max_pending() -> usize {
    64
}

/// `approval.webhook:`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebhookConfig {
    /// `http://` or `https://` URL the question is POSTed to, as JSON.
    pub url: String,
    /// Headers sent with it (an `Authorization` the receiver wants).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
}

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

/// `proxy:` — the LLM interceptor proxy.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProxyConfig {
    /// What the proxy does.
    #[serde(default)]
    pub mode: ProxyMode,
    /// Where agents send their LLM API traffic.
    #[serde(default = "default_proxy_listen")]
    pub listen: SocketAddr,
    /// Upstream base URLs.
    #[serde(default)]
    pub providers: ProvidersConfig,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            mode: ProxyMode::Embedded,
            listen: default_proxy_listen(),
            providers: ProvidersConfig::default(),
        }
    }
}

/// `proxy.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ProxyMode {
    /// The daemon runs the proxy and enforces MCP policy in it.
    #[default]
    Embedded,
    /// The proxy only captures and enforces MCP tool calls (the seed's mode without DLP).
    McpOnly,
    /// No LLM proxy: the shim, filter proxy and kernel layers still run.
    Disabled,
}

impl ProxyMode {
    /// The YAML spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Embedded => "embedded",
            ProxyMode::McpOnly => "mcp-only",
            ProxyMode::Disabled => "disabled",
        }
    }
}

/// `proxy.providers:`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProvidersConfig {
    /// Anthropic API base URL.
    #[serde(default = "default_anthropic")]
    pub anthropic: String,
    /// OpenAI API base URL.
    #[serde(default = "default_openai")]
    pub openai: String,
}

impl Default for ProvidersConfig {
    fn default() -> Self {
        ProvidersConfig {
            anthropic: default_anthropic(),
            openai: default_openai(),
        }
    }
}

/// `store:`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StoreConfig {
    /// The SQLite database; see `config::default_store_path` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// What the layers do with an MCP tool call while the store cannot write (disk full,
    /// read-only): refuse it (`block`) or let it run while its events wait in memory (`queue`).
    #[serde(default)]
    pub on_failure: OnStoreFailure,
}

/// `store.on_failure`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OnStoreFailure {
    /// A call that cannot be recorded does not run.
    #[default]
    Block,
    /// Calls run; their events wait in memory until the store writes again.
    Queue,
}

/// `netmon:` — the eBPF connect hooks on the session cgroup.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NetmonConfig {
    /// Load the kernel layer (needs root and BPF; off or failing, the other layers still run).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Deny direct connections from the session to network MCP servers that must be reached
    /// through `toolwall mcp-proxy` (per-server `via_proxy` overrides this default).
    #[serde(default)]
    pub deny_direct: bool,
    /// Deny connections to the LLM providers except through the interceptor proxy.
    #[serde(default)]
    pub pin_llm_egress: bool,
    /// How often server and provider host names are re-resolved into the kernel maps.
    #[serde(default = "default_resolve_interval")]
    pub resolve_interval_secs: u64,
    /// Where the programs, their links and maps are pinned on bpffs, so that they outlive a
    /// daemon that dies (one daemon per directory).
    #[serde(default = "default_pin_dir")]
    pub pin_dir: PathBuf,
    /// How often each session is checked for a detached program or a process that left it.
    #[serde(default = "default_watch_interval")]
    pub watch_interval_ms: u64,
    /// DNS from sessions to resolvers other than the allowed ones.
    #[serde(default)]
    pub dns: DnsConfig,
}

/// `netmon.dns:` — DNS (port 53, UDP and TCP) from sessions to a resolver the host does not use
/// can carry data out or answer with addresses toolwall never resolved (issue 14).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DnsConfig {
    /// What the kernel does with DNS to any other resolver: `off` (nothing), `flag` (record
    /// it), `deny` (refuse it with EPERM and record it).
    #[serde(default)]
    pub other_resolvers: OtherResolvers,
    /// The resolvers DNS may go to unrecorded; empty: the `nameserver`s of /etc/resolv.conf.
    #[serde(default)]
    pub resolvers: Vec<std::net::IpAddr>,
}

/// `netmon.dns.other_resolvers`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OtherResolvers {
    /// Not watched.
    #[default]
    Off,
    /// Recorded.
    Flag,
    /// Refused and recorded.
    Deny,
}

fn default_pin_dir() -> PathBuf {
    PathBuf::from("/sys/fs/bpf/toolwall")
}

fn default_watch_interval() -> u64 {
    1000
}

impl Default for NetmonConfig {
    fn default() -> Self {
        NetmonConfig {
            enabled: true,
            deny_direct: false,
            pin_llm_egress: false,
            resolve_interval_secs: default_resolve_interval(),
            pin_dir: default_pin_dir(),
            watch_interval_ms: default_watch_interval(),
            dns: DnsConfig::default(),
        }
    }
}

/// `api:` — the local query API.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApiConfig {
    /// TCP listen address.
    #[serde(default = "default_api_listen")]
    pub listen: SocketAddr,
    /// Optional Unix socket path (permission-checked access instead of loopback TCP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: default_api_listen(),
            socket: None,
        }
    }
}

/// `correlator:`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CorrelatorConfig {
    /// How far apart (ms) events of different layers may be and still be one call.
    #[serde(default = "default_window_ms")]
    pub window_ms: u64,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        CorrelatorConfig {
            window_ms: default_window_ms(),
        }
    }
}

/// `interceptor:`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InterceptorConfig {
    /// What an LLM response the interceptor cannot parse does.
    #[serde(default)]
    pub on_malformed: OnMalformed,
    /// Most bytes of one streamed tool call held back while it is being decided.
    #[serde(default = "default_max_stream_buffer")]
    pub max_stream_buffer_bytes: u64,
}

impl Default for InterceptorConfig {
    fn default() -> Self {
        InterceptorConfig {
            on_malformed: OnMalformed::FailClosed,
            max_stream_buffer_bytes: default_max_stream_buffer(),
        }
    }
}

/// `interceptor.on_malformed`: what the LLM layer does with an event or body it cannot parse.
///
/// Such an event is as unreadable to the agent's SDK as to us, so the only risk of passing it is
/// a parser differential (something our strict parser rejects but a lenient client accepts, e.g.
/// a trailing comma or `NaN`): `FailOpen` accepts that risk for availability; `FailClosed` ends
/// the stream (or refuses the body) instead, at the cost of breaking a turn on a provider bug.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMalformed {
    /// Pass malformed events through unchanged (logged). Valid JSON our strict reading refuses
    /// (a repeated key, a wrong type) that mentions a tool still ends the stream.
    FailOpen,
    /// End the stream cleanly when a malformed event mentions a tool; events that cannot be
    /// about a tool (no tool key at all) still pass. The default.
    #[default]
    FailClosed,
}

impl OnMalformed {
    /// The YAML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OnMalformed::FailOpen => "fail_open",
            OnMalformed::FailClosed => "fail_closed",
        }
    }
}

fn yes() -> bool {
    true
}
fn star() -> String {
    "*".to_string()
}
fn default_rpm() -> u32 {
    60
}
fn default_burst() -> u32 {
    10
}
fn default_proxy_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 18080))
}
fn default_api_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 18081))
}
fn default_anthropic() -> String {
    "https://api.anthropic.com".to_string()
}
fn default_openai() -> String {
    "https://api.openai.com".to_string()
}
fn default_resolve_interval() -> u64 {
    60
}
fn default_window_ms() -> u64 {
    2000
}
fn default_max_stream_buffer() -> u64 {
    8 * 1024 * 1024
}
