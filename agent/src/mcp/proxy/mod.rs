//! `toolwall mcp-proxy`: the MCP tool-filter proxy in front of a network MCP server.
//!
//! At start-up the upstream is contacted once (handshake and every `tools/list` page) to
//! register and record its tools; a server that cannot be reached stops start-up with a clear
//! error, and one that asks for authorization (401) is served all the same (`auth.rs`). No
//! list is shared between client sessions: each session's `tools/list` is asked of the
//! upstream in that session and filtered, and its calls are judged against the list it was
//! given (a session that calls first is listed for first: `listing.rs`). `tools/call` of a
//! denied tool is answered "unknown tool" without reaching the upstream.
//! What reaches the upstream of a client's messages is the filter's canonical text
//! (`mcp/canonical.rs`); the upstream's messages pass as they are, tool lists filtered.
//!
//! Rooms: `routes` (listener, routes, bounded bodies, responses), `passthrough` (Streamable
//! HTTP on both sides), `bridge` (sessions bridged to an [`UpstreamSession`]), `stdio`
//! (`--stdio`), `listing` (each session's tool list), `identity` (who a request speaks for), `ids` (the ids it makes and reads), `verdicts`
//! (what it records of a request's calls), `outstanding`
//! (the ids a passthrough session's requests wait under), `auth` (authorization passed through).
//!
//! Client-side transports: Streamable HTTP on `/mcp`, legacy HTTP+SSE on `/sse` + `/message`,
//! or stdio (`--stdio`). Each client session gets its own upstream session. When the client
//! and the upstream both speak Streamable HTTP the proxy works at the HTTP level (the
//! upstream's `Mcp-Session-Id` is the client's, `Last-Event-ID` and auth headers go through);
//! otherwise messages are bridged through an [`UpstreamSession`].
//!
//! Time-outs: TCP connect 10 s ([`CONNECT_TIMEOUT`]); each start-up step, and the wait for
//! the response headers of every forwarded request, `--timeout` (default 60 s, the MCP SDKs'
//! default request time-out); open SSE streams have no idle time-out (MCP streams are quiet
//! for as long as nothing happens). The upstream is probed with a TCP connect every
//! [`WATCHDOG_INTERVAL`] (and at once when a request failed); three failed probes in a row, a
//! second apart, mean it is gone and the proxy exits with status 1.

use std::borrow::Cow;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::decision::Gate;
use crate::events::EventSink;

use super::asking::NoProgress;
use super::budget::{Budget, Charge};
use super::client::{
    self, CONNECT_TIMEOUT, Connector, HttpClient, McpClientError, SESSION_HEADER, Transport,
    UpstreamSession, http_client,
};
use super::filter::{
    Filter, FilterContext, INVALID_REQUEST, ListFirst, Listing, allowed_tools, error_response,
    request_envelope,
};
use super::filtered_sse::FilteredSse;
use super::framing::{DEFAULT_MAX_MESSAGE_BYTES, LineFramer, strip_newline};
use super::headers;
use super::stream_order::StreamOrder;
use crate::sse::writer::encode_event;

/// JSON-RPC "Internal error": the upstream refused a request toolwall forwarded.
const INTERNAL_ERROR: i64 = -32603;
/// The MCP SDKs' "Request timed out" code.
const REQUEST_TIMEOUT: i64 = -32001;

/// `--max-session-bytes`: two of the largest messages by default.
const DEFAULT_SESSION_BYTES: usize = 2 * DEFAULT_MAX_MESSAGE_BYTES;
/// `--max-held-bytes`.
const DEFAULT_HELD_BYTES: usize = 256 << 20;

