//! A message-level MCP client over the two HTTP transports, for the filter proxy's upstream
//! sessions and the daemon's start-up discovery.
//!
//! An [`UpstreamSession`] sends JSON-RPC messages with [`UpstreamSession::send`] and delivers
//! everything the server sends (responses, its own requests and notifications) on one
//! channel, whatever the transport: Streamable HTTP (POST answered with JSON or an SSE
//! stream, plus the optional GET stream) or legacy HTTP+SSE (one GET stream whose first event
//! names the URL to POST to).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::modern::{Era, Modern};
use crate::sse::message::SseDecoder;

/// `Mcp-Session-Id`, the Streamable HTTP session header.
pub const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
/// `MCP-Protocol-Version`, sent on every request after initialization.
pub const PROTOCOL_VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// The protocol version toolwall asks for in its own `initialize`.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// TCP connect time-out for every upstream connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most `tools/list` pages followed before giving up on a server that never stops paging.
const MAX_PAGES: usize = 1000;

/// The HTTP client used for upstreams (`http://`, and `https://` verified against the
/// system's trust store).
pub type HttpClient = Client<Connector, Full<Bytes>>;

/// What opens upstream connections: TCP with [`CONNECT_TIMEOUT`] and `TCP_NODELAY`, TLS for
/// `https://`.
pub type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// A new [`Connector`].
pub fn connector() -> Result<Connector, McpClientError> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    connector.set_nodelay(true);
    connector.enforce_http(false);
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(rustls::crypto::ring::default_provider())
        .map_err(|e| McpClientError::Tls(e.to_string()))?
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector))
}

/// A new HTTP(S) client with [`CONNECT_TIMEOUT`].
pub fn http_client() -> Result<HttpClient, McpClientError> {
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

/// What went wrong talking to an MCP server; every message names the server and the step.
#[derive(Debug, thiserror::Error)]
pub enum McpClientError {
    /// The URL is not an `http://` URL we can use.
    #[error("MCP server {url}: bad URL: {reason}")]
    BadUrl {
        /// The server.
        url: String,
        /// Why.
        reason: String,
    },
    /// No connection, or it broke.
    #[error("MCP server {url}: {step}: cannot connect: {reason}")]
    Connect {
        /// The server.
        url: String,
        /// What we were doing.
        step: String,
        /// The transport's error chain.
        reason: String,
    },
    /// An HTTP status that is not what the transport allows.
    #[error("MCP server {url}: {step}: HTTP {status}{}", if body.is_empty() { String::new() } else { format!(": {body}") })]
    Status {
        /// The server.
        url: String,
        /// What we were doing.
        step: String,
        /// The status.
        status: StatusCode,
        /// The start of the body, for the reader.
        body: String,
    },
    /// Nothing arrived in time.
    #[error("MCP server {url}: {step}: timed out after {timeout:?}")]
    Timeout {
        /// The server.
        url: String,
        /// What we were doing.
        step: String,
        /// The limit.
        timeout: Duration,
    },
    /// The server broke the protocol or answered a request with an error.
    #[error("MCP server {url}: {step}: {message}")]
    Protocol {
        /// The server.
        url: String,
        /// What we were doing.
        step: String,
        /// What was wrong.
        message: String,
    },
    /// No usable TLS set-up (no system trust store, no TLS versions in common).
    #[error("TLS set-up for MCP servers failed: {0}")]
    Tls(String),
    /// The server's stream ended.
    #[error("MCP server {url}: connection lost: {reason}")]
    Closed {
        /// The server.
        url: String,
        /// How.
        reason: String,
    },
}

impl McpClientError {
    /// Whether this is an HTTP 4xx (how `auto` recognises a legacy SSE server).
    pub fn is_client_error_status(&self) -> bool {
        matches!(self, McpClientError::Status { status, .. } if status.is_client_error())
    }
}

/// Messages from the server, in arrival order, or the error that ended the session.
pub type Inbox = mpsc::Receiver<Result<Bytes, McpClientError>>;

/// One session with an upstream MCP server.
pub struct UpstreamSession {
    http: HttpClient,
    url: Uri,
    transport: Transport,
    /// Where messages are POSTed: the URL itself, or the SSE `endpoint`.
    post_url: Uri,
    /// Headers sent on every request (authorization passed through from the client).
    headers: HeaderMap,
    session_id: Arc<Mutex<Option<HeaderValue>>>,
    protocol_version: Arc<Mutex<Option<HeaderValue>>>,
    tx: mpsc::Sender<Result<Bytes, McpClientError>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    timeout: Duration,
}

impl Drop for UpstreamSession {
    /// Stops the stream readers and, for a Streamable HTTP session not ended with
    /// [`UpstreamSession::close`], tells the server in the background (DELETE), so client
    /// sessions that just vanish do not pile up upstream.
    fn drop(&mut self) {
        for task in self.tasks.get_mut().map(std::mem::take).unwrap_or_default() {
            task.abort();
        }
        let has_session = self.session_id.lock().map(|s| s.is_some()).unwrap_or(false);
        if self.transport == Transport::StreamableHttp
            && has_session
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let request = self.request(Method::DELETE, &self.url, Bytes::new());
            let http = self.http.clone();
            runtime.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(2), http.request(request)).await;
            });
        }
    }
}

