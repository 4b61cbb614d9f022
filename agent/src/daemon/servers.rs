//! The declared MCP servers as the daemon takes them in, at start and at each bundle revision:
//! the users stdio servers run as are checked, and the network servers' tools are discovered
//! and registered through the policy.

use std::time::Duration;

use anyhow::Context;

use crate::{
    config::{Config, ServerType},
    decision::Gate,
    events::EventSink,
    policy::Policy,
};

/// Every declared stdio server's `user:` must exist here (found at start, not at the first
/// call); one without runs as the agent that asks, which can reach into it: said once, here.
pub(super) fn check_server_users(config: &Config) -> anyhow::Result<()> {
    for server in &config.sandbox.mcp.servers {
        if server.server_type != crate::config::ServerType::Stdio {
            continue;
        }
        match &server.user {
            Some(name) => {
                let user = crate::exec::lookup_user(name).with_context(|| {
                    format!(
                        "{}: sandbox.mcp.servers {:?}: `user: {name}`",
                        config.origin, server.id
                    )
                })?;
                anyhow::ensure!(
                    user.uid != 0,
                    "{}: sandbox.mcp.servers {:?}: `user: {name}` is root, and root leaves any confinement toolwall sets (its egress limit included): name an unprivileged user of the server's own",
                    config.origin,
                    server.id
                );
            }
            None => tracing::warn!(
                server = %server.id,
                "declared stdio server without `user:` runs as the agent that asks for it, which can then reach into it (its memory, its files); give it a user of its own"
            ),
        }
    }
    Ok(())
}

/// How long discovery waits for each network server (connect, initialize, every page).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Lists the tools of every declared network server (all at once), registers them through the
/// policy (hashes, version pinning) and records `mcp_tool_seen` / `mcp_tool_changed`. Returns a
/// one-line summary for the start-up report.
pub(super) async fn discover_servers(config: &Config, policy: &Policy, sink: &EventSink) -> String {
    use crate::mcp::client::{Transport, discover};
    let servers: Vec<_> = config
        .sandbox
        .mcp
        .servers
        .iter()
        .filter(|s| s.server_type != ServerType::Stdio)
        .collect();
    if servers.is_empty() {
        return "no network MCP servers declared; stdio servers register through `toolwall shim`"
            .into();
    }
    let lookups = servers.iter().map(|server| async move {
        let transport = match server.server_type {
            ServerType::Sse => Transport::Sse,
            _ => Transport::Auto,
        };
        let url = server.url.as_deref().unwrap_or_default();
        (
            server,
            discover(url, transport, Default::default(), DISCOVERY_TIMEOUT).await,
        )
    });
    let mut found = 0;
    let mut failed = Vec::new();
    for (server, result) in futures_util::future::join_all(lookups).await {
        match result {
            Ok(discovered) => {
                let decisions = policy.check_listed_all(
                    &server.id,
                    discovered.transport.server_type(),
                    &discovered.tools,
                );
                for event in policy.listing_events("", &decisions) {
                    sink.emit(event);
                }
                let hidden = decisions.iter().filter(|d| d.is_blocked()).count();
                tracing::info!(server = %server.id, tools = discovered.tools.len(), hidden, "discovered");
                found += 1;
            }
            Err(error) => {
                tracing::warn!(server = %server.id, url = server.url.as_deref().unwrap_or_default(), %error, "discovery failed; its tools stay as last registered");
                failed.push(server.id.as_str());
            }
        }
    }
    if failed.is_empty() {
        format!("{found} network server(s) discovered")
    } else {
        format!(
            "{found} network server(s) discovered; unreachable: {} (see the warnings above)",
            failed.join(", ")
        )
    }
}
