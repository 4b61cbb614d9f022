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

fn default_pin_dir() -> PathBuf {
    PathBuf::from("/sys/fs/bpf/toolwall")
}

fn default_watch_interval() -> u64 {
    1000
}

fn default_resolve_interval() -> u64 {
    60
}
