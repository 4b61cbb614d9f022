//! The configuration schema: one struct per YAML section, with the defaults of every key.
//!
//! Every struct denies unknown fields: a misspelt key in a deny rule must stop start-up, not
//! silently turn the rule off. Defaults live here (not in the embedded YAML only) so a file
//! that leaves a section out gets the same behaviour as the embedded default.

mod approval;
mod argument_rules;
mod content_checks;
mod daemon;
mod defaults;
mod exec;
mod llm;
mod mcp;
mod netmon;
mod policy_source;
mod telemetry;

use serde::{Deserialize, Serialize};

pub(crate) use approval::*;
pub(crate) use argument_rules::*;
pub(crate) use content_checks::*;
pub(crate) use daemon::*;
pub(crate) use exec::*;
pub(crate) use llm::*;
pub(crate) use mcp::*;
pub(crate) use netmon::*;
pub(crate) use policy_source::*;
pub(crate) use telemetry::*;

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
