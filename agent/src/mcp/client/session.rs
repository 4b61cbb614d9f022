//! One JSON-RPC session with an upstream server over either transport, and the handshake
//! (`initialize`, `notifications/initialized`) and request/response on top of it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::error::McpClientError;
use super::transport::{
    HttpClient, Inbound, Outlet, PROTOCOL_VERSION_HEADER, SESSION_HEADER, Transport, error_chain,
    http_client, is_sse, note_protocol_version, parse_url, pump_sse, resolve_endpoint,
};
use crate::mcp::budget::Budget;
use crate::mcp::framing::DEFAULT_MAX_MESSAGE_BYTES;
use crate::sse::message::SseDecoder;

/// The protocol version toolwall asks for in its own `initialize`.
pub(crate) const PROTOCOL_VERSION: &str = "2025-06-18";

/// Messages from the server, in arrival order, or the error that ended the session.
pub(crate) type Inbox = mpsc::Receiver<Result<Inbound, McpClientError>>;

/// One session with an upstream MCP server.
pub(crate) struct UpstreamSession {
    http: HttpClient,
    url: Uri,
    transport: Transport,
    /// Where messages are POSTed: the URL itself, or the SSE `endpoint`.
    post_url: Uri,
    /// Headers sent on every request (authorization passed through from the client).
    headers: HeaderMap,
    session_id: Arc<Mutex<Option<HeaderValue>>>,
    protocol_version: Arc<Mutex<Option<HeaderValue>>>,
    outlet: Outlet,
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

impl UpstreamSession {
    /// Opens a session: for legacy SSE this opens the stream and waits for `endpoint`; for
    /// Streamable HTTP nothing is sent until the first message (`initialize`). `Auto` is
    /// resolved by [`connect_and_initialize`], not here. `headers` go on every request. What
    /// the upstream sends is charged to `budget` while it is held ([`Inbound`]).
    pub(crate) async fn open(
        http: HttpClient,
        url: &str,
        transport: Transport,
        headers: HeaderMap,
        timeout: Duration,
        budget: Option<Arc<Budget>>,
    ) -> Result<(Self, Inbox), McpClientError> {
        let uri = parse_url(url)?;
        let (tx, rx) = mpsc::channel(64);
        let outlet = Outlet { tx, budget };
        let mut session = UpstreamSession {
            http,
            post_url: uri.clone(),
            url: uri,
            transport,
            headers,
            session_id: Arc::default(),
            protocol_version: Arc::default(),
            outlet,
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
    pub(crate) fn transport(&self) -> Transport {
        self.transport
    }

    /// The server's URL, for messages.
    pub(crate) fn url(&self) -> String {
        self.url.to_string()
    }

    /// `sent`: the request may have reached the server before the connection failed.
    fn err_connect(&self, step: &str, sent: bool, e: impl std::fmt::Display) -> McpClientError {
        McpClientError::Connect {
            url: self.url(),
            step: step.to_owned(),
            reason: e.to_string(),
            sent,
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
            // The pooled client sends a request again on a new connection when it was not
            // written; an error that is not the connection's is one after it was.
            Ok(Err(e)) => Err(self.err_connect(step, !e.is_connect(), error_chain(&e))),
            Err(_) => Err(McpClientError::Timeout {
                url: self.url(),
                step: step.to_owned(),
                timeout: self.timeout,
            }),
        }
    }

    /// Sends one JSON-RPC message (or batch). Whatever the server answers arrives on the
    /// inbox; an error here means the message was not accepted.
    pub(crate) async fn send(&self, message: Bytes) -> Result<(), McpClientError> {
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
            return Err(McpClientError::refused(self.url(), step.to_owned(), response).await);
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
                SseDecoder::with_limit(DEFAULT_MAX_MESSAGE_BYTES),
                self.outlet.clone(),
                self.protocol_version.clone(),
                self.url(),
                false,
            ));
            self.track(task);
            return Ok(());
        }
        // Bounded like any message: a server cannot make a response of unbounded size held.
        let body = http_body_util::Limited::new(response.into_body(), DEFAULT_MAX_MESSAGE_BYTES)
            .collect()
            .await
            .map_err(|e| self.err_connect("reading a response", true, e))?
            .to_bytes();
        note_protocol_version(&self.protocol_version, &body);
        match self.outlet.put(body).await {
            true => Ok(()),
            false => Err(McpClientError::Closed {
                url: self.url(),
                reason: "the session was closed".into(),
            }),
        }
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
    pub(crate) async fn open_get_stream(
        &self,
        last_event_id: Option<&str>,
    ) -> Result<(), McpClientError> {
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
            SseDecoder::with_limit(DEFAULT_MAX_MESSAGE_BYTES),
            self.outlet.clone(),
            self.protocol_version.clone(),
            self.url(),
            false,
        ));
        self.track(task);
        Ok(())
    }

    /// Ends the session: Streamable HTTP sends DELETE (best effort); streams are dropped.
    pub(crate) async fn close(self) {
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
            let step = format!("{step} (expected 200 text/event-stream)");
            return Err(McpClientError::refused(self.url(), step, response).await);
        }
        let mut body = response.into_body();
        let mut decoder = SseDecoder::with_limit(DEFAULT_MAX_MESSAGE_BYTES);
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
                    Some(Err(e)) => return Err(self.err_connect(step, false, e)),
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
            self.outlet.clone(),
            self.protocol_version.clone(),
            self.url(),
            true,
        ));
        self.track(task);
        Ok(())
    }
}

/// Opens a session and completes the handshake (`initialize`, `notifications/initialized`),
/// resolving `Auto` the spec's way. Returns the session, its inbox and the initialize result.
pub(crate) async fn connect_and_initialize(
    url: &str,
    transport: Transport,
    headers: HeaderMap,
    timeout: Duration,
) -> Result<(UpstreamSession, Inbox, Value), McpClientError> {
    let attempt = |transport| {
        let headers = headers.clone();
        async move {
            let (session, mut inbox) =
                UpstreamSession::open(http_client()?, url, transport, headers, timeout, None)
                    .await?;
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
pub(crate) async fn call(
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
