//! The HTTP plumbing under every session: the upstream client and its connector, the two
//! transports' headers, URL checks, and the SSE pump that turns an event stream into inbox
//! messages.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;

use super::error::McpClientError;
use crate::mcp::budget::{Budget, Charge};
use crate::sse::message::SseDecoder;

/// `Mcp-Session-Id`, the Streamable HTTP session header.
pub(crate) const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
/// `MCP-Protocol-Version`, sent on every request after initialization.
pub(crate) const PROTOCOL_VERSION_HEADER: HeaderName =
    HeaderName::from_static("mcp-protocol-version");
/// TCP connect time-out for every upstream connection.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP client used for upstreams (`http://`, and `https://` verified against the
/// system's trust store).
pub(crate) type HttpClient = Client<Connector, Full<Bytes>>;

/// What opens upstream connections: TCP with [`CONNECT_TIMEOUT`] and `TCP_NODELAY`, TLS for
/// `https://`.
pub(crate) type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// A new [`Connector`].
pub(crate) fn connector() -> Result<Connector, McpClientError> {
    let tls =
        crate::edge::tls_client_config().map_err(|e| McpClientError::Tls(format!("{e:#}")))?;
    Ok(crate::edge::https_connector(tls, CONNECT_TIMEOUT))
}

/// A new HTTP(S) client with [`CONNECT_TIMEOUT`].
pub(crate) fn http_client() -> Result<HttpClient, McpClientError> {
    Ok(Client::builder(TokioExecutor::new()).build(connector()?))
}

/// Which HTTP transport a network MCP server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Detect as the spec says: POST `initialize`; on a 4xx, GET and wait for `endpoint`.
    Auto,
    /// Streamable HTTP (protocol 2025-03-26 and later).
    StreamableHttp,
    /// Legacy HTTP+SSE (protocol 2024-11-05).
    Sse,
}

impl Transport {
    /// The registry's server type: `http` or `sse`.
    pub fn server_type(self) -> &'static str {
        match self {
            Transport::Sse => "sse",
            Transport::Auto | Transport::StreamableHttp => "http",
        }
    }
}

pub(super) fn parse_url(url: &str) -> Result<Uri, McpClientError> {
    let bad = |reason: &str| McpClientError::BadUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(bad("the URL must start with http:// or https://"));
    }
    if uri.authority().is_none() {
        return Err(bad("the URL has no host"));
    }
    Ok(uri)
}

pub(super) fn is_sse(response: &Response<Incoming>) -> bool {
    crate::edge::is_event_stream(response.headers())
}

pub(super) async fn error_body(response: Response<Incoming>) -> String {
    let limited = http_body_util::Limited::new(response.into_body(), 4096);
    match limited.collect().await {
        Ok(body) => String::from_utf8_lossy(&body.to_bytes()).trim().to_owned(),
        Err(_) => String::new(),
    }
}

/// Resolves the legacy `endpoint` event against the stream's URL. The endpoint must be on the
/// same origin (the spec's rule; anything else would let a server send our client's messages
/// elsewhere).
pub(crate) fn resolve_endpoint(base: &Uri, endpoint: &str) -> Result<Uri, String> {
    let resolved: Uri = if endpoint.starts_with("http://") || endpoint.starts_with("https://") {
        endpoint
            .parse()
            .map_err(|e| format!("bad endpoint {endpoint:?}: {e}"))?
    } else {
        let path = if endpoint.starts_with('/') {
            endpoint.to_owned()
        } else {
            let dir = base.path().rsplit_once('/').map(|(d, _)| d).unwrap_or("");
            format!("{dir}/{endpoint}")
        };
        let mut parts = base.clone().into_parts();
        parts.path_and_query = Some(
            path.parse()
                .map_err(|e| format!("bad endpoint {endpoint:?}: {e}"))?,
        );
        Uri::from_parts(parts).map_err(|e| format!("bad endpoint {endpoint:?}: {e}"))?
    };
    if resolved.scheme() != base.scheme() || resolved.authority() != base.authority() {
        return Err(format!(
            "endpoint {endpoint:?} is not on the server's origin"
        ));
    }
    Ok(resolved)
}

pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Remembers the negotiated version from an `initialize` result, for the version header.
pub(super) fn note_protocol_version(slot: &Mutex<Option<HeaderValue>>, message: &[u8]) {
    #[derive(serde::Deserialize)]
    struct Msg<'a> {
        #[serde(borrow)]
        result: Option<InitResult<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct InitResult<'a> {
        #[serde(rename = "protocolVersion")]
        protocol_version: Option<&'a str>,
    }
    let Ok(mut slot) = slot.lock() else { return };
    if slot.is_some() {
        return;
    }
    if let Ok(Msg {
        result: Some(InitResult {
            protocol_version: Some(v),
        }),
    }) = serde_json::from_slice::<Msg<'_>>(message)
    {
        *slot = HeaderValue::from_str(v).ok();
    }
}

/// A message from the upstream, charged to its session's byte budget (if it has one) until it
/// is dropped or its charge is taken on with it ([`Inbound::into_parts`]).
#[derive(Debug)]
pub(crate) struct Inbound {
    message: Bytes,
    charge: Option<Charge>,
}

impl Inbound {
    /// The message, and its charge to carry on for as long as the message is held.
    pub(crate) fn into_parts(self) -> (Bytes, Option<Charge>) {
        (self.message, self.charge)
    }
}

impl std::ops::Deref for Inbound {
    type Target = Bytes;

    fn deref(&self) -> &Bytes {
        &self.message
    }
}

/// Where a session's readers put what the upstream sends: its inbox, each message charged to
/// the session's budget first (a reader waits for room, so an upstream is read no faster than
/// its client takes what it sends).
#[derive(Clone)]
pub(crate) struct Outlet {
    pub(super) tx: mpsc::Sender<Result<Inbound, McpClientError>>,
    pub(super) budget: Option<Arc<Budget>>,
}

impl Outlet {
    /// Puts one message in the inbox; false once the inbox is gone.
    pub(super) async fn put(&self, message: Bytes) -> bool {
        let charge = match &self.budget {
            Some(budget) => Some(budget.charge(message.len()).await),
            None => None,
        };
        self.tx.send(Ok(Inbound { message, charge })).await.is_ok()
    }

    /// Ends the inbox with an error.
    pub(super) async fn fail(&self, error: McpClientError) {
        let _ = self.tx.send(Err(error)).await;
    }
}

/// Delivers an SSE body's message events to the inbox. For the legacy transport the stream is
/// the session, so its end is reported as an error; a Streamable HTTP POST stream simply ends.
pub(super) async fn pump_sse(
    mut body: Incoming,
    mut decoder: SseDecoder,
    outlet: Outlet,
    protocol_version: Arc<Mutex<Option<HeaderValue>>>,
    url: String,
    is_session_stream: bool,
) {
    loop {
        while let Some(event) = decoder.next_event() {
            if !event.is_message() || event.data.is_empty() {
                continue;
            }
            note_protocol_version(&protocol_version, &event.data);
            if !outlet.put(Bytes::from(event.data)).await {
                return;
            }
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    decoder.feed(data);
                    if decoder.overflowed() {
                        outlet
                            .fail(McpClientError::Closed {
                                url,
                                reason: "an SSE event is larger than the message limit".into(),
                            })
                            .await;
                        return;
                    }
                }
            }
            Some(Err(e)) => {
                outlet
                    .fail(McpClientError::Closed {
                        url,
                        reason: format!("the SSE stream broke: {}", error_chain(&e)),
                    })
                    .await;
                return;
            }
            None => {
                if is_session_stream {
                    outlet
                        .fail(McpClientError::Closed {
                            url,
                            reason: "the server closed the SSE stream".into(),
                        })
                        .await;
                }
                return;
            }
        }
    }
}