fn parse_url(url: &str) -> Result<Uri, McpClientError> {
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

fn is_sse(response: &Response<Incoming>) -> bool {
    crate::edge::is_event_stream(response.headers())
}

async fn error_body(response: Response<Incoming>) -> String {
    let limited = http_body_util::Limited::new(response.into_body(), 4096);
    match limited.collect().await {
        Ok(body) => String::from_utf8_lossy(&body.to_bytes()).trim().to_owned(),
        Err(_) => String::new(),
    }
}

impl UpstreamSession {
    /// Opens a session: for legacy SSE this opens the stream and waits for `endpoint`; for
    /// Streamable HTTP nothing is sent until the first message (`initialize`). `Auto` is
    /// resolved by [`connect_and_initialize`], not here. `headers` go on every request.
    pub async fn open(
        http: HttpClient,
        url: &str,
        transport: Transport,
        headers: HeaderMap,
        timeout: Duration,
    ) -> Result<(Self, Inbox), McpClientError> {
        let uri = parse_url(url)?;
        let (tx, rx) = mpsc::channel(64);
        let mut session = UpstreamSession {
            http,
            post_url: uri.clone(),
            url: uri,
            transport,
            headers,
            session_id: Arc::default(),
            protocol_version: Arc::default(),
            tx,
            tasks: Mutex::default(),
            timeout,
        };
        match transport {
            Transport::StreamableHttp => {}
            Transport::Sse => session.open_sse_stream().await?,
            Transport::Auto => {
                return Err(McpClientError::BadUrl {
                    url: url.to_owned(),
                    reason: "transport `auto` must be resolved before opening a session".into(),
                });
            }
        }
        Ok((session, rx))
    }

    /// The transport this session speaks.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The server's URL, for messages.
    pub fn url(&self) -> String {
        self.url.to_string()
    }

    fn err_connect(&self, step: &str, e: impl std::fmt::Display) -> McpClientError {
        McpClientError::Connect {
            url: self.url(),
            step: step.to_owned(),
            reason: e.to_string(),
        }
    }

    fn request(&self, method: Method, uri: &Uri, body: Bytes) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = uri.clone();
        let headers = request.headers_mut();
        for (name, value) in &self.headers {
            headers.append(name, value.clone());
        }
        if self.transport == Transport::StreamableHttp {
            if let Some(id) = self.session_id.lock().ok().and_then(|s| s.clone()) {
                headers.insert(SESSION_HEADER, id);
            }
            if let Some(v) = self.protocol_version.lock().ok().and_then(|s| s.clone()) {
                headers.insert(PROTOCOL_VERSION_HEADER, v);
            }
        }
        request
    }

    async fn send_request(
        &self,
        request: Request<Full<Bytes>>,
        step: &str,
    ) -> Result<Response<Incoming>, McpClientError> {
        match tokio::time::timeout(self.timeout, self.http.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(self.err_connect(step, error_chain(&e))),
            Err(_) => Err(McpClientError::Timeout {
                url: self.url(),
                step: step.to_owned(),
                timeout: self.timeout,
            }),
        }
    }

    /// Sends one JSON-RPC message (or batch). Whatever the server answers arrives on the
    /// inbox; an error here means the message was not accepted.
    pub async fn send(&self, message: Bytes) -> Result<(), McpClientError> {
        let step = "sending a message";
        let mut request = self.request(Method::POST, &self.post_url, message);
        request
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if self.transport == Transport::StreamableHttp {
            request.headers_mut().insert(
                ACCEPT,
                HeaderValue::from_static("application/json, text/event-stream"),
            );
        }
        let response = self.send_request(request, step).await?;
        let status = response.status();
        if !status.is_success() {
            return Err(McpClientError::Status {
                url: self.url(),
                step: step.to_owned(),
                status,
                body: error_body(response).await,
            });
        }
        if self.transport == Transport::Sse {
            // Legacy SSE: the POST is only acknowledged; answers come on the stream.
            return Ok(());
        }
        if let Some(id) = response.headers().get(SESSION_HEADER)
            && let Ok(mut slot) = self.session_id.lock()
        {
            slot.get_or_insert_with(|| id.clone());
        }
        if status == StatusCode::ACCEPTED || status == StatusCode::NO_CONTENT {
            return Ok(());
        }
        if is_sse(&response) {
            let task = tokio::spawn(pump_sse(
                response.into_body(),
                SseDecoder::with_limit(super::framing::DEFAULT_MAX_MESSAGE_BYTES),
                self.tx.clone(),
                self.protocol_version.clone(),
                self.url(),
                false,
            ));
            self.track(task);
            return Ok(());
        }
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| self.err_connect("reading a response", e))?
            .to_bytes();
        note_protocol_version(&self.protocol_version, &body);
        self.tx
            .send(Ok(body))
            .await
            .map_err(|_| McpClientError::Closed {
                url: self.url(),
                reason: "the session was closed".into(),
            })
    }

    fn track(&self, task: JoinHandle<()>) {
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.retain(|t| !t.is_finished());
            tasks.push(task);
        }
    }

    /// Streamable HTTP: opens the GET stream on which the server sends its own requests and
    /// notifications, resuming after `last_event_id` if given. A server without one (405) is
    /// fine. Legacy SSE sessions already have their stream.
    pub async fn open_get_stream(&self, last_event_id: Option<&str>) -> Result<(), McpClientError> {
        if self.transport != Transport::StreamableHttp {
            return Ok(());
        }
        let mut request = self.request(Method::GET, &self.url, Bytes::new());
        request
            .headers_mut()
            .insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        if let Some(id) = last_event_id.and_then(|id| HeaderValue::from_str(id).ok()) {
            request.headers_mut().insert("last-event-id", id);
        }
        let response = self.send_request(request, "opening the GET stream").await?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(());
        }
        if !response.status().is_success() || !is_sse(&response) {
            tracing::warn!(url = %self.url, status = %response.status(), "upstream refused the GET stream");
            return Ok(());
        }
        let task = tokio::spawn(pump_sse(
            response.into_body(),
            SseDecoder::with_limit(super::framing::DEFAULT_MAX_MESSAGE_BYTES),
            self.tx.clone(),
            self.protocol_version.clone(),
            self.url(),
            false,
        ));
        self.track(task);
        Ok(())
    }

    /// Ends the session: Streamable HTTP sends DELETE (best effort); streams are dropped.
    pub async fn close(self) {
        if self.transport == Transport::StreamableHttp
            && self.session_id.lock().map(|s| s.is_some()).unwrap_or(false)
        {
            let request = self.request(Method::DELETE, &self.url, Bytes::new());
            let _ = tokio::time::timeout(Duration::from_secs(2), self.http.request(request)).await;
            // Ended: nothing left for `drop` to do.
            if let Ok(mut id) = self.session_id.lock() {
                *id = None;
            }
        }
    }

    async fn open_sse_stream(&mut self) -> Result<(), McpClientError> {
        let step = "opening the SSE stream";
        let mut request = self.request(Method::GET, &self.url, Bytes::new());
        request
            .headers_mut()
            .insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        let response = self.send_request(request, step).await?;
        let status = response.status();
        if !status.is_success() || !is_sse(&response) {
            return Err(McpClientError::Status {
                url: self.url(),
                step: format!("{step} (expected 200 text/event-stream)"),
                status,
                body: error_body(response).await,
            });
        }
        let mut body = response.into_body();
        let mut decoder = SseDecoder::with_limit(super::framing::DEFAULT_MAX_MESSAGE_BYTES);
        let wait_endpoint = async {
            loop {
                while let Some(event) = decoder.next_event() {
                    if event.event.as_deref() == Some("endpoint") {
                        return Ok(String::from_utf8_lossy(&event.data).trim().to_owned());
                    }
                }
                match body.frame().await {
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            decoder.feed(data);
                        }
                    }
                    Some(Err(e)) => return Err(self.err_connect(step, e)),
                    None => {
                        return Err(McpClientError::Protocol {
                            url: self.url(),
                            step: step.to_owned(),
                            message: "the stream ended before the `endpoint` event".into(),
                        });
                    }
                }
            }
        };
        let endpoint = match tokio::time::timeout(self.timeout, wait_endpoint).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(McpClientError::Timeout {
                    url: self.url(),
                    step: "waiting for the `endpoint` event".into(),
                    timeout: self.timeout,
                });
            }
        };
        self.post_url =
            resolve_endpoint(&self.url, &endpoint).map_err(|message| McpClientError::Protocol {
                url: self.url(),
                step: "reading the `endpoint` event".into(),
                message,
            })?;
        let task = tokio::spawn(pump_sse(
            body,
            decoder,
            self.tx.clone(),
            self.protocol_version.clone(),
            self.url(),
            true,
        ));
        self.track(task);
        Ok(())
    }
}

