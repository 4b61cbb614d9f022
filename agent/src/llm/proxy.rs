//! The HTTP shell around the interceptors: a hyper 1.x reverse proxy on loopback.
//!
//! Use: [`LlmProxy::bind`] (learn the address with [`LlmProxy::local_addr`], port 0 in tests),
//! then [`LlmProxy::run`] until a shutdown future resolves; or [`serve`] for both at once.
//!
//! Routing (`llm/routes.rs`): only the routes toolwall reads are relayed — the dialect routes
//! (`/v1/messages`, `.../chat/completions`, `.../responses`), whose answers the dialect
//! machines read, and routes without calls of their own (models, `count_tokens`, embeddings,
//! conversations), whose answers are read whole and judged as one document by call shape —
//! plus what `proxy.pass_through` lists, relayed uninspected and recorded. Every other request
//! is refused (403, recorded as `llm_route`), so a route no dialect reads (Assistants, Managed
//! Agents, Batches, ChatKit) or another vendor's path never reaches an upstream. An upstream is a
//! base URL such as `https://api.anthropic.com` (an optional path prefix is kept): the client's
//! path is appended as is, so clients use `ANTHROPIC_BASE_URL=http://127.0.0.1:18080` and
//! `OPENAI_BASE_URL=http://127.0.0.1:18080/v1`.
//!
//! Inspected responses: a 2xx `text/event-stream` is fed through a [`StreamInterceptor`] read
//! by read, on the client connection's task (what is ready is written at once, coalesced into
//! one write: `relay.rs`); any other body (an error status's too) is read whole (up to the
//! buffer limit) and rewritten or judged. Upstream is asked for `identity`; a compressed answer
//! (gzip, deflate, br, zstd) is decoded before inspection and sent on uncompressed; an unknown
//! encoding is refused (502). A redirect (3xx) is refused (502): the client would follow it,
//! possibly to a route read another way. WebSocket upgrades are refused with 426 (Codex then
//! falls back to HTTP streaming), never tunnelled uninspected.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::Dialect;
use super::relay::{Plain, Relay};
use super::request;
use super::routes::{self, Reading};
use super::upstream::{OutBody, Upstreams};
use crate::config::Provider;
use crate::decision::Action;
use crate::decision::Gate;
use crate::events::EventSink;

mod budget;
mod clients;
mod encoding;
mod exchange;
mod request_body;
mod routing;
mod sessions;
mod settings;
mod sniff;
mod uninspected;
mod urls;

pub(crate) use sessions::SessionKeys;
use sessions::{Peer, split_session};
pub use settings::LlmProxySettings;

use encoding::Encoding;
use exchange::Exchange;
use request_body::read_request;
use routing::{Upstream, upstream_of};
use sniff::sniff;
use uninspected::{Seen, relay_uninspected};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Most bytes decoded per step of a compressed stream. Whatever has arrived is handled at once
/// (a small read is never held back), so this bounds only how much one step may batch when
/// upstream is fast: larger steps spread the per-step costs (a task wake-up, a channel send, a
/// write) over more bytes. (An identity stream goes in the frames hyper read.)
const READ_CHUNK: usize = 64 * 1024;
/// The reads of an inspected stream, decoded.
type Reads = Pin<Box<dyn futures_util::Stream<Item = io::Result<Bytes>> + Send>>;
/// The body type of every response the proxy writes.
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

struct Inner {
    settings: LlmProxySettings,
    anthropic: Upstream,
    openai: Upstream,
    gemini: Upstream,
    gate: Arc<dyn Gate>,
    sink: EventSink,
    upstreams: Arc<Upstreams>,
    next_request: AtomicU64,
    /// This run's random prefix of request ids (`llm-k3f9-1`): a request id is one model
    /// answer's in the whole record, not only in one daemon run's.
    run: String,
    /// Tool results whose findings were recorded (a conversation sends them again each turn).
    recorded: request::Recorded,
    /// Inspected request bodies read and judged at once ([`request::MAX_READING`]).
    reading: tokio::sync::Semaphore,
    /// Who is asked about calls an argument rule asks about; without, they are refused.
    approvals: Option<Arc<crate::approval::Approvals>>,
    /// The response bodies, for `/metrics`.
    stats: Arc<super::RelayStats>,
    /// Every byte held on a client's behalf, bounded together.
    budget: Arc<budget::Budget>,
    /// Open connections by client.
    clients: Arc<clients::Clients>,
}

