//! `toolwall shim -- CMD ARGS...`: sits between an agent and a stdio MCP server it spawns.
//!
//! Two pumps move newline-delimited JSON-RPC through one [`Filter`]: client stdin → child
//! stdin, child stdout → client stdout. Refusals are written back to the client on stdout, so
//! a denied `tools/call` never reaches the child. The child's stderr is inherited (it is the
//! server's log, not protocol), and logs of the shim itself go to stderr as well: stdout is
//! the JSON-RPC channel.

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

use crate::decision::Gate;
use crate::events::EventSink;

use super::asking::until_hangup;
use super::filter::{Filter, FilterContext, Held};
use super::filter::{INVALID_REQUEST, error_response};
use super::framing::{DEFAULT_MAX_MESSAGE_BYTES, LineFramer, TooLong, strip_newline};

/// How long the child gets to exit on its own after the client closed stdin (the MCP stdio
/// shutdown sequence: close stdin, wait, SIGTERM, wait, SIGKILL).
pub(crate) const STDIN_CLOSED_GRACE: Duration = Duration::from_secs(5);
/// How long the child gets after SIGTERM before SIGKILL.
pub(crate) const SIGTERM_GRACE: Duration = Duration::from_secs(2);

/// Arguments of `toolwall shim`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ShimArgs {
    /// `install` / `uninstall`: wrap an agent's MCP servers in the shim, or unwrap them.
    #[command(subcommand)]
    pub action: Option<crate::exec::ShimAction>,
    /// Configuration file (YAML); turns on event recording.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Event database; turns on event recording.
    #[arg(long, value_name = "FILE")]
    pub db: Option<PathBuf>,
    /// Server id for policy and events (default: from the command, e.g. the npm package).
    #[arg(long, value_name = "ID")]
    pub server_id: Option<String>,
    /// Hide and refuse tools whose name matches REGEX (repeatable; commas separate patterns).
    #[arg(long = "deny", value_name = "REGEX")]
    pub deny: Vec<String>,
    /// Most bytes of one JSON-RPC message, either way. A larger request is answered with an
    /// error (or, without an id, ends the session); a larger server message stops the shim
    /// with status 1. Nothing over the limit is forwarded, even in part.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
    /// The stdio MCP server to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

impl ShimArgs {
    /// The server id: `--server-id`, else derived from the command (see [`default_server_id`]).
    pub fn server_id(&self) -> String {
        self.server_id
            .clone()
            .unwrap_or_else(|| default_server_id(&self.command))
    }
}

/// Launchers whose first non-flag argument names the server (`npx -y @scope/server-x`).
const LAUNCHERS: [&str; 11] = [
    "npx", "bunx", "pnpx", "uvx", "uv", "node", "python", "python3", "deno", "bun", "pipx",
];

/// A readable server id from a command line: the program's file name, or for a launcher
/// (`npx`, `uvx`, `node`, `python`...) the package or script it runs, without scope, version
/// or extension: `npx -y @modelcontextprotocol/server-everything@1.2` → `server-everything`.
pub(crate) fn default_server_id(command: &[String]) -> String {
    let base = |s: &str| {
        std::path::Path::new(s)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| s.to_owned())
    };
    let Some(program) = command.first() else {
        return String::new();
    };
    let program = base(program);
    if !LAUNCHERS.contains(&program.as_str()) {
        return program;
    }
    let target = command[1..]
        .iter()
        .find(|a| !a.starts_with('-') && !matches!(a.as_str(), "run" | "tool" | "x"));
    match target {
        Some(t) => {
            let name = base(t);
            // `pkg@1.2` → `pkg`; `@scope/pkg` was cut to `pkg` by `base`.
            let name = match name.rfind('@') {
                Some(at) if at > 0 => name[..at].to_owned(),
                _ => name,
            };
            let name = name
                .strip_suffix(".js")
                .or_else(|| name.strip_suffix(".py"))
                .or_else(|| name.strip_suffix(".ts"))
                .unwrap_or(&name)
                .to_owned();
            if name.is_empty() { program } else { name }
        }
        None => program,
    }
}

