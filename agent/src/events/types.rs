//! The event schema (version 1): the three layers' call events plus the registry's two.
//!
//! Every event is one JSON object with a `type` tag; the store keeps it whole and copies the
//! fields that queries filter on into typed columns.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::decision::{Action, ResultAction, ResultFinding};

/// Version of this schema, stored with every row.
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// One recorded fact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The LLM interceptor found a tool call in a model response.
    McpToolCallIntercepted(ToolCallIntercepted),
    /// A shim or filter proxy saw a `tools/call` on its way to a server.
    McpToolCalled(ToolCalled),
    /// The kernel saw a connection from a session to a registered MCP server address.
    McpNetworkConnection(NetworkConnection),
    /// A server listed a tool (`tools/list`).
    McpToolSeen(ToolSeen),
    /// A listed tool's definition hash differs from the pinned one (rug pull) or it is new
    /// after the server's set was pinned.
    McpToolChanged(ToolChanged),
    /// The kernel layer found a session tampered with, or took one over.
    KernelAlert(KernelAlert),
    /// The result rules found something in a server's message toward the client.
    McpResultInspected(ResultInspected),
    /// The LLM proxy relayed a request uninspected (`proxy.pass_through`) or refused one on a
    /// route it does not read.
    LlmRoute(LlmRoute),
    /// A stored row this build cannot decode (a type it does not know, a damaged body), as the
    /// store reads it back: never written, so that one bad row is shown and counted where the
    /// others are read instead of failing every view and the export at it.
    UnreadableRow(UnreadableRow),
}

impl Event {
    /// What the event holds in memory while queued for the store
    /// ([`crate::events::EventSink::room`]): a fixed share for its fields plus its free-form
    /// parts, JSON values as parsed ([`crate::events::bound::memory_hint`]).
    pub(crate) fn weight(&self) -> usize {
        const FIELDS: usize = 512;
        let value = |v: &Option<Value>| v.as_ref().map_or(0, crate::events::bound::memory_hint);
        FIELDS
            + match self {
                Event::McpToolCallIntercepted(e) => {
                    e.tool_name.len() + e.reason.len() + value(&e.input)
                }
                Event::McpToolCalled(e) => {
                    e.tool_name.len()
                        + e.reason.len()
                        + value(&e.input)
                        + crate::events::bound::memory_hint(&e.jsonrpc_id)
                }
                Event::McpNetworkConnection(e) => {
                    e.comm.len()
                        + e.exe.as_ref().map_or(0, String::len)
                        + e.cmdline.as_ref().map_or(0, String::len)
                }
                Event::McpToolSeen(e) => e.tool_name.len() + e.reason.len(),
                Event::McpToolChanged(e) => e.tool_name.len(),
                Event::KernelAlert(e) => e.detail.len(),
                Event::LlmRoute(e) => e.route.len() + e.reason.len(),
                Event::UnreadableRow(e) => e.stored_type.len() + e.error.len(),
                Event::McpResultInspected(e) => {
                    e.tool_name.len()
                        + e.reason.len()
                        + crate::events::bound::memory_hint(&e.jsonrpc_id)
                        + e.findings
                            .iter()
                            .map(|f| 96 + f.rule.len() + f.pointer.len())
                            .sum::<usize>()
                }
            }
    }

