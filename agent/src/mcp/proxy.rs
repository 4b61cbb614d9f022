//! `toolwall mcp-proxy`: the MCP tool-filter proxy of seed 004 in front of a network MCP server.
//!
//! At start-up the upstream is contacted once (handshake and every `tools/list` page); a
//! server that cannot be reached stops start-up with a clear error. The filtered list is
//! cached and every client `tools/list` is answered from it (the seed's "filter at start-up":
//! denied tools never travel again, and the list costs the upstream nothing per session).
//! `tools/call` of a denied tool is answered "unknown tool" without reaching the upstream.
//! Everything else is passed through untouched.
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
//! [`WATCHDOG_INTERVAL`]; when it is gone the proxy exits with status 1.

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
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::decision::Gate;
use crate::events::EventSink;

use super::client::{
    self, CONNECT_TIMEOUT, HttpClient, McpClientError, SESSION_HEADER, Transport, UpstreamSession,
    http_client,
};
use super::filter::{
    Filter, FilterContext, INVALID_REQUEST, Listing, allowed_tools, error_response,
};
use super::filtered_sse::FilteredSse;
use super::framing::{DEFAULT_MAX_MESSAGE_BYTES, LineFramer, strip_newline};
use super::headers;
use super::sse::encode_event;
use super::stream_order::StreamOrder;

/// JSON-RPC "Internal error": the upstream refused a request toolwall forwarded.
const INTERNAL_ERROR: i64 = -32603;
/// The MCP SDKs' "Request timed out" code.
const REQUEST_TIMEOUT: i64 = -32001;

/// How often the upstream is probed for liveness.
pub const WATCHDOG_INTERVAL: Duration = Duration::from_secs(5);
/// How long a client may take to send request headers (slow-loris guard).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// Header for every upstream request, e.g. `Authorization: Bearer ...` (repeatable); the
    /// clients' own auth headers are passed through as well.
    #[arg(long = "upstream-header", value_name = "NAME: VALUE")]
    pub upstream_headers: Vec<String>,
    /// Seconds for each start-up step and for the upstream to start answering a forwarded
    /// request (TCP connect: 10 s; the upstream is probed every 5 s and its loss ends the
    /// proxy with status 1).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub timeout: u64,
    /// Server id for policy and events (default: the upstream's host:port).
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
    /// The server id: `--server-id`, else the upstream's `host:port`.
    pub fn server_id(&self) -> String {
        self.server_id.clone().unwrap_or_else(|| {
            self.upstream
                .parse::<Uri>()
                .ok()
                .and_then(|u| u.authority().map(|a| a.to_string()))
                .unwrap_or_else(|| self.upstream.clone())
        })
    }
}

/// `toolwall mcp-proxy`: the command-line entry (`--deny` gate, optional event sink); runs
/// until interrupted (exit 0) or until the upstream is lost (error, exit 1).
pub fn run(args: ProxyArgs) -> anyhow::Result<ExitCode> {
    let enforcement =
        super::enforce::Enforcement::new(args.config.as_deref(), args.db.as_deref(), &args.deny)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (gate, events) = (enforcement.gate.clone(), enforcement.events.clone());
    let result = runtime.block_on(run_proxy(&args, gate, events));
    runtime.shutdown_timeout(Duration::from_millis(100));
    enforcement.finish();
    result.map(|()| ExitCode::SUCCESS)
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
    transport: Transport,
    ctx: FilterContext,
    /// The filtered tool list (a JSON array), answered to every `tools/list`.
    /// The cached list and what may be called, shared by every session's filter.
    listing: Arc<Mutex<Listing>>,
    http: HttpClient,
    timeout: Duration,
    /// Most bytes of one client request body.
    max_message: usize,
    allow_origins: Vec<String>,
    upstream_headers: HeaderMap,
    /// Legacy SSE client sessions by our session id.
    sse_sessions: Mutex<HashMap<String, Arc<BridgedSession>>>,
    /// Streamable HTTP client sessions bridged to a legacy SSE upstream.
    bridged: Mutex<HashMap<String, Arc<BridgedSession>>>,
    /// Sessions' GET streams, kept ahead of their requests.
    streams: Arc<StreamOrder>,
    /// Reasons the upstream is gone; the first one ends the process.
    fatal: mpsc::UnboundedSender<String>,
}

impl Shared {
    fn lost(&self, reason: impl std::fmt::Display) {
        let _ = self.fatal.send(reason.to_string());
    }

    fn filter(&self) -> Filter {
        Filter::new(self.ctx.clone()).with_listing(self.listing.clone())
    }
}