/// Failed probes in a row (a second apart) that mean the upstream is gone.
const PROBES_TO_LOSE: usize = 3;
/// How often the upstream is probed for liveness.
pub(crate) const WATCHDOG_INTERVAL: Duration = Duration::from_secs(5);
/// How long a client may take to send request headers (slow-loris guard).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Arguments of `toolwall mcp-proxy`.
#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    /// The upstream MCP server, e.g. `http://127.0.0.1:3001/mcp` or `http://127.0.0.1:3001/sse`.
    #[arg(long, value_name = "URL")]
    pub upstream: String,
    /// The upstream's transport.
    #[arg(long, value_enum, default_value_t = Transport::Auto)]
    pub transport: Transport,
    /// Hide and refuse tools whose name matches REGEX (repeatable; commas separate patterns).
    #[arg(long = "deny", value_name = "REGEX[,REGEX...]")]
    pub deny: Vec<String>,
    /// Address to serve `/mcp`, `/sse` and `/message` on (loopback unless told otherwise).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// Serve one client on stdin/stdout instead of HTTP.
    #[arg(long)]
    pub stdio: bool,
    /// Most bytes of one message from the client: a `--stdio` line or an HTTP request body.
    /// A larger request is answered with an error (HTTP 413; on stdio, without an id, it ends
    /// the proxy with status 1); nothing over the limit is read on or forwarded, even in part.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
    /// Browser origins allowed besides localhost (`Origin` is checked on every request).
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
    /// Header for the proxy's own requests to the upstream (its start-up listing; every
    /// request of a `--stdio` client), e.g. `Authorization: Bearer ...` (repeatable). HTTP
    /// clients send their own credentials, passed through to the upstream and nowhere else.
    #[arg(long = "upstream-header", value_name = "NAME: VALUE")]
    pub upstream_headers: Vec<String>,
    /// Also send the `--upstream-header`s with the requests of HTTP clients that bring no
    /// `Authorization` of their own: every such client then acts with these credentials.
    #[arg(long)]
    pub lend_upstream_headers: bool,
    /// Seconds for each start-up step and for the upstream to start answering a forwarded
    /// request (TCP connect: 10 s; the upstream is probed every 5 s and its loss ends the
    /// proxy with status 1).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub timeout: u64,
    /// Most bytes of server messages one client session may have the proxy hold (read from
    /// the upstream, not yet taken by the client); past it the session's upstream is read no
    /// further until its client reads. Half of it at most is kept for a GET stream a
    /// Streamable HTTP client has not opened yet (the rest is dropped, and logged).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_SESSION_BYTES)]
    pub max_session_bytes: usize,
    /// Most bytes of server messages all client sessions together may have the proxy hold.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_HELD_BYTES)]
    pub max_held_bytes: usize,
    /// Seconds a client session bridged to a legacy SSE upstream may go without a request
    /// (and with no GET stream open) before the proxy ends it and its upstream session; its
    /// client then gets 404 and starts a new session, as the MCP spec says. Also how long a
    /// request id whose answer never came (its client left) stays taken in its session.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub session_idle_timeout: u64,
    /// Server id for policy and events (default: the id of the server `--config` declares
    /// at the upstream's URL, else the upstream's host:port).
    #[arg(long, value_name = "ID")]
    pub server_id: Option<String>,
    /// Configuration file (YAML); turns on event recording.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Event database; turns on event recording.
    #[arg(long, value_name = "FILE")]
    pub db: Option<PathBuf>,
}

impl ProxyArgs {
    /// The server id: `--server-id`, else the upstream's `host:port` (never its user and
    /// password, which would be recorded with every call).
    pub fn server_id(&self) -> String {
        self.server_id.clone().unwrap_or_else(|| {
            let uri = self.upstream.parse::<Uri>().ok();
            let host = uri.as_ref().and_then(|u| u.host());
            match (host, uri.as_ref().and_then(|u| u.port_u16())) {
                (Some(host), Some(port)) => format!("{host}:{port}"),
                (Some(host), None) => host.to_owned(),
                (None, _) => "upstream".to_owned(),
            }
        })
    }
}

/// `toolwall mcp-proxy`: the command-line entry (`--deny` gate, optional event sink); runs
/// until interrupted (exit 0) or until the upstream is lost (error, exit 1).
pub(crate) fn run(args: ProxyArgs) -> anyhow::Result<ExitCode> {
    no_fastbins();
    // The port first, before any thread starts (taking systemd's socket unsets its variables)
    // and before the upstream is asked anything: from here on no other process can take it.
    let listener = if args.stdio {
        None
    } else {
        Some(hold_port(args.listen)?)
    };
    let enforcement =
        super::enforce::Enforcement::new(args.config.as_deref(), args.db.as_deref(), &args.deny)?;
    let mut args = args;
    if args.server_id.is_none() {
        args.server_id = enforcement.declared_server(&args.upstream)?;
        if args.server_id.is_none() && enforcement.declares_network_servers() {
            tracing::warn!(
                "--upstream {} is the URL of no server the configuration declares (compared by scheme, user, host, port, path and query): its calls are judged and recorded as server {:?}, and no declared server's rules apply; pass --server-id ID to name one",
                args.upstream,
                args.server_id()
            );
        }
    }
    enforcement
        .run(|gate, events, asker| run_proxy(&args, listener, gate, events, asker))
        .map(|()| ExitCode::SUCCESS)
}