impl Inner {
    /// The hosts of the configured upstreams, lower-case (`urls.rs`).
    fn provider_origins(&self) -> Vec<String> {
        [&self.anthropic, &self.openai, &self.gemini]
            .iter()
            .map(|u| u.origin.host.to_ascii_lowercase())
            .collect()
    }
}

/// A bound, not yet running proxy.
pub struct LlmProxy {
    listener: TcpListener,
    inner: Arc<Inner>,
}

impl LlmProxy {
    /// Validates the settings, builds the upstream client (`upstream.rs`: rustls with the
    /// system's roots) and
    /// binds the listener, so the caller learns the address before serving.
    pub async fn bind(
        settings: LlmProxySettings,
        gate: Arc<dyn Gate>,
        sink: EventSink,
    ) -> anyhow::Result<Self> {
        Upstream::parse(&settings.anthropic_upstream)?;
        Upstream::parse(&settings.openai_upstream)?;
        Upstream::parse(&settings.gemini_upstream)?;
        let listener = TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("cannot listen on {}", settings.listen))?;
        Self::on(listener, settings, gate, sink)
    }

    /// [`Self::bind`] on a listener already bound to `settings.listen` (one systemd holds).
    pub(crate) fn on(
        listener: TcpListener,
        settings: LlmProxySettings,
        gate: Arc<dyn Gate>,
        sink: EventSink,
    ) -> anyhow::Result<Self> {
        let anthropic = Upstream::parse(&settings.anthropic_upstream)?;
        let openai = Upstream::parse(&settings.openai_upstream)?;
        let gemini = Upstream::parse(&settings.gemini_upstream)?;
        let upstreams = Upstreams::new()?;
        Ok(LlmProxy {
            listener,
            inner: Arc::new(Inner {
                anthropic,
                openai,
                gemini,
                gate,
                sink,
                upstreams,
                next_request: AtomicU64::new(1),
                run: crate::approval::run_prefix(),
                recorded: request::Recorded::default(),
                reading: tokio::sync::Semaphore::new(request::MAX_READING),
                approvals: None,
                stats: Arc::default(),
                budget: budget::Budget::new(settings.memory_budget),
                clients: clients::Clients::new(settings.max_connections_per_client),
                settings,
            }),
        })
    }

    /// Puts the calls an argument rule asks about to a person (the daemon's approvals).
    pub(crate) fn with_approvals(
        mut self,
        approvals: Arc<crate::approval::Approvals>,
    ) -> anyhow::Result<Self> {
        Arc::get_mut(&mut self.inner)
            .context("the proxy is already serving")?
            .approvals = Some(approvals);
        Ok(self)
    }

    /// What its response bodies did, for `/metrics` (`daemon/metrics.rs`).
    pub(crate) fn stats(&self) -> Arc<super::RelayStats> {
        self.inner.stats.clone()
    }

    /// The address actually bound (the port, when 0 was asked for).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts and serves connections until `shutdown` resolves; connections in flight then
    /// finish on their own tasks.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        tracing::info!(addr = ?self.listener.local_addr().ok(), "LLM proxy listening");
        let mut refusing = false;
        // No new connections once stopped; open exchanges get 2 s, then end. Every connection
        // holds the event sink, so when this returns the sink is released and the store can
        // flush and close.
        let grace = std::time::Duration::from_secs(2);
        crate::edge::accept_loop(&self.listener, shutdown, grace, |(stream, peer), open| {
            if open >= MAX_CONNECTIONS {
                // Refused, not queued: a flood of idle connections must not take the daemon's
                // descriptors (its API socket and kernel watch need them).
                if !refusing {
                    tracing::warn!(
                        "LLM proxy: {MAX_CONNECTIONS} client connections open; refusing more until some close"
                    );
                }
                refusing = true;
                return None;
            }
            refusing = false;
            let inner = self.inner.clone();
            Some(serve_client(inner, stream, peer))
        })
        .await;
        tracing::info!("LLM proxy stopped");
        Ok(())
    }
}

