//! The proxy's HTTP/1.1 client to the LLM APIs: connections kept alive per upstream, and a
//! response body read in large reads and de-chunked in place ([`chunked`]).
//!
//! Why not hyper's client (issue 19): the APIs send one HTTP chunk per SSE event, and hyper's
//! client hands a body over one chunk at a time through a channel between two tasks, a
//! cross-thread wake per ~200-byte event: 10–15 s of relay CPU per GB, 7–14x nginx's. Here a
//! read of up to 256 KiB holding hundreds of events becomes one slice, inspected and written at once.
//! HTTP/1.1 only (ALPN `http/1.1` over TLS), as the official SDKs speak to these APIs.
//! Response heads are parsed with `httparse` (hyper's own parser).

mod chunked;

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Response, StatusCode, Version};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use chunked::Chunked;

/// Bytes asked of the socket per read.
const READ_SIZE: usize = 256 * 1024;
/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle connections older than this are closed instead of reused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections kept per upstream.
const MAX_IDLE: usize = 32;
/// Longest wait for a response head, request body included: a non-streamed completion may
/// take minutes before its first byte (the SDKs' own time-out is 10 minutes).
const HEAD_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// Interim (1xx) responses accepted before the final one.
const MAX_INTERIM: usize = 8;

/// Why an exchange with the upstream failed (the client gets a 502 naming it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    #[error("cannot connect to {0}: {1}")]
    Connect(String, io::Error),
    #[error("connecting to {0} timed out")]
    ConnectTimeout(String),
    #[error("TLS with {0}: {1}")]
    Tls(String, io::Error),
    #[error("sending the request: {0}")]
    Write(io::Error),
    #[error("reading the client's request body: {0}")]
    RequestBody(hyper::Error),
    #[error("reading the response head: {0}")]
    Read(io::Error),
    #[error("upstream closed the connection before a response")]
    Closed,
    #[error("invalid response head: {0}")]
    Head(String),
    #[error("{0} with this body is not forwarded")]
    Method(Method),
    #[error("no response head within {} s", HEAD_TIMEOUT.as_secs())]
    HeadTimeout,
}

