//! The proxy's routes: its listener (on the shared accept back-off of `edge.rs`), the routes
//! and the methods they serve, request bodies (bounded), and what every response is built from.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// A response body: ours, or the upstream's filtered; its error (an upstream stream that
/// broke) ends the client's connection without the end of its body, so the client sees the
/// break.
pub(super) type ProxyBody = BoxBody<Bytes, BoxError>;

/// What a client stream's channel carries: bytes to write, and the charge of the message they
/// hold (released once they are handed to the connection).
pub(super) type Outbound = (Bytes, Option<Charge>);

/// A response body fed by a channel (our SSE streams).
pub(super) struct ChannelBody(mpsc::Receiver<Outbound>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0
            .poll_recv(cx)
            .map(|item| item.map(|(b, _charge)| Ok(Frame::data(b))))
    }
}

pub(super) fn full(
    status: StatusCode,
    content_type: Option<&'static str>,
    body: impl Into<Bytes>,
) -> Response<ProxyBody> {
    let mut response = Response::new(whole(body.into()));
    *response.status_mut() = status;
    if let Some(ct) = content_type {
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    response
}

/// A body of known bytes.
pub(super) fn whole(body: Bytes) -> ProxyBody {
    Full::new(body).map_err(|never| match never {}).boxed()
}

pub(super) fn plain(status: StatusCode, text: &str) -> Response<ProxyBody> {
    full(status, Some("text/plain; charset=utf-8"), text.to_owned())
}

pub(super) fn sse_response(rx: mpsc::Receiver<Outbound>) -> Response<ProxyBody> {
    let mut response = Response::new(ChannelBody(rx).boxed());
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

pub(super) async fn serve_http(
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
) -> anyhow::Result<()> {
    let listen = listener.local_addr().context("the listener's address")?;
    let listener =
        tokio::net::TcpListener::from_std(listener).context("serve the held listener")?;
    if !listen.ip().is_loopback() {
        tracing::warn!(%listen, "listening beyond loopback: anyone who can reach this address can use the upstream's allowed tools");
    }
    tracing::info!(
        "MCP filter proxy on http://{listen}/mcp (Streamable HTTP) and http://{listen}/sse (legacy SSE)"
    );
    // Serves until the process ends (interrupted, or the upstream lost).
    let never = std::future::pending();
    crate::edge::accept_loop(&listener, never, Duration::ZERO, |(stream, _), _| {
        // Replies are written in pieces (headers, then SSE events): without this, Nagle's
        // algorithm meets the client's delayed ACK and every call waits ~40 ms.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
        let shared = shared.clone();
        Some(async move {
            let upstream = Arc::new(UpstreamConn::default());
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                let upstream = upstream.clone();
                async move { Ok::<_, Infallible>(handle(shared, &upstream, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!("client connection: {e}");
            }
        })
    })
    .await;
    Ok(())
}

/// Whether an I/O error is the process or the system out of file descriptors: a passing
/// shortage of ours, not a sign that the upstream is gone.
pub(super) fn out_of_descriptors(error: &(dyn std::error::Error + 'static)) -> bool {
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
pub(super) async fn read_body(
    body: Incoming,
    headers: &HeaderMap,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, Response<ProxyBody>> {
    crate::edge::read_body(body, headers, limit, timeout)
        .await
        .map_err(|error| match error {
            crate::edge::BodyError::TooLarge(limit) => {
                let message = format!(
                    "[toolwall] the request body is larger than {limit} bytes (raise it with --max-message-bytes); it was not forwarded"
                );
                full(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    Some("application/json"),
                    error_response("null", INVALID_REQUEST, &message),
                )
            }
            crate::edge::BodyError::Unreadable => {
                plain(StatusCode::BAD_REQUEST, "cannot read the request body")
            }
            crate::edge::BodyError::TimedOut(_) => plain(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time",
            ),
        })
}

/// Whether a request says it has a body (GET and DELETE must not: the proxy would not judge it).
pub(super) fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(http::header::TRANSFER_ENCODING)
        || headers
            .get(http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// 405 with the methods a route serves.
pub(super) fn not_allowed(allow: &'static str) -> Response<ProxyBody> {
    let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    response
        .headers_mut()
        .insert(http::header::ALLOW, HeaderValue::from_static(allow));
    response
}

/// Browsers send `Origin`; only localhost pages and `--allow-origin` ones may use the proxy
/// (DNS-rebinding defence, as the MCP spec asks of local servers). Non-browser clients send
/// no `Origin`.
pub(super) fn origin_allowed(allow_origins: &[String], headers: &HeaderMap) -> bool {
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

/// Longest `Mcp-Session-Id` accepted (servers make UUIDs or hex of 32–64 bytes).
const MAX_SESSION_ID: usize = 256;

pub(super) async fn handle(
    shared: Arc<Shared>,
    upstream: &UpstreamConn,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    if !origin_allowed(&shared.allow_origins, req.headers()) {
        return plain(StatusCode::FORBIDDEN, "origin not allowed");
    }
    // Session ids are kept (stream order, bridged sessions): the spec's visible ASCII, bounded.
    if let Some(id) = req.headers().get(SESSION_HEADER)
        && (id.len() > MAX_SESSION_ID || !id.as_bytes().iter().all(|b| (0x21..=0x7e).contains(b)))
    {
        return plain(
            StatusCode::BAD_REQUEST,
            "Mcp-Session-Id must be visible ASCII of at most 256 bytes",
        );
    }
    // A client whose calls the store cannot keep up with waits before its body is read.
    if let Some(sink) = &shared.ctx.events {
        sink.room().await;
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
        (Method::GET, p)
            if p == METADATA_PREFIX
                || p.strip_prefix(METADATA_PREFIX)
                    .is_some_and(|rest| rest.starts_with('/')) =>
        {
            protected_resource(&shared, &req).await
        }
        (Method::POST | Method::GET | Method::DELETE, "/mcp")
            if shared.transport == Transport::StreamableHttp =>
        {
            passthrough(shared, upstream, req).await
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

/// The client's headers minus hop-by-hop ones and `Origin` (checked here; the upstream sees
/// the proxy, not the browser), plus the configured upstream headers where the client has none.
pub(super) fn upstream_headers(shared: &Shared, client: &HeaderMap) -> HeaderMap {
    let lent = match shared.lend {
        true => &shared.upstream_headers,
        false => &HeaderMap::new(),
    };
    merge_headers(lent, client)
}

/// The client's headers for the upstream, with `lent` (the operator's `--upstream-header`s)
/// only when the client brings no `Authorization` of its own: credentials are never mixed.
pub(super) fn merge_headers(lent: &HeaderMap, client: &HeaderMap) -> HeaderMap {
    let configured = match client.contains_key(http::header::AUTHORIZATION) {
        true => &HeaderMap::new(),
        false => lent,
    };
    let mut headers = HeaderMap::with_capacity(client.len() + configured.len());
    for (name, value) in client {
        // The body that goes upstream is the filter's canonical UTF-8 JSON, not the client's:
        // the client's `Content-*` headers describe bytes the upstream never gets (a charset
        // of `utf-7` made an upstream decode a different call than the one judged). The Host
        // is the upstream's.
        if name != http::header::ORIGIN
            && name != http::header::HOST
            && !name.as_str().starts_with("content-")
        {
            headers.append(name.clone(), value.clone());
        }
    }
    crate::edge::strip_hop_by_hop(&mut headers);
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

pub(super) fn json_reply(mut replies: Vec<Vec<u8>>) -> Response<ProxyBody> {
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
pub(super) fn join_array(first: Option<&[u8]>, replies: &[Vec<u8>]) -> Vec<u8> {
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

pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The upstream connection of one client connection. A client connection's requests come one
/// at a time (HTTP/1), so one upstream connection serves them in turn: no pool to find it in
/// and no task per request to give it back (what the pooled client cost on every call). It
/// closes with its client connection.
#[derive(Default)]
pub(super) struct UpstreamConn {
    sender: Mutex<Option<SendRequest<Full<Bytes>>>>,
    /// The unread rest of the last answered response stream on this connection (normally
    /// its end chunk, which the connection's task delivers right after the answer): read
    /// before the next request is sent, so the connection is free for it.
    rest: Mutex<Option<Incoming>>,
}

impl UpstreamConn {
    fn take(&self) -> Option<SendRequest<Full<Bytes>>> {
        self.sender.lock().ok()?.take()
    }

    fn keep(&self, sender: SendRequest<Full<Bytes>>) {
        if let Ok(mut held) = self.sender.lock() {
            *held = Some(sender);
        }
    }

    /// Keeps the rest of an answered response stream until the next request.
    pub(super) fn hold_rest(&self, rest: Incoming) {
        if let Ok(mut held) = self.rest.lock() {
            *held = Some(rest);
        }
    }

    /// Reads what already arrived of the held rest, without waiting (the connection's task
    /// delivers the end chunk as soon as it comes, whether or not anyone reads). A rest that
    /// has not ended (a server streaming on past its answers) is dropped, and with it the
    /// connection: the request then goes on a new one, as it did while a task still read the
    /// rest. Until then it holds nothing the client connection does not hold already.
    async fn finish_rest(&self) {
        let Some(mut rest) = self.rest.lock().ok().and_then(|mut held| held.take()) else {
            return;
        };
        std::future::poll_fn(|cx| {
            // A few frames at most, as when the answer completed.
            for _ in 0..4 {
                if hyper::body::Body::is_end_stream(&rest) {
                    break;
                }
                match hyper::body::Body::poll_frame(Pin::new(&mut rest), cx) {
                    Poll::Ready(Some(Ok(_))) => continue,
                    Poll::Ready(Some(Err(_)) | None) | Poll::Pending => break,
                }
            }
            Poll::Ready(())
        })
        .await;
    }

    /// Sends `request` on the held connection when it is idle, else on a new one (which is
    /// then held); a busy one (the rest of an answered stream still being read) is let go.
    /// `handed` is set once hyper has the request to write: before that (a connect still
    /// under way) nothing can have reached the upstream.
    async fn send(
        &self,
        shared: &Shared,
        mut request: Request<Full<Bytes>>,
        handed: &AtomicBool,
    ) -> Result<Response<Incoming>, SendFailed> {
        self.finish_rest().await;
        if let Some(mut sender) = self.take().filter(SendRequest::is_ready) {
            handed.store(true, Ordering::Relaxed);
            let response = sender.try_send_request(request);
            self.keep(sender);
            match response.await {
                Ok(response) => return Ok(response),
                // Not written: the server closed the idle connection first. It goes on a new
                // one, as the pooled client retried it.
                Err(mut e) => match e.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(SendFailed::MaybeSent(e.into_error().into())),
                },
            }
        }
        let mut sender = connect(shared).await.map_err(SendFailed::Unsent)?;
        handed.store(true, Ordering::Relaxed);
        let response = sender.try_send_request(request);
        self.keep(sender);
        response.await.map_err(|mut e| match e.take_message() {
            Some(_) => SendFailed::Unsent(e.into_error().into()),
            None => SendFailed::MaybeSent(e.into_error().into()),
        })
    }
}

/// Why a request got no response from the upstream: whether it may have reached it decides
/// how its calls are recorded (refused, or as judged: they may have run).
#[derive(Debug)]
enum SendFailed {
    /// No connection, or hyper handed the request back unwritten.
    Unsent(BoxError),
    /// Written, in part or whole, before the connection failed.
    MaybeSent(BoxError),
}

/// A request [`forward`] got no response to: what the client is answered, and whether the
/// upstream may have had the request (then its calls may have run).
pub(super) struct NotForwarded {
    pub(super) response: Response<ProxyBody>,
    pub(super) may_have_run: bool,
}

/// A new HTTP/1 connection to the upstream; its task ends when the connection does.
async fn connect(shared: &Shared) -> Result<SendRequest<Full<Bytes>>, BoxError> {
    use tower_service::Service as _;
    let mut connector = shared.connector.clone();
    std::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
    let stream = connector.call(shared.upstream.clone()).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(stream).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("upstream connection: {e}");
        }
    });
    Ok(sender)
}

/// Forwards one request to the upstream on the client connection's upstream connection; a
/// failure is answered and makes the watchdog probe.
pub(super) async fn forward(
    shared: &Shared,
    upstream: &UpstreamConn,
    method: Method,
    mut headers: HeaderMap,
    body: Bytes,
) -> Result<Response<Incoming>, NotForwarded> {
    // The upstream's host, unless an `--upstream-header` names another (as the pooled client did).
    headers
        .entry(http::header::HOST)
        .or_insert_with(|| shared.upstream_host.clone());
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = method;
    *request.uri_mut() = shared.upstream_target.clone();
    *request.headers_mut() = headers;
    let handed = AtomicBool::new(false);
    let sending = upstream.send(shared, request, &handed);
    let failed = match tokio::time::timeout(shared.timeout, sending).await {
        Ok(Ok(response)) => return Ok(response),
        Ok(Err(failed)) => failed,
        // Past --timeout: once hyper had the request, the upstream may have it and may have
        // run it; a connect still under way sent nothing.
        Err(_) => {
            return Err(NotForwarded {
                response: plain(
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream MCP server did not answer in time",
                ),
                may_have_run: handed.load(Ordering::Relaxed),
            });
        }
    };
    let (e, may_have_run) = match failed {
        SendFailed::Unsent(e) => (e, false),
        SendFailed::MaybeSent(e) => (e, true),
    };
    let response = if out_of_descriptors(&*e) {
        tracing::warn!("cannot forward a request, out of file descriptors: {e}");
        plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "toolwall is out of file descriptors; try again",
        )
    } else {
        shared.suspect(format!("forwarding a request: {e}"));
        plain(StatusCode::BAD_GATEWAY, "upstream MCP server unreachable")
    };
    Err(NotForwarded {
        response,
        may_have_run,
    })
}
