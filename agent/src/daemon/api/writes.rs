//! The API's changing routes: posted events, decisions, listings, sessions (the socket only,
//! and only for the daemon's user outside every session: `route`).

use super::*;

/// How long a posted batch may wait for its commit (past SQLite's 10 s busy time-out, so that a
/// database another process holds a while is waited for, not refused).
const COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// A request's body: at most `limit` bytes, within [`READ_TIMEOUT`].
pub(super) async fn body(req: Request<Incoming>, limit: usize) -> anyhow::Result<Bytes> {
    let (parts, body) = req.into_parts();
    Ok(crate::edge::read_body(body, &parts.headers, limit, READ_TIMEOUT).await?)
}

/// Records posted events (only the daemon's user, outside every session, may post: see
/// [`route`]).
pub(super) async fn post_events(
    state: &DaemonState,
    req: Request<Incoming>,
) -> anyhow::Result<Response<Body>> {
    let body = body(req, MAX_BODY).await?;
    // Parse everything first: a batch with a bad line is refused whole, not half-recorded.
    let mut events = Vec::new();
    for (i, line) in body
        .split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, l)| !l.trim_ascii().is_empty())
    {
        let mut event: Event = serde_json::from_slice(line)
            .with_context(|| format!("line {}: not an event", i + 1))?;
        // The store makes those of rows it cannot read; a posted one would forge that.
        anyhow::ensure!(
            !matches!(event, Event::UnreadableRow(_)),
            "line {}: unreadable_row is what the store reads back, never recorded",
            i + 1
        );
        // The poster judged by its own file: a bundle's revision is the daemon's word only.
        if let Some(revision) = event.policy_revision_mut() {
            *revision = None;
        }
        events.push(event);
    }
    let n = events.len();
    // 202 means stored: the answer waits for the commit (otherwise events acknowledged could
    // still be lost to kill -9 or a full disk).
    match state.committer.commit(events, COMMIT_WAIT).await {
        Ok(()) => Ok(json_response(
            StatusCode::ACCEPTED,
            &json!({ "accepted": n }),
        )),
        Err(why) => {
            tracing::warn!(%why, events = n, "refused posted events");
            Ok(error(StatusCode::SERVICE_UNAVAILABLE, &why.to_string()))
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    server_id: Option<String>,
    name: String,
    namespace: Option<String>,
    #[serde(default = "executing")]
    stage: CallStage,
    /// The call's arguments, judged by the argument rules; without them the name alone is.
    #[serde(default)]
    arguments: Option<serde_json::Value>,
}

fn executing() -> CallStage {
    CallStage::Executing
}

pub(super) async fn check(
    state: &DaemonState,
    req: Request<Incoming>,
) -> anyhow::Result<Response<Body>> {
    let r: CheckRequest = serde_json::from_slice(&body(req, MAX_BODY).await?).context(
        "expected {\"name\", \"server_id\"?, \"namespace\"?, \"stage\"?: \"proposed\"|\"executing\", \"arguments\"?}",
    )?;
    for field in [Some(&r.name), r.server_id.as_ref(), r.namespace.as_ref()]
        .into_iter()
        .flatten()
    {
        // Names become rate-limit keys; no tool or server name is anywhere near this long.
        anyhow::ensure!(
            field.len() <= MAX_NAME,
            "a name, server id or namespace is longer than {MAX_NAME} bytes"
        );
    }
    let decision = state.gate.check_call(&CallQuery {
        server_id: r.server_id.as_deref(),
        name: &r.name,
        namespace: r.namespace.as_deref(),
        stage: r.stage,
        arguments: r.arguments.as_ref(),
    });
    Ok(json_response(StatusCode::OK, &decision))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListedRequest {
    server_id: String,
    server_type: String,
    tools: Vec<serde_json::Value>,
    /// The server's whole listing (its tool set is then sealed when pins are on), or only
    /// some of its tools.
    whole: bool,
}

/// Longest tool name, server id or namespace `/api/check` takes.
const MAX_NAME: usize = 512;

pub(super) async fn listed(
    state: &DaemonState,
    req: Request<Incoming>,
) -> anyhow::Result<Response<Body>> {
    let r: ListedRequest = serde_json::from_slice(&body(req, MAX_BODY).await?)
        .context("expected {\"server_id\", \"server_type\", \"tools\": [...], \"whole\": bool}")?;
    anyhow::ensure!(
        r.server_id.len() <= MAX_NAME,
        "the server id is longer than {MAX_NAME} bytes"
    );
    let decisions = if r.whole {
        state
            .policy
            .check_listed_all(&r.server_id, &r.server_type, &r.tools)
    } else {
        r.tools
            .iter()
            .map(|tool| {
                state
                    .policy
                    .check_listed(&r.server_id, &r.server_type, tool)
            })
            .collect()
    };
    Ok(json_response(StatusCode::OK, &decisions))
}

#[derive(Deserialize)]
struct SessionRequest {
    name: String,
    /// The session may start without Unix socket confinement (`exec.confine: weaker`).
    #[serde(default)]
    weaker: bool,
}

pub(super) async fn open_session(
    state: &DaemonState,
    req: Request<Incoming>,
) -> anyhow::Result<Response<Body>> {
    let r: SessionRequest = serde_json::from_slice(&body(req, MAX_BODY).await?)
        .context("expected {\"name\": \"...\"}")?;
    let unix = state.netmon.as_ref().and_then(|n| n.unix_missing());
    if let Some(why) = &unix
        && !r.weaker
    {
        anyhow::bail!(
            "session {:?} not started: the kernel cannot confine its Unix sockets ({why}), so the agent could reach any local service over one; upgrade to Linux 6.7 or later, or set `exec.confine: weaker` to start sessions without",
            r.name
        );
    }
    let cgroup = state.open_session(&r.name)?;
    // Its processes' connections to the LLM proxy are the session's, and only theirs may
    // use its key (`llm/proxy/sessions.rs`): recorded before the key exists.
    if let Some(dir) = &cgroup {
        state
            .session_keys
            .place(&r.name, dir)
            .with_context(|| format!("the cgroup of session {:?}", r.name))?;
    }
    let kernel = state.layers.iter().find(|l| l.name == "kernel");
    // The session's base URL carries a secret of its own: a path naming the session let any
    // agent write into any session's record.
    let proxy = match proxy_base(state) {
        Some(base) => {
            let key = state
                .session_keys
                .issue(&r.name)
                .context("a key for the session's LLM base URL")?;
            Some(format!("{base}/s/{key}"))
        }
        None => None,
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "session": r.name,
            "cgroup": cgroup,
            "kernel": kernel.map(|k| if k.on { "on".to_string() } else { format!("off: {}", k.detail) }),
            "unix": unix,
            "proxy": proxy,
            "database": state.db_path,
        }),
    ))
}

/// The LLM proxy's base URL, when that layer runs.
pub(super) fn proxy_base(state: &DaemonState) -> Option<String> {
    state.proxy_addr.map(|addr| format!("http://{addr}"))
}

pub(super) fn close_session(state: &DaemonState, name: &str) -> anyhow::Result<Response<Body>> {
    state.mark_closing(name);
    let servers = state.end_servers_of(Some(name));
    if servers > 0 {
        tracing::info!(session = %name, servers, "session closed: its stdio MCP servers are ended");
    }
    let existed = state.close_session(name)?;
    state.session_keys.forget(name);
    Ok(json_response(
        StatusCode::OK,
        &json!({ "session": name, "closed": existed }),
    ))
}