/// Runs the proxy with a given policy and event sink (the daemon's, or the command line's).
/// Returns `Ok` on SIGINT/SIGTERM (or stdin EOF with `--stdio`), an error naming the upstream
/// when it cannot be reached at start or is lost later.
pub async fn run_proxy(
    args: &ProxyArgs,
    gate: Arc<dyn Gate>,
    events: Option<EventSink>,
) -> anyhow::Result<()> {
    let upstream_headers = parse_headers(&args.upstream_headers)?;
    let timeout = Duration::from_secs(args.timeout.max(1));
    let discovered = client::discover(
        &args.upstream,
        args.transport,
        upstream_headers.clone(),
        timeout,
    )
    .await
    .with_context(|| {
        format!(
            "cannot start: the upstream MCP server {} is not usable",
            args.upstream
        )
    })?;
    let ctx = FilterContext {
        gate,
        server_id: args.server_id(),
        server_type: discovered.transport.server_type().to_owned(),
        layer: "mcp-proxy",
        session_id: crate::cgroup::current_session(),
        events,
    };
    let total = discovered.tools.len();
    let allowed = allowed_tools(&ctx, discovered.tools);
    tracing::info!(
        upstream = %args.upstream,
        transport = ?discovered.transport,
        "{} of {total} upstream tools exposed",
        allowed.len()
    );
    let cached: Arc<str> =
        Arc::from(serde_json::to_string(&allowed).context("serialising the tool list")?);
    let (fatal_tx, mut fatal_rx) = mpsc::unbounded_channel();
    let upstream: Uri = args.upstream.parse().context("upstream URL")?;
    let shared = Arc::new(Shared {
        upstream: upstream.clone(),
        transport: discovered.transport,
        ctx,
        listing: Arc::new(Mutex::new(Listing::cached(cached))),
        http: http_client()?,
        timeout,
        max_message: args.max_message_bytes,
        allow_origins: args.allow_origins.clone(),
        upstream_headers,
        sse_sessions: Mutex::default(),
        bridged: Mutex::default(),
        streams: Arc::default(),
        fatal: fatal_tx.clone(),
    });
    tokio::spawn(watchdog(upstream, fatal_tx));

    let serve = async {
        if args.stdio {
            serve_stdio(shared.clone(), args.max_message_bytes).await
        } else {
            serve_http(shared.clone(), args.listen).await
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

/// Probes the upstream's TCP port; a refused or timed-out connect means it is gone.
async fn watchdog(upstream: Uri, fatal: mpsc::UnboundedSender<String>) {
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
    loop {
        interval.tick().await;
        let probe = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        );
        match probe.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if out_of_descriptors(&e) => {
                tracing::warn!("cannot probe the upstream, out of file descriptors: {e}");
            }
            Ok(Err(e)) => {
                let _ = fatal.send(format!("cannot connect to {authority}: {e}"));
                return;
            }
            Err(_) => {
                let _ = fatal.send(format!(
                    "connecting to {authority} timed out after {CONNECT_TIMEOUT:?}"
                ));
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// stdio client

async fn serve_stdio(shared: Arc<Shared>, max_message: usize) -> anyhow::Result<()> {
    let (session, mut inbox) = UpstreamSession::open(
        &shared.upstream.to_string(),
        shared.transport,
        shared.upstream_headers.clone(),
        shared.timeout,
    )
    .await
    .context("opening the upstream session")?;
    let session = Arc::new(session);
    let filter = Arc::new(Mutex::new(shared.filter()));
    let stdout = Arc::new(tokio::sync::Mutex::new(super::async_stdout()));

    let down = {
        let (filter, stdout, shared) = (filter.clone(), stdout.clone(), shared.clone());
        async move {
            while let Some(item) = inbox.recv().await {
                let message = match item {
                    Ok(m) => m,
                    Err(e) => {
                        shared.lost(e);
                        return Ok(());
                    }
                };
                let out = {
                    let mut f = filter.lock().unwrap_or_else(|e| e.into_inner());
                    f.from_server(&message)
                        .forward
                        .map(|c| one_line(&c).into_owned())
                };
                if let Some(line) = out {
                    let mut w = stdout.lock().await;
                    w.write_all(&line).await?;
                    w.write_all(b"\n").await?;
                    w.flush().await?;
                }
            }
            Ok::<(), std::io::Error>(())
        }
    };
    let up = async {
        let mut stdin = super::async_stdin();
        let mut framer = LineFramer::with_limit(max_message);
        let mut get_opened = false;
        loop {
            let n = stdin
                .read_buf(framer.buffer_mut())
                .await
                .context("reading stdin")?;
            let eof = n == 0;
            loop {
                let next = match framer.next_line() {
                    Ok(None) if eof => framer.finish(),
                    other => other,
                };
                let line = match next {
                    Ok(Some(line)) => line,
                    Ok(None) => break,
                    Err(too_long) => {
                        // Dropped whole: answer the request, or stop when it cannot be
                        // answered (no readable id).
                        tracing::warn!("client message refused: {too_long}");
                        let Some(id) = too_long.id.as_deref() else {
                            return Err(anyhow::Error::new(too_long).context("reading stdin"));
                        };
                        let reply =
                            error_response(id, INVALID_REQUEST, &format!("[toolwall] {too_long}"));
                        let mut w = stdout.lock().await;
                        w.write_all(&reply).await?;
                        w.write_all(b"\n").await?;
                        w.flush().await?;
                        continue;
                    }
                };
                let (forward, replies) = {
                    let mut f = filter.lock().unwrap_or_else(|e| e.into_inner());
                    let out = f.from_client(strip_newline(&line));
                    (
                        out.forward.map(|c| Bytes::from(c.into_owned())),
                        out.replies,
                    )
                };
                if !replies.is_empty() {
                    let mut w = stdout.lock().await;
                    for r in replies {
                        w.write_all(&r).await?;
                        w.write_all(b"\n").await?;
                    }
                    w.flush().await?;
                }
                if let Some(message) = forward {
                    if let Err(e) = session.send(message.clone()).await {
                        // A refused request is answered, so the client does not wait for ever.
                        let mut w = stdout.lock().await;
                        for id in request_ids(&message) {
                            let reply = error_response(
                                &id,
                                INTERNAL_ERROR,
                                &format!(
                                    "[toolwall] the upstream MCP server refused the request: {e}"
                                ),
                            );
                            w.write_all(&reply).await?;
                            w.write_all(b"\n").await?;
                        }
                        w.flush().await?;
                        drop(w);
                        report_send_error(&shared, e);
                    } else if !get_opened {
                        get_opened = true;
                        if let Err(e) = session.open_get_stream(None).await {
                            shared.lost(e);
                        }
                    }
                }
            }
            if eof {
                return Ok::<(), anyhow::Error>(());
            }
        }
    };
    tokio::select! {
        result = up => result?,
        result = down => result.context("writing stdout")?,
    }
    if let Ok(session) = Arc::try_unwrap(session) {
        session.close().await;
    }
    Ok(())
}

/// A message as one line: SSE data may legally hold a pretty-printed (multi-line) message.
fn one_line(message: &[u8]) -> Cow<'_, [u8]> {
    if memchr::memchr(b'\n', message).is_none() {
        return Cow::Borrowed(message);
    }
    match serde_json::from_slice::<Value>(message).and_then(|v| serde_json::to_vec(&v)) {
        Ok(compact) => Cow::Owned(compact),
        Err(_) => Cow::Owned(
            message
                .iter()
                .map(|b| if *b == b'\n' { b' ' } else { *b })
                .collect(),
        ),
    }
}

/// A failed upstream send: connection-level failures end the proxy; an HTTP refusal of one
/// message is logged (the client's request then times out as it would against the server).
fn report_send_error(shared: &Shared, e: McpClientError) {
    match e {
        McpClientError::Connect { .. } | McpClientError::Closed { .. } => shared.lost(e),
        other => tracing::warn!("upstream refused a message: {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP server

type ProxyBody = BoxBody<Bytes, Infallible>;

/// A response body fed by a channel (our SSE streams).
struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|item| item.map(|b| Ok(Frame::data(b))))
    }
}

fn full(
    status: StatusCode,
    content_type: Option<&'static str>,
    body: impl Into<Bytes>,
) -> Response<ProxyBody> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    if let Some(ct) = content_type {
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    response
}

fn plain(status: StatusCode, text: &str) -> Response<ProxyBody> {
    full(status, Some("text/plain; charset=utf-8"), text.to_owned())
}

fn sse_response(rx: mpsc::Receiver<Bytes>) -> Response<ProxyBody> {
    let mut response = Response::new(ChannelBody(rx).boxed());
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

async fn serve_http(shared: Arc<Shared>, listen: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    if !listen.ip().is_loopback() {
        tracing::warn!(%listen, "listening beyond loopback: anyone who can reach this address can use the upstream's allowed tools");
    }
    tracing::info!(
        "MCP filter proxy on http://{listen}/mcp (Streamable HTTP) and http://{listen}/sse (legacy SSE)"
    );
    let mut backoff = AcceptBackoff::default();
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => {
                backoff.reset();
                s
            }
            Err(e) => {
                backoff.failed(&e).await;
                continue;
            }
        };
        // Replies are written in pieces (headers, then SSE events): without this, Nagle's
        // algorithm meets the client's delayed ACK and every call waits ~40 ms.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(shared, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!("client connection: {e}");
            }
        });
    }
}