/// Where requests go: scheme, host and port of one upstream.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Origin {
    pub(crate) tls: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl Origin {
    fn authority(&self) -> String {
        let default = if self.tls { 443 } else { 80 };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == default {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

/// A connection to an upstream, plain or TLS.
enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Conn {
    /// An idle connection the server has not closed: the kernel has nothing to read on it
    /// (asked directly: the reactor's readiness may not have seen a FIN yet). A TLS connection
    /// with bytes waiting (a session ticket) is then polled once, with a no-op waker.
    fn is_reusable(&mut self) -> bool {
        use std::os::fd::AsRawFd as _;
        let fd = match self {
            Conn::Plain(s) => s.as_raw_fd(),
            Conn::Tls(s) => s.get_ref().0.as_raw_fd(),
        };
        let mut byte = 0u8;
        // SAFETY: a one-byte peek into a valid buffer on a socket this connection owns.
        let n = unsafe {
            libc::recv(
                fd,
                (&raw mut byte).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            return false;
        }
        if n < 0 {
            return std::io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock;
        }
        let Conn::Tls(_) = self else {
            // Unsolicited bytes on a plain idle connection: not the start of our response.
            return false;
        };
        let mut one = [0u8; 1];
        let mut buf = ReadBuf::new(&mut one);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        matches!(Pin::new(self).poll_read(&mut cx, &mut buf), Poll::Pending)
    }
}

/// The client: a TLS configuration and the idle connections.
pub(crate) struct Upstreams {
    tls: TlsConnector,
    /// Idle connections with the time until which each may be reused.
    idle: Mutex<HashMap<Origin, Vec<(Conn, Instant)>>>,
}

impl Upstreams {
    /// The client, with the system's root certificates.
    pub(crate) fn new() -> anyhow::Result<Arc<Self>> {
        use hyper_rustls::ConfigBuilderExt as _;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| anyhow::anyhow!("TLS setup: {e}"))?;
        let builder = match builder.clone().with_native_roots() {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "no system CA certificates: HTTPS upstreams will fail (install ca-certificates)");
                builder.with_root_certificates(rustls::RootCertStore::empty())
            }
        };
        let mut config = builder.with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(Upstreams {
            tls: TlsConnector::from(Arc::new(config)),
            idle: Mutex::new(HashMap::new()),
        }))
    }

    fn checkout(&self, origin: &Origin) -> Option<Conn> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(origin)?;
        while let Some((mut conn, until)) = list.pop() {
            if Instant::now() < until && conn.is_reusable() {
                return Some(conn);
            }
        }
        None
    }

    fn checkin(&self, origin: Origin, conn: Conn, idle_for: Duration) {
        if let Ok(mut idle) = self.idle.lock() {
            let now = Instant::now();
            let list = idle.entry(origin).or_default();
            list.retain(|(_, until)| now < *until);
            if list.len() < MAX_IDLE {
                list.push((conn, now + idle_for));
            }
        }
    }

    async fn connect(&self, origin: &Origin) -> Result<Conn, UpstreamError> {
        let name = origin.authority();
        let tcp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect((origin.host.as_str(), origin.port)),
        )
        .await
        .map_err(|_| UpstreamError::ConnectTimeout(name.clone()))?
        .map_err(|e| UpstreamError::Connect(name.clone(), e))?;
        tcp.set_nodelay(true)
            .map_err(|e| UpstreamError::Connect(name.clone(), e))?;
        if !origin.tls {
            return Ok(Conn::Plain(tcp));
        }
        let server = rustls::pki_types::ServerName::try_from(origin.host.clone())
            .map_err(|e| UpstreamError::Tls(name.clone(), io::Error::other(e)))?;
        let tls = tokio::time::timeout(CONNECT_TIMEOUT, self.tls.connect(server, tcp))
            .await
            .map_err(|_| UpstreamError::ConnectTimeout(name.clone()))?
            .map_err(|e| UpstreamError::Tls(name, e))?;
        Ok(Conn::Tls(Box::new(tls)))
    }

    /// Sends one request (`target`: path and query) with the client's headers (hop-by-hop ones
    /// already removed) and body, and reads the response head. The head is read while the
    /// body is still being written: an upstream that answers early (401, 413, 429) and stops
    /// reading is heard, not waited on for ever.
    pub(crate) async fn send(
        self: &Arc<Self>,
        origin: &Origin,
        method: &Method,
        target: &str,
        headers: &HeaderMap,
        body: Incoming,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let (head, chunked) = request_head(origin, method, target, headers, &body)?;
        let conn = match self.checkout(origin) {
            Some(conn) => conn,
            None => self.connect(origin).await?,
        };
        let (mut rd, mut wr) = tokio::io::split(conn);
        let mut buf = BytesMut::with_capacity(READ_SIZE);
        let exchange = async {
            let write = write_request(&mut wr, head, body, chunked);
            let read = read_head(&mut rd, &mut buf, method);
            tokio::pin!(write, read);
            let mut written = false;
            loop {
                tokio::select! {
                    // Once written, only the head is awaited.
                    result = &mut write, if !written => match result {
                        Ok(()) => written = true,
                        // The upstream may have answered and closed: its answer, if any.
                        Err(e) => return (read.await.map_err(|_| e), false),
                    },
                    head = &mut read => return (head, written),
                }
            }
        };
        let (head, written) = tokio::time::timeout(HEAD_TIMEOUT, exchange)
            .await
            .map_err(|_| UpstreamError::HeadTimeout)?;
        let (mut response, framing) = head?;
        let conn = rd.unsplit(wr);
        // Reused only when the whole request left, the response did not say close, and its
        // framing was unambiguous.
        let idle_for = idle_for(response.headers());
        let reusable =
            written && keep_alive(response.headers()) && framing.reusable && !idle_for.is_zero();
        let mut body = UpstreamBody {
            conn: Some(conn),
            buf,
            framing: framing.framing,
            reuse: reusable.then(|| (self.clone(), origin.clone(), idle_for)),
        };
        if matches!(body.framing, Framing::Length(0)) {
            // Nothing to read: hyper never polls an empty body, so the connection goes back now.
            body.finished();
        }
        *response.body_mut() = body;
        Ok(response)
    }
}