    /// The `type` tag as stored.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::McpToolCallIntercepted(_) => "mcp_tool_call_intercepted",
            Event::McpToolCalled(_) => "mcp_tool_called",
            Event::McpNetworkConnection(_) => "mcp_network_connection",
            Event::McpToolSeen(_) => "mcp_tool_seen",
            Event::McpToolChanged(_) => "mcp_tool_changed",
            Event::KernelAlert(_) => "kernel_alert",
            Event::McpResultInspected(_) => "mcp_result_inspected",
            Event::LlmRoute(_) => "llm_route",
            Event::UnreadableRow(_) => "unreadable_row",
        }
    }

    /// What every view and the store's indexed columns filter on, from one place: when,
    /// session, server, tool (the destination address for a connection, the alert's name for
    /// an alert) and action.
    pub fn keys(&self) -> EventKeys<'_> {
        let (timestamp, session, server, tool, action) = match self {
            Event::McpToolCallIntercepted(e) => (
                e.timestamp,
                &e.session_id,
                &*e.server_id,
                &e.tool_name,
                e.action,
            ),
            Event::McpToolCalled(e) => (
                e.timestamp,
                &e.session_id,
                &*e.server_id,
                &e.tool_name,
                e.action,
            ),
            Event::McpNetworkConnection(e) => (
                e.timestamp,
                &e.session_id,
                &*e.server_id,
                &e.remote_addr,
                e.action,
            ),
            Event::McpToolSeen(e) => (
                e.timestamp,
                &e.session_id,
                &*e.server_id,
                &e.tool_name,
                e.action,
            ),
            Event::McpToolChanged(e) => (
                e.timestamp,
                &e.session_id,
                &*e.server_id,
                &e.tool_name,
                e.action,
            ),
            Event::KernelAlert(e) => (e.timestamp, &e.session_id, "", &e.alert, e.action),
            Event::LlmRoute(e) => (
                e.timestamp,
                &e.session_id,
                e.provider.as_str(),
                &e.route,
                e.action,
            ),
            Event::McpResultInspected(e) => (
                e.timestamp,
                &e.session_id,
                &*e.server_id,
                &e.tool_name,
                e.action,
            ),
            Event::UnreadableRow(e) => (
                e.timestamp,
                &e.session_id,
                &*e.server_id,
                &e.tool_name,
                e.action,
            ),
        };
        EventKeys {
            timestamp,
            session,
            server,
            tool,
            action,
        }
    }

    /// The signed policy bundle's revision this decision event was recorded under.
    pub(crate) fn policy_revision(&self) -> Option<u64> {
        match self {
            Event::McpToolCallIntercepted(e) => e.policy_revision,
            Event::McpToolCalled(e) => e.policy_revision,
            Event::McpNetworkConnection(e) => e.policy_revision,
            Event::McpToolSeen(e) => e.policy_revision,
            Event::McpToolChanged(e) => e.policy_revision,
            Event::McpResultInspected(e) => e.policy_revision,
            Event::KernelAlert(_) | Event::LlmRoute(_) | Event::UnreadableRow(_) => None,
        }
    }

    /// The policy revision field of a decision event (`None` for kernel alerts, which no
    /// policy decides).
    pub(crate) fn policy_revision_mut(&mut self) -> Option<&mut Option<u64>> {
        match self {
            Event::McpToolCallIntercepted(e) => Some(&mut e.policy_revision),
            Event::McpToolCalled(e) => Some(&mut e.policy_revision),
            Event::McpNetworkConnection(e) => Some(&mut e.policy_revision),
            Event::McpToolSeen(e) => Some(&mut e.policy_revision),
            Event::McpToolChanged(e) => Some(&mut e.policy_revision),
            Event::McpResultInspected(e) => Some(&mut e.policy_revision),
            Event::KernelAlert(_) | Event::LlmRoute(_) | Event::UnreadableRow(_) => None,
        }
    }

    /// Every kind of event the layers record, for `--type` validation (an unreadable row is
    /// filtered by the type it was stored as).
    pub const KINDS: [&'static str; 8] = [
        "mcp_tool_call_intercepted",
        "mcp_tool_called",
        "mcp_network_connection",
        "mcp_tool_seen",
        "mcp_tool_changed",
        "kernel_alert",
        "mcp_result_inspected",
        "llm_route",
    ];
}

/// See [`Event::keys`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventKeys<'a> {
    /// When it happened.
    pub timestamp: chrono::DateTime<chrono::Utc>,
    /// The session.
    pub session: &'a str,
    /// The server (empty for an alert).
    pub server: &'a str,
    /// The tool, the destination address of a connection, or an alert's name.
    pub tool: &'a str,
    /// The action.
    pub action: Action,
}

