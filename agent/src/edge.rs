//! The HTTP edge every server and client in the binary shares (one of each, so that no two
//! layers disagree on which headers they strip or how much of a body they read): the one
//! accept loop, which survives running out of descriptors (a loop that does not back off spins
//! and logs 120 MB in 20 s), bounded body reads, hop-by-hop headers, what an event stream
//! looks like, and the TLS client configuration.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, header};
use http_body_util::BodyExt as _;

/// Waits after a failed `accept`: out of file descriptors (EMFILE, ENFILE) or memory the
/// listener stays readable, so retrying at once would spin and log without end. The wait
/// doubles from 10 ms to 1 s; the error is logged once per wait that grows, then once a minute.
#[derive(Default)]
pub(crate) struct AcceptBackoff {
    wait: Duration,
    failures: u64,
    last_log: Option<tokio::time::Instant>,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MOST: Duration = Duration::from_secs(1);

    pub(crate) async fn failed(&mut self, error: &std::io::Error) {
        self.failures += 1;
        self.wait = (self.wait * 2).clamp(Self::FIRST, Self::MOST);
        let now = tokio::time::Instant::now();
        if self
            .last_log
            .is_none_or(|t| self.wait < Self::MOST || now - t >= Duration::from_secs(60))
        {
            tracing::warn!(
                failures = self.failures,
                "cannot accept a connection ({error}); retrying in {:?}",
                self.wait
            );
            self.last_log = Some(now);
        }
        tokio::time::sleep(self.wait).await;
    }

    pub(crate) fn reset(&mut self) {
        if self.failures > 0 {
            tracing::info!(failures = self.failures, "accepting connections again");
        }
        *self = Self::default();
    }
}

/// A listener the accept loop takes connections from (TCP for the LLM proxy, the filter proxy
/// and the daemon's loopback address; Unix for the daemon's socket).
pub(crate) trait Listener {
    /// What `accept` gives: the stream and who is at its other end.
    type Conn;
    /// The next connection.
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Conn>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Conn = (tokio::net::TcpStream, std::net::SocketAddr);
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Conn>> + Send {
        tokio::net::TcpListener::accept(self)
    }
}

impl Listener for tokio::net::UnixListener {
    type Conn = (tokio::net::UnixStream, tokio::net::unix::SocketAddr);
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Conn>> + Send {
        tokio::net::UnixListener::accept(self)
    }
}

/// The one accept loop of every server in the binary: accepts until `stop` resolves, backing
/// off while `accept` fails ([`AcceptBackoff`]), and runs what `serve` makes of each
/// connection (given how many are open; `None` refuses it: the connection is closed at once)
/// on a task of its own. Once stopped it gives the open connections `grace`, ends the rest,
/// and returns when every task is gone: each may hold the daemon's state and event sink,
/// which must be released before the store can flush and close.
pub(crate) async fn accept_loop<L, F, S>(
    listener: &L,
    stop: impl Future<Output = ()>,
    grace: Duration,
    mut serve: F,
) where
    L: Listener,
    F: FnMut(L::Conn, usize) -> Option<S>,
    S: Future<Output = ()> + Send + 'static,
{
    tokio::pin!(stop);
    let mut conns = tokio::task::JoinSet::new();
    let mut backoff = AcceptBackoff::default();
    loop {
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => {
                    backoff.reset();
                    if let Some(task) = serve(conn, conns.len()) {
                        conns.spawn(task);
                    }
                }
                Err(error) => backoff.failed(&error).await,
            },
            // Reap finished connections so the set does not grow.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    let _ = tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Why a request body was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// Larger than the limit (said by `Content-Length` or by its bytes); the rest is not read.
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    /// The connection failed while it was read.
    #[error("cannot read the request body")]
    Unreadable,
    /// Not all of it arrived in time.
    #[error("the request body did not arrive within {0:?}")]
    TimedOut(Duration),
}

/// A request's body: at most `limit` bytes (a larger one is refused as soon as its
/// `Content-Length` or its bytes say so), all of it within `timeout` (a slow client must not
/// hold a descriptor for ever).
pub(crate) async fn read_body(
    body: hyper::body::Incoming,
    headers: &HeaderMap,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge(limit));
    }
    match tokio::time::timeout(timeout, http_body_util::Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge(limit)),
        Ok(Err(_)) => Err(BodyError::Unreadable),
        Err(_) => Err(BodyError::TimedOut(timeout)),
    }
}