/// Resolves the legacy `endpoint` event against the stream's URL. The endpoint must be on the
/// same origin (the spec's rule; anything else would let a server send our client's messages
/// elsewhere).
pub fn resolve_endpoint(base: &Uri, endpoint: &str) -> Result<Uri, String> {
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

fn error_chain(e: &dyn std::error::Error) -> String {
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
fn note_protocol_version(slot: &Mutex<Option<HeaderValue>>, message: &[u8]) {
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

/// Delivers an SSE body's message events to the inbox. For the legacy transport the stream is
/// the session, so its end is reported as an error; a Streamable HTTP POST stream simply ends.
async fn pump_sse(
    mut body: Incoming,
    mut decoder: SseDecoder,
    tx: mpsc::Sender<Result<Bytes, McpClientError>>,
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
            if tx.send(Ok(Bytes::from(event.data))).await.is_err() {
                return;
            }
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    decoder.feed(data);
                    if decoder.overflowed() {
                        let _ = tx
                            .send(Err(McpClientError::Closed {
                                url,
                                reason: "an SSE event is larger than the message limit".into(),
                            }))
                            .await;
                        return;
                    }
                }
            }
            Some(Err(e)) => {
                let _ = tx
                    .send(Err(McpClientError::Closed {
                        url,
                        reason: format!("the SSE stream broke: {}", error_chain(&e)),
                    }))
                    .await;
                return;
            }
            None => {
                if is_session_stream {
                    let _ = tx
                        .send(Err(McpClientError::Closed {
                            url,
                            reason: "the server closed the SSE stream".into(),
                        }))
                        .await;
                }
                return;
            }
        }
    }
}