/// Waits after a failed `accept`: out of file descriptors (EMFILE, ENFILE) or memory the
/// listener stays readable, so retrying at once would spin and log without end. The wait
/// doubles from 10 ms to 1 s; the error is logged once per wait that grows, then once a minute.
#[derive(Default)]
struct AcceptBackoff {
    wait: Duration,
    failures: u64,
    last_log: Option<tokio::time::Instant>,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MOST: Duration = Duration::from_secs(1);

    async fn failed(&mut self, error: &std::io::Error) {
        self.failures += 1;
        self.wait = (self.wait * 2).clamp(Self::FIRST, Self::MOST);
        let now = tokio::time::Instant::now();
        if self
            .last_log
            .is_none_or(|t| self.wait < Self::MOST || now - t >= Duration::from_secs(60))
        {
            tracing::warn!(
                failures = self.failures,
                "cannot accept a client connection ({error}); retrying in {:?}",
                self.wait
            );
            self.last_log = Some(now);
        }
        tokio::time::sleep(self.wait).await;
    }

    fn reset(&mut self) {
        if self.failures > 0 {
            tracing::info!(
                failures = self.failures,
                "accepting client connections again"
            );
        }
        *self = Self::default();
    }
}

/// Whether an I/O error is the process or the system out of file descriptors: a passing
/// shortage of ours, not a sign that the upstream is gone.
fn out_of_descriptors(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(io.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
        {
            return true;
        }
        source = e.source();
    }
    false
}