/// Seed 001's `mcp_tool_call_intercepted`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallIntercepted {
    /// When the call was seen.
    pub timestamp: DateTime<Utc>,
    /// The agent session.
    pub session_id: String,
    /// The proxy's id of the HTTP exchange (`llm-RUN-N`: unique across daemon runs).
    pub request_id: String,
    /// `anthropic`, `openai-chat` or `openai-responses`.
    pub dialect: String,
    /// The name the model used.
    pub tool_name: String,
    /// The tool's own name on its server, as the registry resolved it (`get-sum` for Codex's
    /// `get_sum` in namespace `mcp__everything`); empty when unresolved.
    #[serde(default)]
    pub server_tool: String,
    /// `toolu_...`, `call_...`, `fc_...`.
    pub tool_call_id: String,
    /// Arguments, when they were complete (streamed arguments of a blocked call are never
    /// assembled).
    pub input: Option<Value>,
    /// Registry match.
    pub server_id: String,
    /// `stdio`, `http`, `sse`, or empty when unknown.
    pub server_type: String,
    /// `host:port` for network servers.
    pub server_addr: String,
    /// Definition hash at decision time.
    pub tool_hash: String,
    /// The decision.
    pub action: Action,
    /// Why.
    pub reason: String,
    /// The revision of the signed policy bundle in force when the layer recorded it
    /// (`policy.bundle`, `daemon/bundle.rs`); absent when the policy is the local file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_revision: Option<u64>,
}

/// Seed 001's `mcp_tool_called`, recorded by the shim and the filter proxy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCalled {
    /// When the request passed.
    pub timestamp: DateTime<Utc>,
    /// The agent session (from `TOOLWALL_SESSION`), or empty.
    pub session_id: String,
    /// The server the call was for.
    pub server_id: String,
    /// `stdio`, `http` or `sse`.
    pub server_type: String,
    /// The tool's name in the request.
    pub tool_name: String,
    /// The JSON-RPC id.
    pub jsonrpc_id: Value,
    /// The request's `arguments`.
    pub input: Option<Value>,
    /// Forwarded (`allow`) or refused as unknown tool (`block`).
    pub action: Action,
    /// Why.
    pub reason: String,
    /// `shim` or `mcp-proxy`.
    pub layer: String,
    /// The revision of the signed policy bundle in force when the layer recorded it
    /// (`policy.bundle`, `daemon/bundle.rs`); absent when the policy is the local file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_revision: Option<u64>,
}

/// What the result rules found in one message a server sent toward the client: the rules and
/// places, never the values (`policy/results.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultInspected {
    /// When the message passed.
    pub timestamp: DateTime<Utc>,
    /// The agent session, or empty.
    pub session_id: String,
    /// The server that sent it.
    pub server_id: String,
    /// `stdio`, `http` or `sse`.
    pub server_type: String,
    /// The tool whose `tools/call` it answers; empty for other messages.
    pub tool_name: String,
    /// The JSON-RPC id of the message (`null` for a notification).
    pub jsonrpc_id: Value,
    /// `block` when the client got an error instead of the message, else `allow`.
    pub action: Action,
    /// `alert`, `redact` or `withhold`: what happened to the message.
    pub inspection: ResultAction,
    /// The findings (at most 64).
    pub findings: Vec<ResultFinding>,
    /// How many findings there were in all.
    pub findings_total: usize,
    /// Why, in words.
    pub reason: String,
    /// `shim` or `mcp-proxy`.
    pub layer: String,
    /// The revision of the signed policy bundle in force when the layer recorded it
    /// (`policy.bundle`, `daemon/bundle.rs`); absent when the policy is the local file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_revision: Option<u64>,
}

/// Seed 001's `mcp_network_connection`, from the kernel's connect hooks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NetworkConnection {
    /// When the event was read.
    pub timestamp: DateTime<Utc>,
    /// The session whose cgroup the process was in.
    pub session_id: String,
    /// `ip:port` (IPv6 in brackets).
    pub remote_addr: String,
    /// Server the address belongs to.
    pub server_id: String,
    /// `http`, `sse`, or `llm` for a provider endpoint.
    pub server_type: String,
    /// `allow` (flagged, let through) or `block` (denied with EPERM).
    pub action: Action,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Real uid.
    pub uid: u32,
    /// Task comm.
    pub comm: String,
    /// `/proc/<pid>/exe`, when the process was still there.
    pub exe: Option<String>,
    /// `/proc/<pid>/cmdline`, space-joined, when still there.
    pub cmdline: Option<String>,
    /// Parent pid, when still there.
    pub ppid: Option<u32>,
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// Socket cookie.
    pub socket_cookie: u64,
    /// `tcp`, `udp` or the protocol number.
    pub protocol: String,
    /// `ipv4` or `ipv6`: the socket family the process used.
    pub family: String,
    /// How many connections the event stands for: 1, or for a summary the kernel made under a
    /// flood (agent-common/src/summary.rs) how many it counted; the other fields are then the
    /// last one's.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub count: u64,
    /// For a summary: when the first connection it counts happened (`timestamp`: the last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// The revision of the signed policy bundle in force when the layer recorded it
    /// (`policy.bundle`, `daemon/bundle.rs`); absent when the policy is the local file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_revision: Option<u64>,
}

