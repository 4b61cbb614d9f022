//! `netmon:`: the eBPF connect hooks on the session cgroup, and what they do with DNS.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::defaults::yes;

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
    /// What else a session may reach: the session boundary.
    #[serde(default)]
    pub egress: EgressConfig,
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
            egress: EgressConfig::default(),
        }
    }
}

/// `netmon.dns:` — DNS (port 53, UDP and TCP) from sessions to a resolver the host does not use
/// can carry data out or answer with addresses toolwall never resolved.
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

/// `netmon.egress:` — the session boundary. Whatever the mode, a session reaches toolwall's own
/// endpoints (the LLM proxy), the allowed resolvers on port 53, the declared servers the policy
/// does not deny, the ports it bound itself, and what `allow` lists; a server the policy denies
/// stays denied whatever `allow` says.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EgressConfig {
    /// What else is refused.
    #[serde(default)]
    pub mode: EgressMode,
    /// Destinations opened besides: `ADDR`, `ADDR:PORT`, `NET/BITS`, `NET/BITS:PORT` (IPv6 in
    /// brackets) or `HOST:PORT` (resolved and followed as servers' names are).
    #[serde(default)]
    pub allow: Vec<String>,
}

/// `netmon.egress.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EgressMode {
    /// The host itself (loopback, its own addresses, the unspecified address) and the networks
    /// around it (private, unique-local and link-local ranges, broadcast, multicast) are
    /// refused; the rest of the internet is open.
    #[default]
    LocalDeny,
    /// Every destination not listed is refused.
    Allowlist,
    /// No boundary: only the rules of servers, providers and DNS apply.
    Open,
}

fn default_pin_dir() -> PathBuf {
    PathBuf::from("/sys/fs/bpf/toolwall")
}

fn default_watch_interval() -> u64 {
    1000
}

fn default_resolve_interval() -> u64 {
    60
}