/// Reads a client's request body: at most `limit` bytes (a larger body is answered 413 as
/// soon as its `Content-Length` or its bytes say so; the rest is never read) within `timeout`.
async fn read_body(
    body: Incoming,
    headers: &HeaderMap,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, Response<ProxyBody>> {
    let too_large = || {
        let message = format!(
            "[toolwall] the request body is larger than {limit} bytes (raise it with --max-message-bytes); it was not forwarded"
        );
        full(
            StatusCode::PAYLOAD_TOO_LARGE,
            Some("application/json"),
            error_response("null", INVALID_REQUEST, &message),
        )
    };
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(timeout, http_body_util::Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(_)) => Err(plain(
            StatusCode::BAD_REQUEST,
            "cannot read the request body",
        )),
        Err(_) => Err(plain(
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive in time",
        )),
    }
}

/// Whether a request says it has a body (GET and DELETE must not: the proxy would not judge it).
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(http::header::TRANSFER_ENCODING)
        || headers
            .get(http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// 405 with the methods a route serves.
fn not_allowed(allow: &'static str) -> Response<ProxyBody> {
    let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    response
        .headers_mut()
        .insert(http::header::ALLOW, HeaderValue::from_static(allow));
    response
}

/// Browsers send `Origin`; only localhost pages and `--allow-origin` ones may use the proxy
/// (DNS-rebinding defence, as the MCP spec asks of local servers). Non-browser clients send
/// no `Origin`.
fn origin_allowed(allow_origins: &[String], headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(http::header::ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    if allow_origins.iter().any(|o| o == origin) {
        return true;
    }
    let Ok(uri) = origin.parse::<Uri>() else {
        return false;
    };
    matches!(
        uri.host(),
        Some("localhost" | "127.0.0.1" | "[::1]" | "::1")
    )
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ProxyBody> {
    if !origin_allowed(&shared.allow_origins, req.headers()) {
        return plain(StatusCode::FORBIDDEN, "origin not allowed");
    }
    let path = req.uri().path().to_owned();
    // Only the methods the transports define are served; nothing else is forwarded (a
    // future server might act on a PUT the filter never judged). A GET or DELETE with a body
    // is refused for the same reason.
    let method = req.method().clone();
    if matches!(method, Method::GET | Method::DELETE) && has_body(req.headers()) {
        return plain(
            StatusCode::BAD_REQUEST,
            "a GET or DELETE request has no body",
        );
    }
    match (method, path.as_str()) {
        (Method::POST | Method::GET | Method::DELETE, "/mcp")
            if shared.transport == Transport::StreamableHttp =>
        {
            passthrough(shared, req).await
        }
        (Method::POST | Method::GET | Method::DELETE, "/mcp") => {
            bridge_streamable(shared, req).await
        }
        (_, "/mcp") => not_allowed("GET, POST, DELETE"),
        (Method::GET, "/sse") => sse_open(shared, req).await,
        (Method::POST, "/message") => sse_message(shared, req).await,
        (_, "/sse") => not_allowed("GET"),
        (_, "/message") => not_allowed("POST"),
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found: use /mcp (Streamable HTTP) or /sse (legacy SSE)",
        ),
    }
}

const HOP_BY_HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

/// The client's headers minus hop-by-hop ones and `Origin` (checked here; the upstream sees
/// the proxy, not the browser), plus the configured upstream headers where the client has none.
fn upstream_headers(shared: &Shared, client: &HeaderMap) -> HeaderMap {
    merge_headers(&shared.upstream_headers, client)
}

fn merge_headers(configured: &HeaderMap, client: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(client.len() + configured.len());
    for (name, value) in client {
        if !HOP_BY_HOP.contains(&name.as_str()) && name != http::header::ORIGIN {
            headers.append(name.clone(), value.clone());
        }
    }
    for name in configured.keys() {
        if !headers.contains_key(name) {
            for value in configured.get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
    }
    // The filter reads the upstream's bytes: a compressed reply could not be inspected (and
    // would be refused), so ask for none, whatever the client accepts.
    headers.insert(
        http::header::ACCEPT_ENCODING,
        http::HeaderValue::from_static("identity"),
    );
    headers
}

fn json_reply(mut replies: Vec<Vec<u8>>) -> Response<ProxyBody> {
    match replies.len() {
        0 => full(StatusCode::ACCEPTED, None, Bytes::new()),
        1 => full(StatusCode::OK, Some("application/json"), replies.remove(0)),
        _ => full(
            StatusCode::OK,
            Some("application/json"),
            join_array(None, &replies),
        ),
    }
}

/// `[first..., replies...]`: a filtered JSON body (object or batch) with our replies added.
fn join_array(first: Option<&[u8]>, replies: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![b'['];
    let mut sep = false;
    if let Some(first) = first {
        let trimmed = first.trim_ascii();
        match trimmed
            .strip_prefix(b"[")
            .and_then(|t| t.strip_suffix(b"]"))
        {
            Some(inner) if !inner.trim_ascii().is_empty() => {
                out.extend_from_slice(inner);
                sep = true;
            }
            Some(_) => {}
            None => {
                out.extend_from_slice(trimmed);
                sep = true;
            }
        }
    }
    for r in replies {
        if sep {
            out.push(b',');
        }
        out.extend_from_slice(r);
        sep = true;
    }
    out.push(b']');
    out
}

/// Forwards one request to the upstream; connection failures end the proxy.
async fn forward(
    shared: &Shared,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response<Incoming>, Response<ProxyBody>> {
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = method;
    *request.uri_mut() = shared.upstream.clone();
    *request.headers_mut() = headers;
    match tokio::time::timeout(shared.timeout, shared.http.request(request)).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(e)) if out_of_descriptors(&e) => {
            tracing::warn!("cannot forward a request, out of file descriptors: {e}");
            Err(plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "toolwall is out of file descriptors; try again",
            ))
        }
        Ok(Err(e)) => {
            shared.lost(format!("forwarding a request: {e}"));
            Err(plain(
                StatusCode::BAD_GATEWAY,
                "upstream MCP server unreachable",
            ))
        }
        Err(_) => Err(plain(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream MCP server did not answer in time",
        )),
    }
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        })
}