/// Whether a response lets its connection be kept: no `close` token in `Connection`.
fn keep_alive(headers: &HeaderMap) -> bool {
    !headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
}

/// How long a connection may wait idle for its next request: [`IDLE_TIMEOUT`], or less when
/// the server says it closes sooner (`Keep-Alive: timeout=N`, one second of margin; zero: do not
/// reuse it).
fn idle_for(headers: &HeaderMap) -> Duration {
    let server = headers
        .get_all("keep-alive")
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .find_map(|param| {
            let param = std::str::from_utf8(param).ok()?.trim();
            let (key, value) = param.split_once('=')?;
            key.trim()
                .eq_ignore_ascii_case("timeout")
                .then(|| value.trim().parse::<u64>().ok())?
        });
    match server {
        Some(secs) => IDLE_TIMEOUT.min(Duration::from_secs(secs.saturating_sub(1))),
        None => IDLE_TIMEOUT,
    }
}

/// Reads until a final (non-1xx) response head; parses only once a blank line has arrived.
async fn read_head<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    method: &Method,
) -> Result<(Response<UpstreamBody>, Framed), UpstreamError> {
    let mut interim = 0;
    let mut scanned = 0usize;
    loop {
        let complete = memchr::memmem::find(&buf[scanned.saturating_sub(3)..], b"\r\n\r\n")
            .is_some()
            || memchr::memmem::find(&buf[scanned.saturating_sub(1)..], b"\n\n").is_some();
        scanned = buf.len();
        if complete && let Some((response, framing, used)) = parse_head(buf, method)? {
            let _ = buf.split_to(used);
            scanned = 0;
            // Interim responses (100 Continue, 103 Early Hints) are read and dropped.
            if response.status().is_informational() {
                if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                    return Err(UpstreamError::Head("upstream switched protocols".into()));
                }
                interim += 1;
                if interim > MAX_INTERIM {
                    return Err(UpstreamError::Head(format!(
                        "over {MAX_INTERIM} interim responses"
                    )));
                }
                continue;
            }
            return Ok((response, framing));
        }
        if buf.len() >= MAX_HEAD {
            return Err(UpstreamError::Head(format!("over {MAX_HEAD} bytes")));
        }
        buf.reserve(READ_SIZE);
        let n =
            std::future::poll_fn(|cx| tokio_util::io::poll_read_buf(Pin::new(&mut *rd), cx, buf))
                .await
                .map_err(UpstreamError::Read)?;
        if n == 0 {
            return Err(UpstreamError::Closed);
        }
    }
}