/// What start-up learned about a server.
#[derive(Debug)]
pub struct Discovered {
    /// The transport it speaks (never `Auto`).
    pub transport: Transport,
    /// Its tools, every page, as listed.
    pub tools: Vec<Value>,
}

/// Opens a session and completes the handshake (`initialize`, `notifications/initialized`),
/// resolving `Auto` the spec's way. Returns the session, its inbox and the initialize result.
pub async fn connect_and_initialize(
    url: &str,
    transport: Transport,
    headers: HeaderMap,
    timeout: Duration,
) -> Result<(UpstreamSession, Inbox, Value), McpClientError> {
    let attempt = |transport| {
        let headers = headers.clone();
        async move {
            let (session, mut inbox) =
                UpstreamSession::open(http_client()?, url, transport, headers, timeout).await?;
            let init = call(
                &session,
                &mut inbox,
                0,
                "initialize",
                json!({
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "toolwall", "version": env!("CARGO_PKG_VERSION")},
                }),
            )
            .await?;
            Ok::<_, McpClientError>((session, inbox, init))
        }
    };
    let (session, inbox, init) = match transport {
        Transport::Auto => match attempt(Transport::StreamableHttp).await {
            Err(e) if e.is_client_error_status() => {
                tracing::debug!("{e}; trying the legacy SSE transport");
                attempt(Transport::Sse).await?
            }
            other => other?,
        },
        other => attempt(other).await?,
    };
    session
        .send(Bytes::from_static(
            br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ))
        .await?;
    Ok((session, inbox, init))
}