/// Streamable HTTP to Streamable HTTP, at the HTTP level.
async fn passthrough(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ProxyBody> {
    let (parts, body) = req.into_parts();
    let session = parts
        .headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // The session's GET stream goes ahead of its requests ([`StreamOrder`]).
    let opening = match (&parts.method, &session) {
        (&Method::GET, Some(session)) => Some(shared.streams.opening(session.clone())),
        (&Method::DELETE, Some(session)) => {
            shared.streams.ended(session);
            None
        }
        _ => None,
    };
    let mut filter = shared.filter();
    let mut replies = Vec::new();
    // GET and DELETE carry no body (checked in `handle`); a POST's is judged and what goes
    // upstream is the filter's canonical text.
    let forward_body = if parts.method == Method::POST {
        let body = match read_body(body, &parts.headers, shared.max_message, shared.timeout).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let out = filter.from_client(&body);
        replies = out.replies;
        let text = match out.forward {
            None => return json_reply(replies),
            Some(text) => Bytes::from(text.into_owned()),
        };
        if let Some(session) = &session
            && !request_ids(&text).is_empty()
        {
            shared.streams.before_request(session, shared.timeout).await;
        }
        // The upstream may route on the 2026-07-28 headers: they must say what the body says.
        if let Err(mismatch) = headers::check(&parts.headers, &text) {
            tracing::warn!("refused a request: {mismatch}");
            let id = request_ids(&text).into_iter().next();
            return full(
                StatusCode::BAD_REQUEST,
                Some("application/json"),
                error_response(
                    id.as_deref().unwrap_or("null"),
                    headers::HEADER_MISMATCH,
                    &format!("[toolwall] {mismatch}"),
                ),
            );
        }
        text
    } else {
        Bytes::new()
    };
    let headers = upstream_headers(&shared, &parts.headers);
    let response = match forward(&shared, parts.method.clone(), headers, forward_body).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    drop(opening);
    let (mut rparts, rbody) = response.into_parts();
    for name in HOP_BY_HOP {
        rparts.headers.remove(name);
    }
    if is_event_stream(&rparts.headers) {
        let body = FilteredSse::new(rbody, filter, replies, shared.fatal.clone());
        let mut response = Response::new(body.boxed());
        *response.status_mut() = rparts.status;
        // The upstream's headers as they were (repeated ones included); it already says
        // `text/event-stream`.
        *response.headers_mut() = rparts.headers;
        return response;
    }
    let rbody = match rbody.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            shared.lost(format!("reading a response: {e}"));
            return plain(
                StatusCode::BAD_GATEWAY,
                "upstream MCP server broke the response",
            );
        }
    };
    // Any successful non-stream body is a JSON-RPC message whatever its content type says:
    // a client may parse it regardless, so it is filtered (and dropped if it is not JSON).
    let out_body: Bytes = if rparts.status.is_success() && !rbody.is_empty() {
        let out = filter.from_server(&rbody);
        match (out.forward, replies.is_empty()) {
            (Some(Cow::Borrowed(b)), true) if b.len() == rbody.len() => rbody.clone(),
            (Some(f), true) => Bytes::from(f.into_owned()),
            (Some(f), false) => Bytes::from(join_array(Some(&f), &replies)),
            (None, _) => Bytes::from(join_array(None, &replies)),
        }
    } else if !replies.is_empty() && rparts.status == StatusCode::ACCEPTED {
        // Only notifications went upstream; the refused calls still need their answers.
        return json_reply(replies);
    } else {
        rbody
    };
    let mut response = Response::new(Full::new(out_body).boxed());
    *response.status_mut() = rparts.status;
    *response.headers_mut() = rparts.headers;
    response
}