/// Headers of one hop (RFC 9110 §7.6.1, plus the unofficial `keep-alive` and
/// `proxy-connection`), never passed on.
pub(crate) static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes [`HOP_BY_HOP`] and every header the `Connection` header names.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Runs twice on every proxied call: a header set with none of them (the common case) is
    // read once, and nothing is looked up by hash or allocated.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    // The names present that go (a header map's names are lower case, as are the tokens
    // once compared without case), each removed once: no lookup of names that are absent.
    // Tokens are read as bytes, each trimmed of spaces, tabs and bytes beyond ASCII (a UTF-8
    // no-break space) at its ends: a value holding such a byte still names the headers its
    // tokens name.
    let listed: Vec<&[u8]> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|t| {
            let blank = |b: &u8| b.is_ascii_whitespace() || !b.is_ascii();
            let start = t.iter().position(|b| !blank(b)).unwrap_or(t.len());
            let end = t.iter().rposition(|b| !blank(b)).map_or(start, |i| i + 1);
            &t[start..end]
        })
        .collect();
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            HOP_BY_HOP.contains(name)
                || listed
                    .iter()
                    .any(|t| t.eq_ignore_ascii_case(name.as_str().as_bytes()))
        })
        .cloned()
        .collect();
    for name in &doomed {
        headers.remove(name);
    }
}

/// Whether a message's media type is `text/event-stream` (parameters and case aside).
pub(crate) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// The TLS client configuration of every upstream connection (LLM providers in
/// `llm/upstream/`, network MCP servers in `mcp/client/transport.rs`): ring, rustls's safe
/// protocol versions, the system's root certificates — none found is logged, and every HTTPS
/// upstream then fails. No ALPN: each client names the protocols it speaks.
pub(crate) fn tls_client_config() -> anyhow::Result<rustls::ClientConfig> {
    use hyper_rustls::ConfigBuilderExt as _;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
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
    Ok(builder.with_no_client_auth())
}

/// What opens every outgoing HTTP(S) connection but the LLM providers': TCP with a connect
/// time-out and `TCP_NODELAY`, TLS (`tls`) for `https://`, HTTP/1.1 (network MCP servers in
/// `mcp/client/transport.rs`, the OTLP/HTTP exporter, the policy bundle poller).
pub(crate) fn https_connector(
    tls: rustls::ClientConfig,
    connect_timeout: std::time::Duration,
) -> hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector> {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    connector.enforce_http(false);
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector)
}

/// [`tls_client_config`] trusting the CAs of one PEM file instead of the system's (a
/// collector's or a bundle server's own CA: `telemetry.otlp.tls.ca_file`,
/// `policy.bundle.ca_file`).
pub(crate) fn tls_client_config_with_ca(
    path: &std::path::Path,
) -> anyhow::Result<rustls::ClientConfig> {
    use anyhow::Context as _;
    use rustls::pki_types::{CertificateDer, pem::PemObject as _};
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        CertificateDer::pem_file_iter(path).with_context(|| format!("read {}", path.display()))?
    {
        let cert = cert.with_context(|| format!("{}: not PEM", path.display()))?;
        roots
            .add(cert)
            .with_context(|| format!("{}: a bad certificate", path.display()))?;
    }
    anyhow::ensure!(!roots.is_empty(), "{} holds no certificate", path.display());
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_go() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "close, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("authorization", "Bearer t"),
            ("content-type", "application/json"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                http::HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "content-type"]);

        // A value with bytes beyond ASCII: its other tokens still count, and a token with such
        // bytes around it (a no-break space) still names its header.
        for connection in [
            &b"X-Foo, caf\xe9"[..],
            b"x-foo\xc2\xa0, close",
            b"\xc2\xa0X-FOO",
            b"\tX-FOO\t,,",
        ] {
            let mut headers = HeaderMap::new();
            headers.append(
                header::CONNECTION,
                http::HeaderValue::from_bytes(connection).expect("a header value"),
            );
            headers.append(
                HeaderName::from_static("x-foo"),
                http::HeaderValue::from_static("1"),
            );
            strip_hop_by_hop(&mut headers);
            assert!(headers.is_empty(), "{connection:?}: {headers:?}");
        }
    }

    #[test]
    fn an_event_stream_is_known_whatever_its_case_and_parameters() {
        for (value, expected) in [
            ("text/event-stream", true),
            (" Text/Event-Stream; charset=utf-8", true),
            ("application/json", false),
            ("text/event-streamx", false),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_str(value).unwrap(),
            );
            assert_eq!(is_event_stream(&headers), expected, "{value}");
        }
        assert!(!is_event_stream(&HeaderMap::new()));
    }
}