/// Sends a request and waits for its response, skipping other traffic.
pub async fn call(
    session: &UpstreamSession,
    inbox: &mut Inbox,
    id: u64,
    method: &str,
    params: Value,
) -> Result<Value, McpClientError> {
    let step = format!("{method} (id {id})");
    let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let bytes = Bytes::from(serde_json::to_vec(&message).unwrap_or_default());
    session.send(bytes).await.map_err(|e| match e {
        McpClientError::Status {
            url, status, body, ..
        } => McpClientError::Status {
            url,
            step: step.clone(),
            status,
            body,
        },
        other => other,
    })?;
    let wait = async {
        while let Some(item) = inbox.recv().await {
            let bytes = item?;
            let Ok(value) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            let answers = |v: &Value| v.get("method").is_none() && v.get("id") == Some(&json!(id));
            let found = match value {
                Value::Array(items) => items.into_iter().find(answers),
                single if answers(&single) => Some(single),
                _ => None,
            };
            let Some(response) = found else { continue };
            if let Some(error) = response.get("error") {
                return Err(McpClientError::Protocol {
                    url: session.url(),
                    step: step.clone(),
                    message: format!("the server answered with an error: {error}"),
                });
            }
            return response
                .get("result")
                .cloned()
                .ok_or_else(|| McpClientError::Protocol {
                    url: session.url(),
                    step: step.clone(),
                    message: "the response has neither result nor error".into(),
                });
        }
        Err(McpClientError::Closed {
            url: session.url(),
            reason: format!("no response to {step}"),
        })
    };
    tokio::time::timeout(session.timeout, wait)
        .await
        .unwrap_or_else(|_| {
            Err(McpClientError::Timeout {
                url: session.url(),
                step: step.clone(),
                timeout: session.timeout,
            })
        })
}

/// Lists every tool of an initialized session, following `nextCursor`.
pub async fn list_all_tools(
    session: &UpstreamSession,
    inbox: &mut Inbox,
) -> Result<Vec<Value>, McpClientError> {
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0..MAX_PAGES {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let result = call(session, inbox, 1 + page as u64, "tools/list", params).await?;
        let Some(Value::Array(items)) = result.get("tools").cloned() else {
            return Err(McpClientError::Protocol {
                url: session.url(),
                step: "tools/list".into(),
                message: "the result has no `tools` array".into(),
            });
        };
        tools.extend(items);
        match result.get("nextCursor").and_then(Value::as_str) {
            Some(next) if cursor.as_deref() == Some(next) => {
                return Err(McpClientError::Protocol {
                    url: session.url(),
                    step: "tools/list".into(),
                    message: format!("the server repeats cursor {next:?}"),
                });
            }
            Some(next) => cursor = Some(next.to_owned()),
            None => return Ok(tools),
        }
    }
    Err(McpClientError::Protocol {
        url: session.url(),
        step: "tools/list".into(),
        message: format!("more than {MAX_PAGES} pages"),
    })
}