/// Turns off glibc's fastbins for this process. Every call frees small blocks (headers,
/// parsed JSON) and then asks for larger ones (hyper's 8 KiB read buffers), and each larger
/// request first consolidates the freed fastbin blocks. Without fastbins (the per-thread
/// cache stays) a `tools/call` cost 10-14 µs less CPU (of 200-290 µs, user and system, on a
/// busy 2-core VM), as much as mimalloc saved.
fn no_fastbins() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable of the allocator; it is thread-safe.
    unsafe {
        libc::mallopt(libc::M_MXFAST, 0);
    }
}

/// The listener for `--listen`: the socket systemd holds for it (a socket unit of the user's),
/// else one bound here; the error names who holds the port.
fn hold_port(listen: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let mut activated = crate::listen::Activated::from_env("--listen")?;
    let listener = match activated.take(listen, "--listen")? {
        Some(held) => held,
        None => {
            let listener = std::net::TcpListener::bind(listen).with_context(|| {
                format!(
                    "cannot listen on {listen} (--listen){}",
                    crate::listen::held_by(listen.port())
                )
            })?;
            listener
                .set_nonblocking(true)
                .with_context(|| format!("make the socket on {listen} non-blocking"))?;
            listener
        }
    };
    activated.finish()?;
    Ok(listener)
}