/// The request head; whether the body goes chunked.
fn request_head(
    origin: &Origin,
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    body: &Incoming,
) -> Result<(Vec<u8>, bool), UpstreamError> {
    if matches!(*method, Method::CONNECT | Method::TRACE) {
        return Err(UpstreamError::Method(method.clone()));
    }
    let mut head = Vec::with_capacity(1024);
    head.extend_from_slice(method.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    head.extend_from_slice(origin.authority().as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        // Framing is this hop's (set below); `expect` is not, since the body follows at once.
        if [
            header::HOST,
            header::CONTENT_LENGTH,
            header::TRANSFER_ENCODING,
            header::EXPECT,
            header::CONNECTION,
        ]
        .contains(name)
        {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    let bodiless = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    let chunked = match body.size_hint().exact() {
        Some(0) if bodiless => false,
        Some(n) => {
            head.extend_from_slice(format!("content-length: {n}\r\n").as_bytes());
            false
        }
        // A server that ignores such a body would read its chunks as a second request.
        None if bodiless => return Err(UpstreamError::Method(method.clone())),
        None => {
            head.extend_from_slice(b"transfer-encoding: chunked\r\n");
            true
        }
    };
    head.extend_from_slice(b"\r\n");
    Ok((head, chunked))
}

/// Writes the head and the body, gathered into writes of up to [`READ_SIZE`] (a small request
/// leaves in one segment, as from any HTTP client).
async fn write_request<W: AsyncWrite + Unpin>(
    conn: &mut W,
    mut out: Vec<u8>,
    mut body: Incoming,
    chunked: bool,
) -> Result<(), UpstreamError> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(UpstreamError::RequestBody)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        if chunked {
            out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        }
        out.extend_from_slice(&data);
        if chunked {
            out.extend_from_slice(b"\r\n");
        }
        if out.len() >= READ_SIZE {
            conn.write_all(&out).await.map_err(UpstreamError::Write)?;
            out.clear();
        }
    }
    if chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    conn.write_all(&out).await.map_err(UpstreamError::Write)?;
    conn.flush().await.map_err(UpstreamError::Write)
}

/// How a response body ends (RFC 9112 §6.3).
#[derive(Debug)]
enum Framing {
    Length(u64),
    Chunked(Chunked),
    /// Until the server closes the connection (never reused).
    Close,
}

/// A body's framing, and whether the connection may carry another exchange after it (not
/// when the head framed the body ambiguously: leftover bytes must never become the next
/// response).
struct Framed {
    framing: Framing,
    reusable: bool,
}

/// A response head, its body's framing and the bytes it took; `None` while incomplete.
fn parse_head(
    buf: &[u8],
    method: &Method,
) -> Result<Option<(Response<UpstreamBody>, Framed, usize)>, UpstreamError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut slots);
    let used = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(UpstreamError::Head(e.to_string())),
    };
    if parsed.version != Some(1) {
        return Err(UpstreamError::Head("not HTTP/1.1".into()));
    }
    let status = StatusCode::from_u16(parsed.code.unwrap_or(0))
        .map_err(|e| UpstreamError::Head(e.to_string()))?;
    let mut headers = HeaderMap::with_capacity(parsed.headers.len());
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|e| UpstreamError::Head(format!("header name {:?}: {e}", h.name)))?;
        let value = HeaderValue::from_bytes(h.value)
            .map_err(|e| UpstreamError::Head(format!("header {:?}: {e}", h.name)))?;
        headers.append(name, value);
    }
    let framing = framing(&headers, status, method)?;
    let mut response = Response::new(UpstreamBody::empty());
    *response.status_mut() = status;
    *response.version_mut() = Version::HTTP_11;
    *response.headers_mut() = headers;
    Ok(Some((response, framing, used)))
}