// ---------------------------------------------------------------------------------------------
// Bridged sessions: a client session served from one UpstreamSession.

/// One client session bridged to its own upstream session.
struct BridgedSession {
    upstream: UpstreamSession,
    filter: Mutex<Filter>,
    /// The client's stream (legacy SSE stream, or the Streamable HTTP GET stream).
    stream: Mutex<Option<mpsc::Sender<Bytes>>>,
    /// Server messages waiting for a GET stream (Streamable HTTP client, bounded).
    queued: Mutex<Vec<Bytes>>,
    /// Requests of Streamable HTTP POSTs waiting for their responses, by id.
    waiting: Mutex<HashMap<String, mpsc::Sender<Bytes>>>,
    get_opened: std::sync::atomic::AtomicBool,
}

const MAX_QUEUED: usize = 256;

fn new_session_id() -> String {
    let mut bytes = [0u8; 16];
    // SAFETY: the buffer is valid for its length; getrandom writes at most that many bytes.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // Unreachable on Linux ≥ 3.17 for 16 bytes; fall back to time and address entropy.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        bytes = (t ^ (&bytes as *const _ as u128)).to_le_bytes();
    }
    hex::encode(bytes)
}

/// The `id`s of the requests in a message (or batch), as canonical JSON text.
fn request_ids(message: &[u8]) -> Vec<String> {
    let Ok(value) = serde_json::from_slice::<Value>(message) else {
        return Vec::new();
    };
    let items = match value {
        Value::Array(items) => items,
        single => vec![single],
    };
    items
        .iter()
        .filter(|m| m.get("method").is_some())
        .filter_map(|m| m.get("id").map(Value::to_string))
        .collect()
}

/// The `id` of a response, as canonical JSON text.
fn response_id(message: &[u8]) -> Option<String> {
    let value = serde_json::from_slice::<Value>(message).ok()?;
    if value.get("method").is_some() {
        return None;
    }
    value.get("id").map(Value::to_string)
}

impl BridgedSession {
    /// Delivers one (filtered) server message: to the POST waiting for it, else the stream,
    /// else the queue. Returns false when the client is gone.
    async fn deliver(&self, message: Bytes) -> bool {
        if let Some(id) = response_id(&message) {
            let waiter = self.waiting.lock().ok().and_then(|mut w| w.remove(&id));
            if let Some(waiter) = waiter {
                let _ = waiter.send(message).await;
                return true;
            }
        }
        let stream = self.stream.lock().ok().and_then(|s| s.clone());
        match stream {
            Some(tx) => tx
                .send(Bytes::from(encode_event(Some("message"), None, &message)))
                .await
                .is_ok(),
            None => {
                if let Ok(mut q) = self.queued.lock() {
                    if q.len() < MAX_QUEUED {
                        q.push(message);
                    } else {
                        tracing::warn!("client has no stream open; dropping a server message");
                    }
                }
                true
            }
        }
    }

    /// Filters a client message and sends what passes upstream. Returns what was sent (`None`
    /// when nothing was, or the upstream refused it) and the replies the client gets from
    /// toolwall: refused calls, and an error for each request the upstream refused to take.
    async fn client_message(&self, shared: &Shared, body: &[u8]) -> (Option<Bytes>, Vec<Vec<u8>>) {
        let (forward, replies) = {
            let mut f = self.filter.lock().unwrap_or_else(|e| e.into_inner());
            let out = f.from_client(body);
            (
                out.forward.map(|c| Bytes::from(c.into_owned())),
                out.replies,
            )
        };
        let mut replies = replies;
        if let Some(message) = &forward {
            if let Err(e) = self.upstream.send(message.clone()).await {
                for id in request_ids(message) {
                    replies.push(error_response(
                        &id,
                        INTERNAL_ERROR,
                        &format!("[toolwall] the upstream MCP server refused the request: {e}"),
                    ));
                }
                report_send_error(shared, e);
                return (None, replies);
            } else if !self
                .get_opened
                .swap(true, std::sync::atomic::Ordering::Relaxed)
                && let Err(e) = self.upstream.open_get_stream(None).await
            {
                tracing::warn!("upstream GET stream: {e}");
            }
        }
        (forward, replies)
    }
}