/// Start-up discovery with extra headers (authorization): `server/discover` and, at
/// 2026-07-28, every `tools/list` page (`mcp/modern.rs`); otherwise the handshake, every
/// `tools/list` page, then the session is closed. The whole exchange is bounded by `timeout` per step.
pub async fn discover(
    url: &str,
    transport: Transport,
    headers: HeaderMap,
    timeout: Duration,
) -> Result<Discovered, McpClientError> {
    if transport != Transport::Sse {
        let http = http_client()?;
        let uri = parse_url(url)?;
        let modern = Modern {
            http: &http,
            url: &uri,
            headers: &headers,
            timeout,
        };
        match modern.era().await? {
            Era::Modern => {
                return Ok(Discovered {
                    transport: Transport::StreamableHttp,
                    tools: modern.list_tools(MAX_PAGES).await?,
                });
            }
            Era::Handshake(why) => {
                tracing::debug!("{url}: {why}; listing with the initialize handshake");
            }
        }
    }
    let (session, mut inbox, _init) =
        connect_and_initialize(url, transport, headers, timeout).await?;
    let tools = list_all_tools(&session, &mut inbox).await?;
    let transport = session.transport();
    session.close().await;
    Ok(Discovered { transport, tools })
}

/// The daemon's start-up discovery of one declared network server: `initialize`,
/// `notifications/initialized`, `tools/list` with pagination, over Streamable HTTP or legacy
/// SSE (or `Auto`). Each step is bounded by `timeout`; errors name the server and the step, so
/// one unreachable server can be reported while the others are registered.
pub async fn discover_tools(
    url: &str,
    transport: Transport,
    timeout: Duration,
) -> Result<Vec<Value>, McpClientError> {
    Ok(discover(url, transport, HeaderMap::new(), timeout)
        .await?
        .tools)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::convert::Infallible;

    use http_body_util::combinators::BoxBody;
    use hyper_util::rt::TokioIo;

    type Body = BoxBody<Bytes, Infallible>;

    /// The answer of a scripted server to one JSON-RPC message: three pages of tools.
    fn answer(message: &Value) -> Option<Value> {
        let id = message.get("id")?.clone();
        let result = match message["method"].as_str()? {
            "initialize" => {
                json!({"protocolVersion": PROTOCOL_VERSION, "capabilities": {"tools": {}}, "serverInfo": {"name": "scripted", "version": "1"}})
            }
            "tools/list" => match message["params"]["cursor"].as_str() {
                None => json!({"tools": [{"name": "a"}, {"name": "b"}], "nextCursor": "p1"}),
                Some("p1") => json!({"tools": [], "nextCursor": "p2"}),
                Some("p2") => json!({"tools": [{"name": "c"}]}),
                Some(other) => {
                    return Some(
                        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": format!("bad cursor {other}")}}),
                    );
                }
            },
            _ => json!({}),
        };
        Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
    }

    fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
        let mut r = Response::new(Full::new(body.into()).boxed());
        *r.status_mut() = status;
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_str(content_type).unwrap());
        r
    }

    /// A scripted Streamable HTTP server at `/mcp` (answers as SSE when `sse_replies`) that
    /// insists on the session header after `initialize`, and a legacy SSE server at `/sse` +
    /// `/messages`. Returns its base URL.
    async fn scripted_server(sse_replies: bool) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stream_tx: Arc<Mutex<Option<mpsc::Sender<Bytes>>>> = Arc::default();
        tokio::spawn(async move {
            loop {
                let (io, _) = listener.accept().await.unwrap();
                let stream_tx = stream_tx.clone();
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let stream_tx = stream_tx.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let method = req.method().clone();
                        let has_session = req.headers().get(SESSION_HEADER).is_some();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let response = match (method, path.as_str()) {
                            (Method::POST, "/mcp") => {
                                if message["method"] != "initialize" && !has_session {
                                    reply(StatusCode::BAD_REQUEST, "text/plain", "no session")
                                } else {
                                    match answer(&message) {
                                        None => reply(StatusCode::ACCEPTED, "text/plain", ""),
                                        Some(a) => {
                                            let mut r = if sse_replies {
                                                reply(
                                                    StatusCode::OK,
                                                    "text/event-stream",
                                                    format!("event: message\ndata: {a}\n\n"),
                                                )
                                            } else {
                                                reply(
                                                    StatusCode::OK,
                                                    "application/json",
                                                    a.to_string(),
                                                )
                                            };
                                            r.headers_mut().insert(
                                                SESSION_HEADER,
                                                HeaderValue::from_static("s1"),
                                            );
                                            r
                                        }
                                    }
                                }
                            }
                            (Method::GET, "/sse") => {
                                let (tx, rx) = mpsc::channel::<Bytes>(16);
                                tx.send(Bytes::from_static(
                                    b"event: endpoint\ndata: /messages?sid=1\n\n",
                                ))
                                .await
                                .unwrap();
                                *stream_tx.lock().unwrap() = Some(tx);
                                let body = http_body_util::StreamBody::new(futures_stream(rx));
                                let mut r = Response::new(body.boxed());
                                r.headers_mut().insert(
                                    CONTENT_TYPE,
                                    HeaderValue::from_static("text/event-stream"),
                                );
                                r
                            }
                            (Method::POST, "/messages") => {
                                if let Some(a) = answer(&message) {
                                    let tx = stream_tx.lock().unwrap().clone().unwrap();
                                    tx.send(Bytes::from(format!("event: message\ndata: {a}\n\n")))
                                        .await
                                        .unwrap();
                                }
                                reply(StatusCode::ACCEPTED, "text/plain", "Accepted")
                            }
                            _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found"),
                        };
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(io), service),
                );
            }
        });
        format!("http://{addr}")
    }

    /// A receiver as a body stream, without pulling in a streams crate.
    fn futures_stream(
        rx: mpsc::Receiver<Bytes>,
    ) -> impl futures_util::Stream<Item = Result<hyper::body::Frame<Bytes>, Infallible>> {
        futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok(hyper::body::Frame::data(b)), rx))
        })
    }

    #[tokio::test]
    async fn discovers_every_page_over_each_transport() {
        let names = |tools: Vec<Value>| -> Vec<String> {
            tools
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned())
                .collect()
        };
        let timeout = Duration::from_secs(10);
        for sse_replies in [false, true] {
            let base = scripted_server(sse_replies).await;
            let url = format!("{base}/mcp");
            for transport in [Transport::StreamableHttp, Transport::Auto] {
                let tools = discover_tools(&url, transport, timeout).await.unwrap();
                assert_eq!(names(tools), ["a", "b", "c"], "{url} {transport:?}");
            }
            let sse = format!("{base}/sse");
            let found = discover(&sse, Transport::Auto, HeaderMap::new(), timeout)
                .await
                .unwrap();
            assert_eq!(found.transport, Transport::Sse);
            assert_eq!(names(found.tools), ["a", "b", "c"]);
        }
    }

    #[tokio::test]
    async fn wrong_transport_is_reported_with_the_step() {
        let base = scripted_server(false).await;
        let err = discover_tools(
            &format!("{base}/nowhere"),
            Transport::Sse,
            Duration::from_secs(5),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("/nowhere")
                && err.contains("opening the SSE stream")
                && err.contains("404"),
            "{err}"
        );
    }

    #[test]
    fn endpoint_resolution_stays_on_origin() {
        let base: Uri = "http://127.0.0.1:3001/sse".parse().unwrap();
        assert_eq!(
            resolve_endpoint(&base, "/message?sessionId=abc")
                .unwrap()
                .to_string(),
            "http://127.0.0.1:3001/message?sessionId=abc"
        );
        assert_eq!(
            resolve_endpoint(&base, "http://127.0.0.1:3001/m?x=1")
                .unwrap()
                .to_string(),
            "http://127.0.0.1:3001/m?x=1"
        );
        assert_eq!(
            resolve_endpoint(&"http://h/a/sse".parse().unwrap(), "message")
                .unwrap()
                .to_string(),
            "http://h/a/message"
        );
        assert!(resolve_endpoint(&base, "http://evil.example/message").is_err());
    }

    #[test]
    fn urls_are_checked() {
        assert!(parse_url("ftp://x/").is_err());
        assert!(parse_url("https://x/").is_ok());
        assert!(parse_url("/mcp").is_err());
        assert!(parse_url("http://127.0.0.1:1/mcp").is_ok());
    }

    #[tokio::test]
    async fn unreachable_server_is_named() {
        // Port 1 on loopback: nothing listens there.
        let err = discover_tools(
            "http://127.0.0.1:1/mcp",
            Transport::Auto,
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("http://127.0.0.1:1/mcp") && text.contains("cannot connect"),
            "{text}"
        );
    }
}