fn parse_headers(lines: &[String]) -> anyhow::Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .with_context(|| format!("--upstream-header {line:?}: expected `Name: value`"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .with_context(|| format!("--upstream-header {line:?}: bad header name"))?;
        let value = HeaderValue::from_str(value.trim())
            .with_context(|| format!("--upstream-header {line:?}: bad header value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// Everything the request handlers share.
struct Shared {
    upstream: Uri,
    /// What a request to the upstream names: the URL's path and query (origin form).
    upstream_target: Uri,
    /// The `Host` header of every request to the upstream.
    upstream_host: HeaderValue,
    /// Opens the upstream connections of the Streamable HTTP passthrough ([`UpstreamConn`]).
    connector: Connector,
    transport: Transport,
    ctx: Arc<FilterContext>,
    /// The passthrough's sessions' tool lists (a bridged or stdio session keeps its own).
    listings: Mutex<SessionListings>,
    /// Who a client request speaks for (`identity.rs`).
    identities: Identities,
    /// Turns for listings on passthrough sessions' behalf ([`MAX_LISTING_AT_ONCE`]).
    listing_turns: tokio::sync::Semaphore,
    /// The ids the passthrough's sessions' requests wait under (`outstanding.rs`).
    outstanding: Arc<Outstanding>,
    http: HttpClient,
    timeout: Duration,
    /// Most bytes of one client request body.
    max_message: usize,
    allow_origins: Vec<String>,
    /// `--upstream-header`: the proxy's own credentials.
    upstream_headers: HeaderMap,
    /// `--lend-upstream-headers`: they go with HTTP clients' requests that carry no
    /// `Authorization` of their own.
    lend: bool,
    /// Where the proxy serves HTTP (`None` with `--stdio`): its own URL for the metadata.
    listen: Option<SocketAddr>,
    /// What the upstream's challenges said (`auth.rs`).
    auth: AuthState,
    /// Every session's held messages together (`--max-held-bytes`); each session's budget
    /// (`--max-session-bytes`) is within it.
    held: Arc<Budget>,
    session_bytes: usize,
    /// Responses dropped because no request waits for them any more (logged with the count).
    unawaited: std::sync::atomic::AtomicU64,
    /// Legacy SSE client sessions by our session id.
    sse_sessions: Mutex<HashMap<String, Arc<BridgedSession>>>,
    /// Streamable HTTP client sessions bridged to a legacy SSE upstream.
    bridged: Mutex<HashMap<String, Arc<BridgedSession>>>,
    /// Sessions' GET streams, kept ahead of their requests.
    streams: Arc<StreamOrder>,
    /// Reasons the upstream is gone; the first one ends the process.
    fatal: mpsc::UnboundedSender<String>,
    /// Wakes the watchdog for a probe now: one request's failure is only a suspicion.
    probe: Arc<tokio::sync::Notify>,
    /// Most time a bridged Streamable HTTP session may go without a request or an open GET
    /// stream before it is ended (its upstream session holds connections).
    session_idle: Duration,
}

impl Shared {
    /// The upstream is gone for good (`--stdio`: the one session it serves broke).
    fn lost(&self, reason: impl std::fmt::Display) {
        let _ = self.fatal.send(reason.to_string());
    }

    /// One request or stream failed. A client can make a server break its own connection
    /// (oversized headers, a reset), so that alone ends nothing: it is logged, the request
    /// gets its error, and the watchdog probes the upstream at once (its loss ends the proxy).
    fn suspect(&self, reason: impl std::fmt::Display) {
        tracing::warn!("{reason}; probing the upstream");
        self.probe.notify_one();
    }

    /// A filter for a session of its own (bridged, `--stdio`): judged against its own list.
    /// A new session's byte budget, within the total.
    fn session_budget(&self) -> Arc<Budget> {
        Budget::new(self.session_bytes, Some(self.held.clone()))
    }

    fn filter(&self) -> Filter {
        Filter::shared(self.ctx.clone()).with_listing(Arc::new(Mutex::new(Listing::required())))
    }

    /// The tool list of the passthrough session and identity a request belongs to.
    fn listing_of(&self, session: Option<&str>, identity: u64) -> Arc<Mutex<Listing>> {
        self.listings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .of(session, identity)
    }
}

/// Runs the proxy with a given policy and event sink (the daemon's, or the command line's).
/// Returns `Ok` on SIGINT/SIGTERM (or stdin EOF with `--stdio`), an error naming the upstream
/// when it cannot be reached at start or is lost later.
pub(crate) async fn run_proxy(
    args: &ProxyArgs,
    listener: Option<std::net::TcpListener>,
    gate: Arc<dyn Gate>,
    events: Option<EventSink>,
    asker: Option<crate::approval::Asker>,
) -> anyhow::Result<()> {
    let upstream_headers = parse_headers(&args.upstream_headers)?;
    if args.max_session_bytes > args.max_held_bytes {
        anyhow::bail!(
            "--max-session-bytes ({}) is more than --max-held-bytes ({}): one session may hold at most what all may",
            args.max_session_bytes,
            args.max_held_bytes
        );
    }
    let timeout = Duration::from_secs(args.timeout.max(1));
    let auth = AuthState::default();
    let discovered = match client::discover(
        &args.upstream,
        args.transport,
        upstream_headers.clone(),
        timeout,
    )
    .await
    {
        Ok(discovered) => discovered,
        // A protected server: its clients authenticate themselves (`auth.rs`), and each
        // session is listed with its own credentials. A `--stdio` client cannot: it has only
        // the proxy's. A legacy SSE upstream's session is the proxy's, not its client's.
        Err(McpClientError::Unauthorized { challenge, .. })
            if !args.stdio && args.transport != Transport::Sse =>
        {
            tracing::info!(
                upstream = %args.upstream,
                "the upstream asks for authorization: each client authenticates itself (the upstream's challenge is passed on, pointing at this proxy's protected-resource metadata); its tools are registered as clients list them"
            );
            if let Some(challenge) = &challenge {
                auth.challenged(challenge);
            }
            client::Discovered {
                transport: Transport::StreamableHttp,
                tools: Vec::new(),
            }
        }
        Err(e) => {
            let hint = match &e {
                McpClientError::Unauthorized { .. } if args.stdio => {
                    " (a --stdio client cannot authenticate itself: pass the proxy's credentials with --upstream-header 'Authorization: Bearer ...')"
                }
                McpClientError::Unauthorized { .. } => {
                    " (a legacy SSE upstream's session is the proxy's own: pass its credentials with --upstream-header)"
                }
                _ => "",
            };
            return Err(anyhow::Error::new(e).context(format!(
                "cannot start: the upstream MCP server {} is not usable{hint}",
                args.upstream
            )));
        }
    };
    if !upstream_headers.is_empty() && !args.stdio && !args.lend_upstream_headers {
        tracing::info!(
            "--upstream-header is for the proxy's own requests: HTTP clients bring their own credentials (--lend-upstream-headers lends these to clients that bring none)"
        );
    }
    let ctx = FilterContext {
        gate,
        server_id: args.server_id(),
        server_type: discovered.transport.server_type().to_owned(),
        layer: "mcp-proxy",
        session_id: crate::cgroup::current_session(),
        events,
        approvals: asker,
    };
    let total = discovered.tools.len();
    let (allowed, seen) = allowed_tools(&ctx, discovered.tools);
    if let Some(sink) = &ctx.events {
        seen.into_iter().for_each(|record| sink.emit(record));
    }
    tracing::info!(
        upstream = %args.upstream,
        transport = ?discovered.transport,
        "{} of {total} upstream tools exposed",
        allowed.len()
    );
    let (fatal_tx, mut fatal_rx) = mpsc::unbounded_channel();
    let probe = Arc::new(tokio::sync::Notify::new());
    let upstream: Uri = args.upstream.parse().context("upstream URL")?;
    let shared = Arc::new(Shared {
        upstream_target: origin_form(&upstream)?,
        upstream_host: host_header(&upstream)?,
        connector: client::connector()?,
        upstream: upstream.clone(),
        transport: discovered.transport,
        ctx: Arc::new(ctx),
        listings: Mutex::default(),
        identities: Identities::default(),
        listing_turns: tokio::sync::Semaphore::new(MAX_LISTING_AT_ONCE),
        outstanding: Arc::new(Outstanding::new(Duration::from_secs(
            args.session_idle_timeout.max(1),
        ))),
        http: http_client()?,
        timeout,
        max_message: args.max_message_bytes,
        allow_origins: args.allow_origins.clone(),
        upstream_headers,
        lend: args.lend_upstream_headers,
        listen: listener.as_ref().and_then(|l| l.local_addr().ok()),
        auth,
        held: Budget::new(args.max_held_bytes, None),
        session_bytes: args.max_session_bytes,
        unawaited: Default::default(),
        sse_sessions: Mutex::default(),
        bridged: Mutex::default(),
        streams: Arc::default(),
        fatal: fatal_tx.clone(),
        probe: probe.clone(),
        session_idle: Duration::from_secs(args.session_idle_timeout.max(1)),
    });
    tokio::spawn(watchdog(upstream, fatal_tx, probe));
    if !args.stdio {
        tokio::spawn(reap_idle_sessions(Arc::downgrade(&shared)));
    }

    let serve = async {
        match listener {
            Some(listener) => serve_http(shared.clone(), listener).await,
            None => serve_stdio(shared.clone(), args.max_message_bytes).await,
        }
    };
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    tokio::select! {
        result = serve => result,
        Some(reason) = fatal_rx.recv() => {
            anyhow::bail!("lost the upstream MCP server {}: {reason}", args.upstream)
        }
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = sigterm.recv() => Ok(()),
    }
}

/// The path and query of a URL, what an HTTP/1 request to its server names.
fn origin_form(url: &Uri) -> anyhow::Result<Uri> {
    let target = url.path_and_query().map_or("/", |p| p.as_str());
    target.parse().context("upstream URL path")
}

/// The `Host` header for a URL: its host, and its port unless the scheme's default.
fn host_header(url: &Uri) -> anyhow::Result<HeaderValue> {
    let host = url.host().context("upstream URL without a host")?;
    let default_port = if url.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let value = match url.port_u16() {
        Some(port) if port != default_port => format!("{host}:{port}"),
        _ => host.to_owned(),
    };
    HeaderValue::from_str(&value).context("upstream URL host")
}

/// Probes the upstream's TCP port every [`WATCHDOG_INTERVAL`], and at once when a request
/// failed; a refused or timed-out connect means it is gone.
async fn watchdog(
    upstream: Uri,
    fatal: mpsc::UnboundedSender<String>,
    probe: Arc<tokio::sync::Notify>,
) {
    let Some(authority) = upstream.authority().cloned() else {
        return;
    };
    let default_port = if upstream.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let port = authority.port_u16().unwrap_or(default_port);
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let mut interval = tokio::time::interval(WATCHDOG_INTERVAL);
    interval.tick().await;
    // One failed probe is not the upstream gone: a busy server's full accept queue drops a
    // SYN. It is gone after PROBES_TO_LOSE failures in a row, a second apart.
    let mut failures: Vec<String> = Vec::new();
    loop {
        if failures.is_empty() {
            tokio::select! {
                _ = interval.tick() => {}
                _ = probe.notified() => {}
            }
        } else {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let probe = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        );
        let failure = match probe.await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) if out_of_descriptors(&e) => {
                tracing::warn!("cannot probe the upstream, out of file descriptors: {e}");
                None
            }
            Ok(Err(e)) => Some(format!("cannot connect to {authority}: {e}")),
            Err(_) => Some(format!(
                "connecting to {authority} timed out after {CONNECT_TIMEOUT:?}"
            )),
        };
        match failure {
            None => failures.clear(),
            Some(why) => {
                tracing::warn!(
                    "upstream probe failed ({} of {PROBES_TO_LOSE}): {why}",
                    failures.len() + 1
                );
                failures.push(why);
                if failures.len() >= PROBES_TO_LOSE {
                    let _ = fatal.send(failures.join("; "));
                    return;
                }
            }
        }
    }
}

mod auth;
mod bridge;
mod identity;
mod ids;
mod legacy_sse;
mod listing;
mod outstanding;
mod passthrough;
mod routes;
mod stdio;
#[cfg(test)]
mod tests;
mod verdicts;

use auth::*;
use bridge::*;
use identity::Identities;
use ids::*;
use legacy_sse::*;
use listing::*;
use outstanding::Outstanding;
use passthrough::*;
use routes::*;
use stdio::*;
use verdicts::*;