/// Opens an upstream session for a new client session and starts delivering its messages.
async fn bridge(
    shared: &Arc<Shared>,
    headers: &HeaderMap,
    stream: Option<mpsc::Sender<Bytes>>,
) -> Result<Arc<BridgedSession>, Response<ProxyBody>> {
    // The session sets its own protocol headers; the client's others (auth) go along.
    let mut headers = upstream_headers(shared, headers);
    for name in [
        "accept",
        "content-type",
        "last-event-id",
        "mcp-session-id",
        "mcp-protocol-version",
    ] {
        headers.remove(name);
    }
    let (upstream, mut inbox) = match UpstreamSession::open(
        &shared.upstream.to_string(),
        shared.transport,
        headers,
        shared.timeout,
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            if matches!(e, McpClientError::Connect { .. }) {
                shared.lost(&e);
            }
            return Err(plain(StatusCode::BAD_GATEWAY, &e.to_string()));
        }
    };
    let session = Arc::new(BridgedSession {
        upstream,
        filter: Mutex::new(shared.filter()),
        stream: Mutex::new(stream),
        queued: Mutex::default(),
        waiting: Mutex::default(),
        get_opened: std::sync::atomic::AtomicBool::new(false),
    });
    let weak = Arc::downgrade(&session);
    let shared2 = shared.clone();
    tokio::spawn(async move {
        while let Some(item) = inbox.recv().await {
            let Some(session) = weak.upgrade() else {
                return;
            };
            let message = match item {
                Ok(m) => m,
                Err(e) => {
                    shared2.lost(e);
                    return;
                }
            };
            let filtered = {
                let mut f = session.filter.lock().unwrap_or_else(|e| e.into_inner());
                f.from_server(&message)
                    .forward
                    .map(|c| Bytes::from(one_line(&c).into_owned()))
            };
            if let Some(m) = filtered
                && !session.deliver(m).await
            {
                return;
            }
        }
    });
    Ok(session)
}

/// Legacy SSE client: `GET /sse` opens a session; the first event names our `/message` URL.
async fn sse_open(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ProxyBody> {
    let (tx, rx) = mpsc::channel(64);
    let id = new_session_id();
    let endpoint = encode_event(
        Some("endpoint"),
        None,
        format!("/message?sessionId={id}").as_bytes(),
    );
    if tx.send(Bytes::from(endpoint)).await.is_err() {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "stream closed");
    }
    let session = match bridge(&shared, req.headers(), Some(tx.clone())).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    if let Ok(mut map) = shared.sse_sessions.lock() {
        map.insert(id.clone(), session.clone());
    }
    // When the client goes away, end its upstream session.
    let shared2 = shared.clone();
    tokio::spawn(async move {
        tx.closed().await;
        let session = shared2
            .sse_sessions
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&id));
        drop(session);
    });
    sse_response(rx)
}

fn query_param<'a>(uri: &'a Uri, key: &str) -> Option<&'a str> {
    uri.query()?.split('&').find_map(|kv| {
        kv.split_once('=')
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v)
    })
}