/// One client connection: HTTP/1.1 until it closes or stays silent too long.
///
/// HTTP/1.1 only: the SDKs and agents speak it to an `http://` base URL, and an HTTP/2
/// connection (h2c) would be held with no time-out on its head (hyper's h2 server has none), so
/// a client that sends only the h2 preface is answered with an error and closed at once.
async fn serve_client(inner: Arc<Inner>, stream: tokio::net::TcpStream, peer: SocketAddr) {
    // Who the client is, asked of the kernel once: its user and cgroup count its connections
    // (`clients.rs`) and tell which session it belongs to (`sessions.rs`).
    let (client, cgroup) = clients::ClientKey::of(stream.local_addr(), peer);
    let Some(admitted) = inner.clients.admit(client) else {
        return;
    };
    let header_read_timeout = inner.settings.header_read_timeout;
    // hyper's head time-out starts only once the first bytes arrive: a client that sends
    // nothing is timed out here.
    let mut first = [0u8; 1];
    if !matches!(
        tokio::time::timeout(header_read_timeout, stream.peek(&mut first)).await,
        Ok(Ok(1))
    ) {
        tracing::debug!(%peer, "client sent nothing within {header_read_timeout:?}");
        return;
    }
    let origin = inner.settings.session_keys.origin(cgroup);
    if let Peer::Unknown(why) = &origin {
        tracing::warn!(%peer, "cannot tell which session a client connection comes from: {why}");
    }
    let origin = Arc::new(origin);
    let bytes = admitted.bytes();
    let service = hyper::service::service_fn(move |req| {
        handle(inner.clone(), origin.clone(), bytes.clone(), req)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // A client that never finishes its request head must not hold a descriptor for ever:
    // partial heads would exhaust the proxy's descriptors.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    if let Err(e) = builder
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(%peer, error = %e, "client connection ended with an error");
    }
}

/// Most client connections open at once (each holds a descriptor, and upstream ones more).
const MAX_CONNECTIONS: usize = 4096;

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<ProxyBody> {
    let mut resp = Response::new(
        Full::new(body.into())
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = status;
    resp
}

fn is_upgrade(req: &Request<Incoming>) -> bool {
    req.headers().contains_key(header::UPGRADE)
        || req
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.to_ascii_lowercase().contains("upgrade"))
}

async fn handle(
    inner: Arc<Inner>,
    origin: Arc<Peer>,
    client: budget::ClientBytes,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    // While the store is behind, the next request waits (its response's calls would queue).
    inner.sink.room().await;
    let request_id = format!(
        "llm-{}-{}",
        inner.run,
        inner.next_request.fetch_add(1, Ordering::Relaxed)
    );
    let (session, path_and_query) = match split_session(
        req.uri().path_and_query().map_or("/", |p| p.as_str()),
        &inner.settings.session_keys,
        &inner.settings.session_id,
        &origin,
    ) {
        Ok(found) => found,
        Err(refused) => {
            tracing::warn!(%request_id, origin = ?origin, "refused a request: {refused}");
            // Not knowing where a connection comes from is ours to fix, not the client's.
            let status = match refused {
                sessions::Refused::Unverified(_) => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::FORBIDDEN,
            };
            return Ok(full(status, format!("toolwall: {refused}")));
        }
    };
    let seen = Seen {
        inner: &inner,
        session: &session,
        request_id: &request_id,
        method: req.method().clone(),
        path_and_query: &path_and_query,
    };
    if is_upgrade(&req) {
        tracing::info!(%request_id, path = %path_and_query, "refusing a protocol upgrade (426)");
        seen.record(
            None,
            Action::Block,
            "refused: a protocol upgrade (WebSocket) is not proxied".to_owned(),
        );
        let mut resp = full(
            StatusCode::UPGRADE_REQUIRED,
            "toolwall: WebSocket is not proxied; use HTTP streaming",
        );
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return Ok(resp);
    }
    // Every method: a provider's router could read a path toolwall's does not.
    if let Some(why) = request::ambiguous_path(&path_and_query) {
        tracing::warn!(%request_id, path = %path_and_query, "{why}");
        seen.record(None, Action::Block, why.clone());
        return Ok(full(StatusCode::BAD_REQUEST, format!("toolwall: {why}")));
    }
    let routed = match routes::route(
        req.method(),
        &path_and_query,
        req.headers(),
        &inner.settings.pass_through,
    ) {
        Ok(routed) => routed,
        Err(refused) => {
            tracing::warn!(%request_id, method = %req.method(), "refused a request: {refused}");
            seen.record(None, Action::Block, refused.to_string());
            return Ok(full(StatusCode::FORBIDDEN, format!("toolwall: {refused}")));
        }
    };
    let upstream = upstream_of(&inner, routed.provider);
    let uri = match upstream.uri(&path_and_query) {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(%request_id, error = %e, "bad request path");
            return Ok(full(StatusCode::BAD_REQUEST, "toolwall: bad request path"));
        }
    };
    if routed.reading == Reading::Uninspected {
        seen.record(
            Some(routed.provider),
            Action::Allow,
            "relayed uninspected: the route is listed in proxy.pass_through".to_owned(),
        );
        return Ok(relay_uninspected(&inner, upstream, &uri, req, &request_id).await);
    }
    let (mut parts, body) = req.into_parts();
    crate::edge::strip_hop_by_hop(&mut parts.headers);
    // Every relayed answer is read: ask for the bytes as they are; a compressed answer is
    // decoded anyway.
    parts.headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    let method = parts.method.clone();
    // An inspected route's request is read whole: the tool results in it are judged before
    // the model reads them (`llm/request.rs`).
    // Judged whatever the method: a body is a body to the provider.
    let has_body = !hyper::body::Body::is_end_stream(&body);
    let body = match routed.request.filter(|_| has_body) {
        Some(route) => {
            match read_request(&inner, route, &parts.headers, body, &session, &client).await {
                Ok(body) => body,
                Err(refusal) => {
                    tracing::warn!(%request_id, "{refusal}");
                    seen.record(
                        Some(routed.provider),
                        Action::Block,
                        format!("refused: {refusal}"),
                    );
                    return Ok(full(refusal.status, format!("toolwall: {refusal}")));
                }
            }
        }
        None => OutBody::Stream(body),
    };
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    tracing::debug!(%request_id, %method, path = %path_and_query, ?routed, "forwarding");
    let upstream_resp = match inner
        .upstreams
        .send(&upstream.origin, &method, target, &parts.headers, body)
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%request_id, error = %e, "upstream request failed");
            // The cause (DNS, connect, TLS, time-out) goes to the agent too: its SDK's error is
            // often all a user sees, and the daemon's log may be another person's.
            return Ok(full(
                StatusCode::BAD_GATEWAY,
                format!("toolwall: upstream request failed: {e}"),
            ));
        }
    };
    let (mut parts, body) = upstream_resp.into_parts();
    let encoding = Encoding::of(&parts.headers);
    crate::edge::strip_hop_by_hop(&mut parts.headers);
    if parts.status.is_redirection() {
        // The SDKs follow a redirect, and back through this proxy it could lead to a route
        // that is read another way: a redirect never leaves a route toolwall reads.
        tracing::error!(%request_id, status = %parts.status, location = ?parts.headers.get(header::LOCATION), "upstream redirected an inspected request: refused (502)");
        return Ok(full(
            StatusCode::BAD_GATEWAY,
            "toolwall: the upstream answered with a redirect; toolwall does not pass redirects on the routes it reads",
        ));
    }
    if let Some(charset) = encoding::foreign_charset(&parts.headers) {
        tracing::error!(%request_id, %charset, "upstream labelled its answer with a character set other than UTF-8: refused (502)");
        return Ok(full(
            StatusCode::BAD_GATEWAY,
            format!(
                "toolwall: the upstream's answer is labelled charset={charset}; toolwall reads only UTF-8, and a client decoding by that label would read something else"
            ),
        ));
    }
    if method == hyper::Method::HEAD {
        return Ok(Response::from_parts(
            parts,
            Relay::new(Plain(body)).counted(&inner.stats).boxed_unsync(),
        ));
    }
    let encoding = match encoding {
        Ok(e) => e,
        Err(name) => {
            tracing::error!(%request_id, encoding = %name, "unknown content-encoding: refusing the response");
            return Ok(full(
                StatusCode::BAD_GATEWAY,
                "toolwall: upstream used an unknown content-encoding",
            ));
        }
    };
    parts.headers.remove(header::CONTENT_ENCODING);
    parts.headers.remove(header::CONTENT_LENGTH);
    let ctx = Exchange {
        inner: inner.clone(),
        // The dialect the route speaks, or for other routes the provider's main one (it only
        // labels what the call-shape judge records).
        dialect: match routed.reading {
            Reading::Dialect(d) => d,
            _ => match routed.provider {
                Provider::Anthropic => Dialect::Anthropic,
                Provider::Openai => Dialect::OpenAiChat,
                Provider::Gemini => Dialect::Gemini,
            },
        },
        request_id,
        session,
        client,
    };
    let mut reads = encoding.reads(body);
    let dialect = match routed.reading {
        Reading::Dialect(d) if parts.status.is_success() => d,
        _ => {
            // Routes without calls of their own, and error statuses: read whole and judged as
            // one document.
            if !parts.status.is_success() {
                tracing::warn!(request_id = %ctx.request_id, status = %parts.status, "upstream error status (passed on, judged whole)");
            }
            return Ok(match ctx.document(reads).await {
                Ok(body) => whole(parts, body),
                Err(resp) => resp,
            });
        }
    };
    // What the body is decides how it is read, not its label: the SDKs parse a JSON document
    // as JSON whatever its content-type says.
    let peeked = match sniff(&mut reads, inner.settings.max_stream_buffer).await {
        Ok(peeked) => peeked,
        Err(e) => {
            tracing::warn!(request_id = %ctx.request_id, error = %e, "upstream body broke");
            return Ok(full(
                StatusCode::BAD_GATEWAY,
                "toolwall: upstream body broke",
            ));
        }
    };
    let json = peeked.json;
    let reads: Reads =
        Box::pin(futures_util::stream::iter(peeked.reads.into_iter().map(Ok)).chain(reads));
    let labelled_sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("text/event-stream"));
    if labelled_sse == json {
        tracing::warn!(request_id = %ctx.request_id, ?dialect, labelled_sse, "the body is not what its content-type says: read as what it is");
    }
    if !json {
        return Ok(Response::from_parts(parts, ctx.stream(reads)));
    }
    match ctx.buffered(reads).await {
        Ok(body) => Ok(whole(parts, body)),
        Err(resp) => Ok(resp),
    }
}

/// A response of `parts` with the whole `body`.
fn whole(mut parts: hyper::http::response::Parts, body: Bytes) -> Response<ProxyBody> {
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    Response::from_parts(
        parts,
        Full::new(body)
            .map_err(|never| match never {})
            .boxed_unsync(),
    )
}

#[cfg(test)]
mod tests;
