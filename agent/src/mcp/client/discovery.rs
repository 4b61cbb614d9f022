//! Start-up discovery of a server's tools.
//!
//! At MCP 2026-07-28, the stateless revision, there is no `initialize` and no session: each
//! request carries its version and capabilities in `params._meta` and the routing headers
//! (`MCP-Protocol-Version`, `Mcp-Method`) on its POST (`Modern`, below).
//!
//! [`discover`] negotiates as the spec's Streamable HTTP backward-compatibility section says:
//! `server/discover` first; a result naming 2026-07-28 means a modern server, listed here; an
//! HTTP error without a modern JSON-RPC error (legacy servers answer 400 "Server not
//! initialized", 404 or 405) means a handshake server, listed with `initialize` as before
//! (an [`UpstreamSession`]).

use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{Value, json};

use super::error::McpClientError;
use super::session::{Inbox, UpstreamSession, call, connect_and_initialize};
use super::transport::{HttpClient, PROTOCOL_VERSION_HEADER, Transport, http_client, parse_url};
use crate::mcp::framing::DEFAULT_MAX_MESSAGE_BYTES;
use crate::sse::message::SseDecoder;

/// The stateless revision.
pub(crate) const MODERN_VERSION: &str = "2026-07-28";
/// `Mcp-Method`, required on every 2026-07-28 POST.
const METHOD_HEADER: HeaderName = HeaderName::from_static("mcp-method");
/// JSON-RPC code of "UnsupportedProtocolVersion" (2026-07-28).
const UNSUPPORTED_VERSION: i64 = -32022;
/// Most bytes of one response toolwall reads during discovery.
const MAX_RESPONSE_BYTES: usize = 64 << 20;
/// Most `tools/list` pages followed before giving up on a server that never stops paging.
const MAX_PAGES: usize = 1000;

/// One server spoken to at 2026-07-28.
struct Modern<'a> {
    http: &'a HttpClient,
    url: &'a Uri,
    /// Extra headers (authorization).
    headers: &'a HeaderMap,
    timeout: Duration,
}

/// What `server/discover` said of the server.
enum Era {
    /// It speaks 2026-07-28.
    Modern,
    /// It answered like a server of the handshake revisions.
    Handshake(String),
}

fn envelope() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "toolwall", "version": env!("CARGO_PKG_VERSION")},
    })
}