/// Legacy SSE client: `POST /message?sessionId=...`; answers come on the stream.
async fn sse_message(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ProxyBody> {
    let Some(id) = query_param(req.uri(), "sessionId").map(str::to_owned) else {
        return plain(StatusCode::BAD_REQUEST, "missing sessionId");
    };
    let Some(session) = shared
        .sse_sessions
        .lock()
        .ok()
        .and_then(|m| m.get(&id).cloned())
    else {
        return plain(StatusCode::NOT_FOUND, "unknown session");
    };
    let (parts, body) = req.into_parts();
    let body = match read_body(body, &parts.headers, shared.max_message, shared.timeout).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (_, replies) = session.client_message(&shared, &body).await;
    for r in replies {
        session.deliver(Bytes::from(r)).await;
    }
    plain(StatusCode::ACCEPTED, "Accepted")
}

/// Streamable HTTP client in front of a legacy SSE upstream: POST answered with the
/// responses to its requests (JSON), GET carries everything else, DELETE ends the session.
async fn bridge_streamable(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ProxyBody> {
    let session_id = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let existing = session_id
        .as_ref()
        .and_then(|id| shared.bridged.lock().ok().and_then(|m| m.get(id).cloned()));
    match (req.method().clone(), existing, session_id) {
        (Method::POST, existing, sid) => {
            let (session, id) = match (existing, sid) {
                (Some(s), Some(id)) => (s, id),
                (None, Some(_)) => return plain(StatusCode::NOT_FOUND, "unknown session"),
                (_, None) => {
                    let session = match bridge(&shared, req.headers(), None).await {
                        Ok(s) => s,
                        Err(r) => return r,
                    };
                    let id = new_session_id();
                    if let Ok(mut map) = shared.bridged.lock() {
                        map.insert(id.clone(), session.clone());
                    }
                    (session, id)
                }
            };
            let (parts, body) = req.into_parts();
            let body =
                match read_body(body, &parts.headers, shared.max_message, shared.timeout).await {
                    Ok(b) => b,
                    Err(r) => return r,
                };
            // Register the waiters before sending, so a fast answer is not missed.
            let ids = request_ids(&body);
            let (tx, mut rx) = mpsc::channel(ids.len().max(1));
            if let Ok(mut w) = session.waiting.lock() {
                for id in &ids {
                    w.insert(id.clone(), tx.clone());
                }
            }
            let (forward, mut replies) = session.client_message(&shared, &body).await;
            // Ids answered locally (refused calls, cached lists) or not sent do not wait.
            let sent_ids = forward.as_deref().map(request_ids).unwrap_or_default();
            if let Ok(mut w) = session.waiting.lock() {
                for id in ids.iter().filter(|id| !sent_ids.contains(id)) {
                    w.remove(id);
                }
            }
            // Each answer, or an error once `--timeout` has passed: a POST never waits for ever.
            let deadline = tokio::time::Instant::now() + shared.timeout;
            let mut unanswered = sent_ids;
            while !unanswered.is_empty() {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(m)) => {
                        if let Some(id) = response_id(&m) {
                            unanswered.retain(|u| *u != id);
                        }
                        replies.push(m.to_vec());
                    }
                    Ok(None) => break,
                    Err(_) => {
                        if let Ok(mut w) = session.waiting.lock() {
                            for id in &unanswered {
                                w.remove(id);
                            }
                        }
                        for id in unanswered.drain(..) {
                            replies.push(error_response(
                                &id,
                                REQUEST_TIMEOUT,
                                "[toolwall] the upstream MCP server did not answer in time",
                            ));
                        }
                    }
                }
            }
            let mut response = json_reply(replies);
            if let Ok(v) = HeaderValue::from_str(&id) {
                response.headers_mut().insert(SESSION_HEADER, v);
            }
            response
        }
        (Method::GET, Some(session), _) => {
            let (tx, rx) = mpsc::channel(64);
            let queued = session
                .queued
                .lock()
                .map(|mut q| std::mem::take(&mut *q))
                .unwrap_or_default();
            for m in queued {
                let _ = tx
                    .send(Bytes::from(encode_event(Some("message"), None, &m)))
                    .await;
            }
            if let Ok(mut s) = session.stream.lock() {
                *s = Some(tx);
            }
            sse_response(rx)
        }
        (Method::DELETE, Some(_), Some(id)) => {
            let session = shared.bridged.lock().ok().and_then(|mut m| m.remove(&id));
            drop(session);
            full(StatusCode::OK, None, Bytes::new())
        }
        (Method::GET | Method::DELETE, _, _) => plain(StatusCode::NOT_FOUND, "unknown session"),
        _ => plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_array_merges_bodies_and_replies() {
        let r = vec![b"{\"id\":2}".to_vec()];
        assert_eq!(
            join_array(Some(b"{\"id\":1}"), &r),
            b"[{\"id\":1},{\"id\":2}]"
        );
        assert_eq!(
            join_array(Some(b" [{\"id\":1}] "), &r),
            b"[{\"id\":1},{\"id\":2}]"
        );
        assert_eq!(join_array(Some(b"[]"), &r), b"[{\"id\":2}]");
        assert_eq!(join_array(None, &r), b"[{\"id\":2}]");
    }

    #[test]
    fn ids_and_params() {
        assert_eq!(
            request_ids(br#"[{"id":1,"method":"a"},{"id":"x","method":"b"},{"method":"n"},{"id":3,"result":{}}]"#),
            vec!["1".to_owned(), "\"x\"".to_owned()]
        );
        assert_eq!(
            response_id(br#"{"id":"x","result":{}}"#).as_deref(),
            Some("\"x\"")
        );
        let uri: Uri = "/message?a=1&sessionId=abc".parse().unwrap();
        assert_eq!(query_param(&uri, "sessionId"), Some("abc"));
        assert_eq!(new_session_id().len(), 32);
        assert_ne!(new_session_id(), new_session_id());
    }

    #[test]
    fn origins_are_checked() {
        let allow = vec!["https://app.example".to_owned()];
        let with = |origin: &str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::ORIGIN, HeaderValue::from_str(origin).unwrap());
            origin_allowed(&allow, &h)
        };
        assert!(origin_allowed(&allow, &HeaderMap::new()));
        assert!(with("http://localhost:6274"));
        assert!(with("http://127.0.0.1"));
        assert!(with("http://[::1]:3000"));
        assert!(with("https://app.example"));
        assert!(!with("https://evil.example"));
        assert!(!with("http://localhost.evil.example"));
        assert!(!with("null"));
    }

    #[test]
    fn auth_passes_and_hop_by_hop_and_origin_do_not() {
        let configured =
            parse_headers(&["X-Api-Key: k1".into(), "Authorization: Bearer cfg".into()]).unwrap();
        let mut client = HeaderMap::new();
        client.insert("authorization", HeaderValue::from_static("Bearer client"));
        client.insert("host", HeaderValue::from_static("127.0.0.1:8090"));
        client.insert("origin", HeaderValue::from_static("http://localhost"));
        client.insert("connection", HeaderValue::from_static("keep-alive"));
        client.insert("last-event-id", HeaderValue::from_static("7"));
        let merged = merge_headers(&configured, &client);
        assert_eq!(merged.get("authorization").unwrap(), "Bearer client");
        assert_eq!(merged.get("x-api-key").unwrap(), "k1");
        assert_eq!(merged.get("last-event-id").unwrap(), "7");
        for gone in ["host", "origin", "connection"] {
            assert!(merged.get(gone).is_none(), "{gone}");
        }
        assert!(parse_headers(&["no colon".into()]).is_err());
    }

    #[test]
    fn one_line_compacts_multiline_messages() {
        assert_eq!(one_line(b"{\n\"a\": 1\n}").as_ref(), b"{\"a\":1}");
        assert_eq!(one_line(b"{\"a\":1}").as_ref(), b"{\"a\":1}");
    }
}