fn one() -> u64 {
    1
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

/// What the kernel layer's watch found about a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelAlert {
    /// When it was found.
    pub timestamp: DateTime<Utc>,
    /// The session.
    pub session_id: String,
    /// `program_detached` (put back), `process_left` (moved back), `session_adopted` (a daemon
    /// before this one died and left it pinned), `adoption_failed` (such a session that could
    /// not be), `session_taken_over` (pinned by another build, now this one's) or
    /// `foreign_pins` (pinned by another build that could not be taken over),
    /// besides the kernel's `events_lost` and `egress_dropped`.
    pub alert: String,
    /// What happened, for a human.
    pub detail: String,
    /// The process concerned, if one.
    pub pid: Option<u32>,
    /// `block` when toolwall undid what was done, `allow` when it only records it.
    pub action: Action,
}

/// A request the LLM proxy did not inspect: relayed because the host owner listed its route
/// (`allow`), or refused because no dialect reads it (`block`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlmRoute {
    /// When the request arrived.
    pub timestamp: DateTime<Utc>,
    /// The agent session.
    pub session_id: String,
    /// The proxy's id of the request (`llm-N`).
    pub request_id: String,
    /// The provider it went to (or would have).
    pub provider: String,
    /// `METHOD /path` (no query string: it may carry a key).
    pub route: String,
    /// `allow`: relayed uninspected; `block`: refused.
    pub action: Action,
    /// Why.
    pub reason: String,
}

/// A stored row that could not be decoded, with what its indexed columns still say.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnreadableRow {
    /// The row's time column.
    pub timestamp: DateTime<Utc>,
    /// Its session column.
    pub session_id: String,
    /// Its server column.
    pub server_id: String,
    /// Its tool column.
    pub tool_name: String,
    /// Its action column (`allow` when that is unreadable too).
    pub action: Action,
    /// The `type` it was stored as.
    pub stored_type: String,
    /// Why it could not be read.
    pub error: String,
}

/// A tool a server listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSeen {
    /// When it was listed.
    pub timestamp: DateTime<Utc>,
    /// The agent session, or empty (discovery by the daemon).
    pub session_id: String,
    /// The server.
    pub server_id: String,
    /// `stdio`, `http` or `sse`.
    pub server_type: String,
    /// The tool's name.
    pub tool_name: String,
    /// SHA-256 of its canonical definition.
    pub tool_hash: String,
    /// Shown to clients (`allow`) or hidden (`block`).
    pub action: Action,
    /// Why.
    pub reason: String,
    /// The revision of the signed policy bundle in force when the layer recorded it
    /// (`policy.bundle`, `daemon/bundle.rs`); absent when the policy is the local file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_revision: Option<u64>,
}

/// A definition that changed after it was pinned, or a tool that appeared after pinning.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolChanged {
    /// When the change was noticed.
    pub timestamp: DateTime<Utc>,
    /// The agent session, or empty.
    pub session_id: String,
    /// The server.
    pub server_id: String,
    /// The tool.
    pub tool_name: String,
    /// The pinned hash (empty for a tool new since pinning).
    pub old_hash: String,
    /// The hash now.
    pub new_hash: String,
    /// `block` or `allow` (alert only), per `version_pinning.on_change`.
    pub action: Action,
    /// The revision of the signed policy bundle in force when the layer recorded it
    /// (`policy.bundle`, `daemon/bundle.rs`); absent when the policy is the local file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_revision: Option<u64>,
}