fn framing(
    headers: &HeaderMap,
    status: StatusCode,
    method: &Method,
) -> Result<Framed, UpstreamError> {
    let has_te = headers.contains_key(header::TRANSFER_ENCODING);
    let has_cl = headers.contains_key(header::CONTENT_LENGTH);
    if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        // A body after such a head would be read as the next response: not reused if the
        // head announced one.
        let announced = has_te
            || (status != StatusCode::NOT_MODIFIED
                && *method != Method::HEAD
                && headers
                    .get(header::CONTENT_LENGTH)
                    .is_some_and(|v| v.as_bytes() != b"0"));
        return Ok(Framed {
            framing: Framing::Length(0),
            reusable: !announced,
        });
    }
    let codings: Vec<String> = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("\u{0}").split(','))
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty())
        .collect();
    if has_te {
        // Chunked must be the last coding, and we undo no other transfer coding.
        return if codings == ["chunked"] {
            Ok(Framed {
                framing: Framing::Chunked(Chunked::default()),
                // Both framings announced: read as chunked (RFC 9112 §6.3), never reused.
                reusable: !has_cl,
            })
        } else {
            Err(UpstreamError::Head(format!(
                "transfer-encoding {codings:?} is not handled"
            )))
        };
    }
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for part in value.as_bytes().split(|&b| b == b',') {
            let part = part.trim_ascii();
            // Digits only (`u64::from_str` would take a leading `+`).
            let n = (!part.is_empty() && part.iter().all(u8::is_ascii_digit))
                .then(|| std::str::from_utf8(part).ok()?.parse::<u64>().ok())
                .flatten()
                .ok_or_else(|| UpstreamError::Head(format!("content-length {value:?}")))?;
            if length.is_some_and(|l| l != n) {
                return Err(UpstreamError::Head(
                    "conflicting content-length values".into(),
                ));
            }
            length = Some(n);
        }
    }
    Ok(Framed {
        framing: length.map_or(Framing::Close, Framing::Length),
        reusable: length.is_some(),
    })
}

/// A response body from [`Upstreams::send`]; the connection goes back to the pool when the
/// body was read to its end.
pub(crate) struct UpstreamBody {
    conn: Option<Conn>,
    buf: BytesMut,
    framing: Framing,
    /// Where to return the connection to, when it may be reused.
    reuse: Option<(Arc<Upstreams>, Origin, Duration)>,
}

impl UpstreamBody {
    fn empty() -> Self {
        UpstreamBody {
            conn: None,
            buf: BytesMut::new(),
            framing: Framing::Length(0),
            reuse: None,
        }
    }

    /// The body was read whole: the connection may serve the next request.
    fn finished(&mut self) {
        if let (Some(conn), Some((pool, origin, idle_for))) = (self.conn.take(), self.reuse.take())
            && self.buf.is_empty()
        {
            pool.checkin(origin, conn, idle_for);
        }
    }

    /// Reads more from the connection; `Ok(0)` at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Some(conn) = self.conn.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        if self.buf.capacity() - self.buf.len() < READ_SIZE / 4 {
            self.buf.reserve(READ_SIZE);
        }
        tokio_util::io::poll_read_buf(Pin::new(conn), cx, &mut self.buf)
    }
}

fn cut_off() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "upstream closed the connection inside the response body",
    )
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        let this = self.get_mut();
        loop {
            match &mut this.framing {
                Framing::Length(0) => {
                    this.finished();
                    return Poll::Ready(None);
                }
                Framing::Length(rest) => {
                    if !this.buf.is_empty() {
                        let n = usize::try_from(*rest)
                            .unwrap_or(usize::MAX)
                            .min(this.buf.len());
                        *rest -= n as u64;
                        let data = this.buf.split_to(n).freeze();
                        if *rest == 0 {
                            this.finished();
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                Framing::Chunked(dec) => {
                    if dec.is_done() {
                        this.finished();
                        return Poll::Ready(None);
                    }
                    if !this.buf.is_empty() {
                        let data = dec
                            .decode(&mut this.buf)
                            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                        let done = dec.is_done();
                        if done {
                            this.finished();
                        }
                        if !data.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(data))));
                        }
                        if done {
                            return Poll::Ready(None);
                        }
                    }
                }
                Framing::Close => {
                    if !this.buf.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(this.buf.split().freeze()))));
                    }
                }
            }
            if ready!(this.poll_fill(cx))? == 0 {
                return match this.framing {
                    Framing::Close => {
                        this.conn = None;
                        Poll::Ready(None)
                    }
                    _ => Poll::Ready(Some(Err(cut_off()))),
                };
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.framing {
            Framing::Length(n) => *n == 0,
            Framing::Chunked(dec) => dec.is_done(),
            Framing::Close => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}