impl Modern<'_> {
    fn url(&self) -> String {
        self.url.to_string()
    }

    /// Sends one request; `Ok(Ok(result))`, `Ok(Err((status, error)))` for a JSON-RPC error
    /// or an HTTP refusal (the error object, or `null` when the body held none).
    async fn request(
        &self,
        id: u64,
        method: &str,
        mut params: Value,
    ) -> Result<Result<Value, (StatusCode, Value)>, McpClientError> {
        if let Some(p) = params.as_object_mut() {
            p.insert("_meta".into(), envelope());
        }
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut request = Request::new(Full::new(Bytes::from(body.to_string())));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.url.clone();
        let h = request.headers_mut();
        h.clone_from(self.headers);
        h.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(
            PROTOCOL_VERSION_HEADER,
            HeaderValue::from_static(MODERN_VERSION),
        );
        let step = format!("{method} at {MODERN_VERSION}");
        h.insert(
            METHOD_HEADER,
            HeaderValue::from_str(method).map_err(|e| self.protocol(&step, e))?,
        );
        let exchange = async {
            let response =
                self.http
                    .request(request)
                    .await
                    .map_err(|e| McpClientError::Connect {
                        url: self.url(),
                        step: step.clone(),
                        reason: e.to_string(),
                        sent: !e.is_connect(),
                    })?;
            let status = response.status();
            // A protected server: its challenge is the answer, whatever its body says.
            if super::error::is_challenge(status, response.headers()) {
                return Err(McpClientError::refused(self.url(), step.clone(), response).await);
            }
            let is_sse = crate::edge::is_event_stream(response.headers());
            let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| self.protocol(&step, e))?
                .to_bytes();
            let message = match is_sse {
                true => last_message(&body, id),
                false => serde_json::from_slice::<Value>(&body).ok(),
            };
            let error = message.as_ref().and_then(|m| m.get("error")).cloned();
            match (status.is_success(), message) {
                (true, Some(m)) if error.is_none() => {
                    m.get("result").cloned().map(Ok).ok_or_else(|| {
                        self.protocol(&step, "a response with neither result nor error")
                    })
                }
                (_, _) if error.is_some() || !status.is_success() => {
                    Ok(Err((status, error.unwrap_or(Value::Null))))
                }
                _ => Err(self.protocol(&step, "no JSON-RPC response in the body")),
            }
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(McpClientError::Timeout {
                    url: self.url(),
                    step: step.clone(),
                    timeout: self.timeout,
                })
            })
    }

    fn protocol(&self, step: &str, message: impl std::fmt::Display) -> McpClientError {
        McpClientError::Protocol {
            url: self.url(),
            step: step.to_owned(),
            message: message.to_string(),
        }
    }

    /// `server/discover`: which era the server speaks.
    async fn era(&self) -> Result<Era, McpClientError> {
        let answer = match self.request(0, "server/discover", json!({})).await {
            Ok(answer) => answer,
            // No answer in time, or one that is not JSON-RPC: not a modern server (the spec:
            // any other error, or none within a time-out, means the handshake revisions).
            Err(e @ (McpClientError::Timeout { .. } | McpClientError::Protocol { .. })) => {
                return Ok(Era::Handshake(e.to_string()));
            }
            Err(e) => return Err(e),
        };
        match answer {
            Ok(result) => {
                let speaks = result
                    .get("supportedVersions")
                    .and_then(Value::as_array)
                    .is_some_and(|v| v.iter().any(|v| v == MODERN_VERSION));
                Ok(match speaks {
                    true => Era::Modern,
                    false => Era::Handshake(format!(
                        "server/discover names no version toolwall speaks: {}",
                        result.get("supportedVersions").unwrap_or(&Value::Null)
                    )),
                })
            }
            // A modern server that does not speak this version says which it does: with none
            // in common there is nothing to fall back to either (the spec: do not fall back).
            Err((_, error)) if error.get("code") == Some(&json!(UNSUPPORTED_VERSION)) => Err(self
                .protocol(
                    "server/discover",
                    format!("the server speaks no revision toolwall speaks: {error}"),
                )),
            Err((status, error)) => Ok(Era::Handshake(format!(
                "server/discover answered HTTP {status} {error}"
            ))),
        }
    }

    /// Every tool, following `nextCursor`, at most `max_pages` pages.
    async fn list_tools(&self, max_pages: usize) -> Result<Vec<Value>, McpClientError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for page in 0..max_pages {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let result = self
                .request(1 + page as u64, "tools/list", params)
                .await?
                .map_err(|(status, error)| {
                    self.protocol("tools/list", format!("HTTP {status}: {error}"))
                })?;
            let Some(Value::Array(items)) = result.get("tools").cloned() else {
                return Err(self.protocol("tools/list", "the result has no `tools` array"));
            };
            tools.extend(items);
            match result.get("nextCursor").and_then(Value::as_str) {
                Some(next) if cursor.as_deref() == Some(next) => {
                    return Err(
                        self.protocol("tools/list", format!("the server repeats cursor {next:?}"))
                    );
                }
                Some(next) => cursor = Some(next.to_owned()),
                None => return Ok(tools),
            }
        }
        Err(self.protocol("tools/list", format!("more than {max_pages} pages")))
    }
}

/// The response with `id` in an SSE body (a request-scoped stream ends with it).
fn last_message(body: &[u8], id: u64) -> Option<Value> {
    let mut decoder = SseDecoder::with_limit(DEFAULT_MAX_MESSAGE_BYTES);
    decoder.feed(body);
    let mut found = None;
    while let Some(event) = decoder.next_event() {
        if let Ok(value) = serde_json::from_slice::<Value>(&event.data)
            && value.get("method").is_none()
            && value.get("id") == Some(&json!(id))
        {
            found = Some(value);
        }
    }
    found
}

/// What start-up learned about a server.
#[derive(Debug)]
pub(crate) struct Discovered {
    /// The transport it speaks (never `Auto`).
    pub transport: Transport,
    /// Its tools, every page, as listed.
    pub tools: Vec<Value>,
}

/// Lists every tool of an initialized session, following `nextCursor`.
pub(crate) async fn list_all_tools(
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
/// 2026-07-28, every `tools/list` page (`Modern`, above); otherwise the handshake, every
/// `tools/list` page, then the session is closed. The whole exchange is bounded by `timeout` per step.
pub(crate) async fn discover(
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
#[cfg(test)]
pub(crate) async fn discover_tools(
    url: &str,
    transport: Transport,
    timeout: Duration,
) -> Result<Vec<Value>, McpClientError> {
    Ok(discover(url, transport, HeaderMap::new(), timeout)
        .await?
        .tools)
}
