//! The proxy's HTTP/1.1 client to the LLM APIs: connections kept alive per upstream, and a
//! response body read in large reads and de-chunked in place ([`chunked`]).
//!
//! Why not hyper's client: the APIs send one HTTP chunk per SSE event, and hyper's
//! client hands a body over one chunk at a time through a channel between two tasks, a
//! cross-thread wake per ~200-byte event: 10–15 s of relay CPU per GB, 7–14x nginx's. Here a
//! read of up to 256 KiB holding hundreds of events becomes one slice, inspected and written at once.
//! HTTP/1.1 only (ALPN `http/1.1` over TLS), as the official SDKs speak to these APIs.
//! Response heads are parsed with `httparse` (hyper's own parser).

mod chunked;
mod head;

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::HeaderMap;
use hyper::{Method, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

pub(crate) use head::OutBody;
use head::{Framing, idle_for, keep_alive, read_head, request_head, write_request};

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
    #[error("cannot resolve {0} (this host has no DNS answer for the provider's name): {1}")]
    Resolve(String, io::Error),
    #[error("resolving {0} timed out (no DNS answer for the provider's name)")]
    ResolveTimeout(String),
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
        let mut config = crate::edge::tls_client_config()?;
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
        // Resolved apart from connecting, so that a missing DNS answer is told apart from a
        // refused connection in what the agent reads.
        let addrs: Vec<std::net::SocketAddr> = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::lookup_host((origin.host.as_str(), origin.port)),
        )
        .await
        .map_err(|_| UpstreamError::ResolveTimeout(name.clone()))?
        .map_err(|e| UpstreamError::Resolve(name.clone(), e))?
        .collect();
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&addrs[..]))
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
        body: OutBody,
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