/// `toolwall shim`: the command-line entry. Builds the policy (configuration plus `--deny`)
/// and, when `--config` or `--db` is given, the event store, then runs [`run_shim`] and returns
/// the child's exit code once every event is stored.
pub(crate) fn run(args: ShimArgs) -> anyhow::Result<ExitCode> {
    if let Some(action) = args.action {
        return crate::exec::install(action);
    }
    // An id with a trailing space or a control character reads as another server's in the views.
    crate::config::check_server_id(&args.server_id()).map_err(|why| match args.server_id {
        Some(_) => anyhow::anyhow!("--server-id: {why}"),
        None => {
            anyhow::anyhow!("the id derived from the command: {why}; give one with --server-id")
        }
    })?;
    let config = crate::config::Config::load(args.config.as_deref())?;
    if let Some(socket) = super::enforce::session_daemon(&config)? {
        return relay(&args, &socket);
    }
    // On its own, with a configuration that declares servers: no look-alike of one either.
    crate::config::declared_server(&config.sandbox.mcp.servers, &args.server_id())?;
    super::enforce::Enforcement::new(args.config.as_deref(), args.db.as_deref(), &args.deny)?
        .run(|gate, events, asker| run_shim(&args, gate, events, asker))
}

/// Inside a session: the daemon runs the server and judges and records it; this process is a
/// pipe to it (`mcp/relay.rs`).
fn relay(args: &ShimArgs, socket: &std::path::Path) -> anyhow::Result<ExitCode> {
    super::enforce::deny_patterns(&args.deny)?;
    let request = super::relay::RunRequest {
        server_id: args.server_id(),
        command: args.command.clone(),
        env: std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect(),
        cwd: std::env::current_dir().context("the working directory")?,
        deny: args.deny.clone(),
        max_message_bytes: args.max_message_bytes,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(super::relay::run(socket, &request));
    // Stdin is read on a blocking thread that may still be parked in read(2); do not wait.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

/// Runs the shim with a given policy and event sink (the daemon's policy and store, or the
/// command line's): spawns `args.command`, pumps both directions through the filter,
/// forwards SIGINT/SIGTERM/SIGHUP, and returns the child's exit code (128+N for signal N).
pub(crate) async fn run_shim(
    args: &ShimArgs,
    gate: Arc<dyn Gate>,
    events: Option<EventSink>,
    asker: Option<crate::approval::Asker>,
) -> anyhow::Result<ExitCode> {
    let (program, rest) = args
        .command
        .split_first()
        .context("no server command given after `--`")?;
    let ctx = FilterContext {
        gate,
        server_id: args.server_id(),
        server_type: "stdio".to_owned(),
        layer: "shim",
        session_id: crate::cgroup::current_session(),
        events,
        approvals: asker,
    };
    serve(
        Command::new(program).args(rest),
        ctx,
        super::async_stdin(),
        super::async_stdout(),
        args.max_message_bytes,
    )
    .await
    .with_context(|| format!("shim for `{}`", args.command.join(" ")))
}

/// The shim over any client streams (stdin/stdout in production, pipes in tests), taking
/// messages of at most `max_message` bytes. A server message over it is an error: the server
/// is killed and the error returned (nothing of the message reaches the client).
pub(crate) async fn serve<R, W>(
    command: &mut Command,
    ctx: FilterContext,
    client_in: R,
    client_out: W,
    max_message: usize,
) -> anyhow::Result<ExitCode>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let child = spawn_server(command.stderr(Stdio::inherit()))?;
    let code = serve_child(child, ctx, client_in, client_out, max_message).await?;
    Ok(ExitCode::from(code))
}

/// Starts a stdio server with its stdin and stdout piped to us (its stderr as the caller set).
pub(crate) fn spawn_server(command: &mut Command) -> anyhow::Result<tokio::process::Child> {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start the MCP server")
}

/// [`serve`] for a server already started with [`spawn_server`] (the daemon starts servers
/// itself, to answer a failed start before the relay begins: `daemon/stdio.rs`); returns the
/// server's exit status (128+N for signal N).
pub(crate) async fn serve_child<R, W>(
    mut child: tokio::process::Child,
    ctx: FilterContext,
    client_in: R,
    client_out: W,
    max_message: usize,
) -> anyhow::Result<u8>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let pid = child.id().context("the MCP server exited at once")? as libc::pid_t;
    let child_in = child.stdin.take().context("no stdin pipe to the server")?;
    let child_out = child
        .stdout
        .take()
        .context("no stdout pipe from the server")?;

    let filter = Arc::new(Mutex::new(Filter::new(ctx)));
    let client_out = Arc::new(tokio::sync::Mutex::new(client_out));
    let mut to_server = tokio::spawn(client_to_server(
        client_in,
        child_in,
        filter.clone(),
        client_out.clone(),
        max_message,
    ));
    let mut to_client = tokio::spawn(server_to_client(child_out, filter, client_out, max_message));
    let mut to_client_done = false;

    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let forward = |sig: libc::c_int| {
        // SAFETY: kill has no memory preconditions; pid is our child, not yet reaped (the
        // select below reaps it only in the wait branch, which ends the loop).
        unsafe { libc::kill(pid, sig) };
    };

    let mut stdin_closed = false;
    let mut deadline: Option<(tokio::time::Instant, libc::c_int)> = None;
    let status = loop {
        let timer = async {
            match deadline {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = child.wait() => break status.context("waiting for the MCP server")?,
            _ = sigint.recv() => forward(libc::SIGINT),
            _ = sigterm.recv() => forward(libc::SIGTERM),
            _ = sighup.recv() => forward(libc::SIGHUP),
            result = &mut to_client, if !to_client_done => {
                to_client_done = true;
                match result {
                    Ok(Err(error)) if error.is::<TooLong>() => {
                        // The server broke the protocol's bounds: stop rather than pass a
                        // partial or unchecked message. The child is killed on drop.
                        to_server.abort();
                        return Err(error.context("the MCP server's output was refused"));
                    }
                    Ok(Err(error)) => tracing::warn!("server to client: {error:#}"),
                    _ => {}
                }
            }
            result = &mut to_server, if !stdin_closed => {
                stdin_closed = true;
                if let Ok(Err(error)) = result {
                    tracing::warn!("client to server: {error:#}");
                }
                // The pump dropped the child's stdin: the server sees EOF and should exit.
                deadline = Some((tokio::time::Instant::now() + STDIN_CLOSED_GRACE, libc::SIGTERM));
            }
            () = timer => {
                let sig = deadline.map(|(_, s)| s).unwrap_or(libc::SIGKILL);
                tracing::warn!(signal = sig, "the MCP server did not exit after its stdin closed");
                forward(sig);
                deadline = (sig == libc::SIGTERM)
                    .then(|| (tokio::time::Instant::now() + SIGTERM_GRACE, libc::SIGKILL));
            }
        }
    };
    // Deliver what the server wrote before it exited (a grandchild holding the pipe open must
    // not keep us alive forever).
    if !to_client_done {
        match tokio::time::timeout(Duration::from_secs(2), &mut to_client).await {
            Ok(Ok(Err(error))) if error.is::<TooLong>() => {
                to_server.abort();
                return Err(error.context("the MCP server's output was refused"));
            }
            Ok(Ok(Err(error))) => tracing::warn!("server to client: {error:#}"),
            Err(_) => to_client.abort(),
            _ => {}
        }
    }
    to_server.abort();
    use std::os::unix::process::ExitStatusExt as _;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    Ok(u8::try_from(code).unwrap_or(1))
}

/// What to write for one message, computed under the filter lock and written after it.
enum Forward {
    /// The line as it came (untouched message).
    Same,
    /// A changed message (without `\n`).
    Changed(Vec<u8>),
    /// Nothing.
    Nothing,
}

/// What [`decide`] says about one message: how to forward it, what to answer, which calls
/// wait for a person.
type Decided = (Forward, Vec<Vec<u8>>, Vec<Held>);

fn decide(filter: &Mutex<Filter>, line: &Bytes, on_client: bool) -> Decided {
    let msg = strip_newline(line);
    // A poisoned lock means a pump panicked; the filter's state (pending list ids) is still
    // sound, so go on rather than pass anything unfiltered.
    let mut filter = filter.lock().unwrap_or_else(|e| e.into_inner());
    let out = if on_client {
        filter.on_client(msg)
    } else {
        filter.on_server(msg)
    }
    .record(filter.sink());
    let forward = match out.forward {
        Some(std::borrow::Cow::Borrowed(b))
            if b.as_ptr() == msg.as_ptr() && b.len() == msg.len() =>
        {
            Forward::Same
        }
        Some(other) => Forward::Changed(other.into_owned()),
        None => Forward::Nothing,
    };
    (forward, out.replies, out.held)
}

async fn write_line<W: AsyncWrite + Unpin>(
    out: &mut W,
    line: &Bytes,
    forward: Forward,
) -> std::io::Result<()> {
    match forward {
        Forward::Same => {
            out.write_all(line).await?;
            if !line.ends_with(b"\n") {
                out.write_all(b"\n").await?;
            }
        }
        Forward::Changed(mut msg) => {
            // One write, `\n` included: the server wakes once per message.
            msg.push(b'\n');
            out.write_all(&msg).await?;
        }
        Forward::Nothing => {}
    }
    Ok(())
}

async fn write_replies<W: AsyncWrite + Unpin>(
    out: &tokio::sync::Mutex<W>,
    replies: Vec<Vec<u8>>,
) -> std::io::Result<()> {
    if replies.is_empty() {
        return Ok(());
    }
    let mut out = out.lock().await;
    for reply in replies {
        out.write_all(&reply).await?;
        out.write_all(b"\n").await?;
    }
    out.flush().await
}

async fn client_to_server<R, W>(
    mut client_in: R,
    mut child_in: tokio::process::ChildStdin,
    filter: Arc<Mutex<Filter>>,
    client_out: Arc<tokio::sync::Mutex<W>>,
    max_message: usize,
) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send,
{
    let mut framer = LineFramer::with_limit(max_message);
    let sink = filter
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .sink()
        .cloned();
    loop {
        // A client whose calls the store cannot keep up with waits here, its messages unread
        // (the daemon's memory stays bounded; nothing it does goes unrecorded).
        if let Some(sink) = &sink {
            sink.room().await;
        }
        let n = client_in
            .read_buf(framer.buffer_mut())
            .await
            .context("reading the client")?;
        let mut eof = n == 0;
        loop {
            let line = match next_message(&mut framer, eof) {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(too_long) => {
                    refuse_too_long(&client_out, too_long).await?;
                    continue;
                }
            };
            let (forward, replies, held) = decide(&filter, &line, true);
            deliver(&client_out, replies, &mut child_in, &line, forward).await?;
            // A call that waits for a person holds the client's later messages behind it:
            // the server gets them in the order the client sent them.
            for held in held {
                let mut ended = eof;
                let hangup = async {
                    if !eof {
                        until_hangup(&mut client_in, &mut framer, max_message, &mut ended).await
                    }
                };
                let out = super::asking::settle(&filter, held, Some(&*client_out), hangup).await;
                let out = {
                    let f = filter.lock().unwrap_or_else(|e| e.into_inner());
                    out.record(f.sink())
                };
                eof = ended;
                let forward = match out.forward {
                    Some(message) => Forward::Changed(message.into_owned()),
                    None => Forward::Nothing,
                };
                deliver(&client_out, out.replies, &mut child_in, &line, forward).await?;
            }
        }
        if eof {
            // Dropping `child_in` closes the server's stdin.
            return Ok(());
        }
    }
}

/// What one client message came to: the answers toolwall gives the client, then what the
/// server gets.
async fn deliver<W: AsyncWrite + Unpin>(
    client_out: &tokio::sync::Mutex<W>,
    replies: Vec<Vec<u8>>,
    child_in: &mut tokio::process::ChildStdin,
    line: &Bytes,
    forward: Forward,
) -> anyhow::Result<()> {
    write_replies(client_out, replies)
        .await
        .context("answering the client")?;
    if !matches!(forward, Forward::Nothing) {
        write_line(child_in, line, forward)
            .await
            .context("writing to the MCP server")?;
        child_in
            .flush()
            .await
            .context("writing to the MCP server")?;
    }
    Ok(())
}

/// The next message of a pump: a complete line, or at end of stream the unterminated rest.
fn next_message(framer: &mut LineFramer, eof: bool) -> Result<Option<Bytes>, TooLong> {
    match framer.next_line()? {
        Some(line) => Ok(Some(line)),
        None if eof => framer.finish(),
        None => Ok(None),
    }
}

/// A client message over the limit was dropped: answer its request with an error so the
/// client is not left waiting, or, when its id was not readable (a notification, or an id
/// past the limit), end the client's side of the session (`Err`: the server's stdin closes).
async fn refuse_too_long<W: AsyncWrite + Unpin>(
    client_out: &tokio::sync::Mutex<W>,
    too_long: TooLong,
) -> anyhow::Result<()> {
    tracing::warn!("client to server: {too_long}");
    let Some(id) = too_long.id.as_deref() else {
        return Err(anyhow::Error::new(too_long).context("closing the session"));
    };
    let reply = error_response(id, INVALID_REQUEST, &format!("[toolwall] {too_long}"));
    write_replies(client_out, vec![reply])
        .await
        .context("answering the client")
}

async fn server_to_client<W: AsyncWrite + Unpin>(
    mut child_out: tokio::process::ChildStdout,
    filter: Arc<Mutex<Filter>>,
    client_out: Arc<tokio::sync::Mutex<W>>,
    max_message: usize,
) -> anyhow::Result<()> {
    let mut framer = LineFramer::with_limit(max_message);
    loop {
        let n = child_out
            .read_buf(framer.buffer_mut())
            .await
            .context("reading the MCP server")?;
        let eof = n == 0;
        // A server message over the limit ends the session (`?`): a reply cut short, or
        // skipped, would leave the client waiting on a request that never completes.
        while let Some(line) = next_message(&mut framer, eof)? {
            let (forward, replies, held) = decide(&filter, &line, false);
            debug_assert!(replies.is_empty() && held.is_empty());
            if !matches!(forward, Forward::Nothing) {
                let mut out = client_out.lock().await;
                write_line(&mut *out, &line, forward)
                    .await
                    .context("writing to the client")?;
                out.flush().await.context("writing to the client")?;
            }
        }
        if eof {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests;
