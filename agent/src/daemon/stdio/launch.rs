//! What the daemon starts for a shim: a declared server as its declaration says, an undeclared
//! one (when `fail_closed` allows it) as the agent would have run it.

use anyhow::Context as _;

use super::Asker;
use crate::config::{Egress, ServerType};
use crate::daemon::state::DaemonState;
use crate::mcp::relay::RunRequest;

/// What the daemon starts for a shim, and how.
pub(super) struct Launch {
    pub(super) program: String,
    pub(super) args: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    pub(super) cwd: std::path::PathBuf,
    /// uid, gid and groups.
    pub(super) ids: (u32, u32, Vec<libc::gid_t>),
    /// A declared server's `egress:`; `None` for an undeclared one, which runs the agent's own
    /// command under the session's rules.
    pub(super) egress: Option<Egress>,
    pub(super) declared: bool,
}

/// `PATH` of a declared server unless its `env:` sets one.
const DECLARED_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A declared stdio server runs as its declaration says — command, environment, working
/// directory, user, egress — whatever the shim asked (the agent's environment or directory
/// would run the agent's code in it). An undeclared one is refused under
/// `fail_closed`, else runs the shim's command as the agent would run it: with the shim's
/// environment and directory, as the agent's user.
pub(super) fn what_to_run(
    state: &DaemonState,
    request: &RunRequest,
    asker: Asker,
) -> anyhow::Result<Launch> {
    // The declarations in force: a bundle may have declared, changed or removed servers.
    let in_force = state.policy.now();
    let mcp = &*in_force.mcp;
    let Some(server) = crate::config::declared_server(&mcp.servers, &request.server_id)? else {
        anyhow::ensure!(
            !mcp.fail_closed,
            "MCP server {:?} is not declared; refused under sandbox.mcp.fail_closed (declare it under sandbox.mcp.servers with type: stdio and its command)",
            request.server_id
        );
        let (program, args) = request
            .command
            .split_first()
            .context("no server command given after `--`")?;
        return Ok(Launch {
            program: program.clone(),
            args: args.to_vec(),
            env: request.env.clone(),
            cwd: request.cwd.clone(),
            ids: (asker.uid, asker.gid, vec![asker.gid]),
            egress: None,
            declared: false,
        });
    };
    anyhow::ensure!(
        server.server_type == ServerType::Stdio,
        "MCP server {:?} is declared as {}, not stdio",
        server.id,
        server.server_type.as_str()
    );
    let program = server
        .command
        .clone()
        .with_context(|| format!("declared stdio server {:?} has no command", server.id))?;
    if request.command.first() != Some(&program)
        || request.command.get(1..).unwrap_or_default() != server.args.as_slice()
    {
        tracing::warn!(
            server = %server.id,
            "the shim asked for `{}`; running the declared command instead",
            request.command.join(" ")
        );
    }
    let (ids, home) = match &server.user {
        Some(name) => {
            let user = crate::exec::lookup_user(name)
                .with_context(|| format!("the user of declared stdio server {:?}", server.id))?;
            ((user.uid, user.gid, user.groups), Some(user.home))
        }
        None => (
            (asker.uid, asker.gid, vec![asker.gid]),
            crate::exec::home_of(asker.uid),
        ),
    };
    let mut env: Vec<(String, String)> = vec![("PATH".to_owned(), DECLARED_PATH.to_owned())];
    if let Some(home) = home {
        env.push(("HOME".to_owned(), home.to_string_lossy().into_owned()));
    }
    env.retain(|(k, _)| !server.env.contains_key(k));
    env.extend(server.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let egress = server
        .egress()
        .map_err(|why| anyhow::anyhow!("declared stdio server {:?}: {why}", server.id))?;
    Ok(Launch {
        program,
        args: server.args.clone(),
        env,
        cwd: server.cwd.clone().unwrap_or_else(|| "/".into()),
        ids,
        egress: Some(egress),
        declared: true,
    })
}

/// A part of a session name: `cgroup.rs` allows `[A-Za-z0-9._-]` and 64 bytes, and bpffs (where
/// the session's links are pinned) no dots.
pub(super) fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .take(24)
        .collect()
}
