//! Bridged sessions: a client session (legacy SSE, or Streamable HTTP in front of a legacy
//! SSE upstream) served from one [`UpstreamSession`] of its own.

use super::*;
use crate::mcp::filter::IdKey;
use crate::mcp::offload::Away;

mod streamable;
pub(super) use streamable::{bridge_streamable, reap_idle_sessions};

/// One client session bridged to its own upstream session.
pub(super) struct BridgedSession {
    upstream: UpstreamSession,
    filter: Mutex<Filter>,
    /// Held while `filter` is locked for a judgement, the whole time one runs off the proxy's
    /// thread (`mcp/offload.rs`): the proxy's thread waits here for its turn (asynchronously,
    /// serving other clients) rather than blocking on `filter`.
    judging: tokio::sync::Mutex<()>,
    /// The client's stream (legacy SSE stream, or the Streamable HTTP GET stream).
    stream: Mutex<Option<mpsc::Sender<Outbound>>>,
    /// Server messages waiting for a GET stream (Streamable HTTP client, bounded), each with
    /// its charge to the session's budget.
    queued: Mutex<Vec<Outbound>>,
    /// Requests of Streamable HTTP POSTs waiting for their responses, by id as the peers
    /// compare ids (`8.0` is answered `8`: [`IdKey`]).
    waiting: Mutex<HashMap<IdKey, mpsc::Sender<Outbound>>>,
    get_opened: std::sync::atomic::AtomicBool,
    /// When the client last sent a request or opened its stream (idle sessions are reaped).
    last_active: Mutex<tokio::time::Instant>,
    /// Told when the upstream session broke (a legacy client's stream then ends).
    pub(super) ended: tokio::sync::Notify,
    /// Who opened it (`identity.rs`): the upstream session holds their credentials, so only
    /// their requests may use it (knowing a session id is not enough).
    opened_by: u64,
}

/// Most server messages a bridged Streamable HTTP session keeps for a GET stream its client
/// has not opened yet (and at most half its byte budget: the rest is for its responses).
pub(super) const MAX_QUEUED: usize = 256;
/// Most client sessions bridged at once (each holds an upstream session), of each transport:
/// Streamable HTTP sessions to a legacy SSE upstream, and legacy `GET /sse` streams.
pub(super) const MAX_BRIDGED: usize = 256;

/// Whether a client message is a single `initialize` request.
fn is_initialize(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body)
        .is_ok_and(|m| m.get("method").and_then(Value::as_str) == Some("initialize"))
}

/// A POST's waiters, removed when the POST ends however it ends.
struct Waiters<'a> {
    session: &'a BridgedSession,
    ids: Vec<IdKey>,
}

impl Drop for Waiters<'_> {
    fn drop(&mut self) {
        if let Ok(mut w) = self.session.waiting.lock() {
            for id in &self.ids {
                w.remove(id);
            }
        }
    }
}

impl BridgedSession {
    /// Whether a request comes from the session's opener; the refusal for one that does not.
    pub(super) fn check_opener(
        &self,
        shared: &Shared,
        headers: &HeaderMap,
    ) -> Result<(), Box<Response<ProxyBody>>> {
        if shared.identities.of(headers, None) == self.opened_by {
            return Ok(());
        }
        tracing::warn!(
            "refused a request for a session opened with other credentials (the same headers must come with each request of a session)"
        );
        Err(Box::new(plain(
            StatusCode::FORBIDDEN,
            "this session was opened with other credentials; send each request of a session with the headers that opened it",
        )))
    }

    fn touch(&self) {
        if let Ok(mut t) = self.last_active.lock() {
            *t = tokio::time::Instant::now();
        }
    }

    /// No request in flight, no client stream open, and nothing from the client for `idle`.
    fn idle(&self, idle: Duration, now: tokio::time::Instant) -> bool {
        let waiting = self.waiting.lock().map(|w| !w.is_empty()).unwrap_or(true);
        let streaming = self
            .stream
            .lock()
            .map(|s| s.as_ref().is_some_and(|tx| !tx.is_closed()))
            .unwrap_or(true);
        if waiting || streaming {
            // An open stream counts as activity up to now: its client may reconnect after it
            // drops, and the idle clock starts at the drop, not at the opening.
            self.touch();
            return false;
        }
        self.last_active
            .lock()
            .map(|t| now - *t >= idle)
            .unwrap_or(false)
    }

    /// The upstream session broke: the client's stream ends and the session is forgotten, so
    /// the client's next request gets 404 and starts a new one.
    fn end(self: &Arc<Self>, shared: &Shared) {
        if let Ok(mut s) = self.stream.lock() {
            s.take();
        }
        self.ended.notify_one();
        for map in [&shared.bridged, &shared.sse_sessions] {
            if let Ok(mut m) = map.lock() {
                m.retain(|_, s| !Arc::ptr_eq(s, self));
            }
        }
    }

    /// Delivers one (filtered) server message with its charge: to the POST waiting for it,
    /// else the stream, else the queue. Returns false when the client is gone.
    pub(super) async fn deliver(
        &self,
        shared: &Shared,
        message: Bytes,
        charge: Option<Charge>,
    ) -> bool {
        if let Some(id) = response_id(&message).and_then(|id| IdKey::of(&id)) {
            let waiter = self.waiting.lock().ok().and_then(|mut w| w.remove(&id));
            if let Some(waiter) = waiter {
                let _ = waiter.send((message, charge)).await;
                return true;
            }
        }
        let stream = self.stream.lock().ok().and_then(|s| s.clone());
        match stream {
            Some(tx) => tx
                .send((
                    Bytes::from(encode_event(Some("message"), None, &message)),
                    charge,
                ))
                .await
                .is_ok(),
            // A response goes to the request that waits for it, never to a stream opened
            // later: one nobody waits for any more (its POST timed out or left) is dropped.
            None if response_id(&message).is_some() => {
                let dropped = shared
                    .unawaited
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    + 1;
                tracing::warn!(
                    dropped,
                    "dropped a server response no request waits for (its client left or timed out)"
                );
                true
            }
            None => {
                if let Ok(mut q) = self.queued.lock() {
                    let held: usize = q.iter().map(|(m, _)| m.len()).sum();
                    if q.len() < MAX_QUEUED && held + message.len() <= shared.session_bytes / 2 {
                        q.push((message, charge));
                    } else {
                        tracing::warn!(
                            queued = q.len(),
                            bytes = held,
                            "client has no stream open and its queue is full; dropping a server message"
                        );
                    }
                }
                true
            }
        }
    }

    /// Filters a client message and sends what passes upstream. Returns what was sent (`None`
    /// when nothing was, or the upstream refused it) and the replies the client gets from
    /// toolwall: refused calls, and an error for each request the upstream refused to take.
    pub(super) async fn client_message(
        self: &Arc<Self>,
        shared: &Shared,
        body: &Bytes,
    ) -> (Option<Bytes>, Vec<Vec<u8>>) {
        // A call before the session listed: its list first, in its own upstream session.
        let first = {
            let _turn = self.judging.lock().await;
            self.filter
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .list_first(body)
        };
        if let Some(first) = first
            && let Err(why) = self.list_for(shared, first).await
        {
            let _turn = self.judging.lock().await;
            self.filter
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .listing_failed();
            tracing::warn!(
                "could not list tools on a session's behalf before its call ({why}); the call is refused"
            );
        }
        // What was judged is recorded once the request's fate is known: a call the upstream
        // refused (a revoked token's 401, a lost session) is recorded refused, never `allow`.
        // A large one off the proxy's thread (`mcp/offload.rs`), the session's filter locked
        // there meanwhile; should the client leave, its calls are recorded refused.
        let (judging, message) = (self.clone(), body.clone());
        let judge = move || {
            let mut f = judging.filter.lock().unwrap_or_else(|e| e.into_inner());
            let mut out = f.on_client(&message);
            let mut judged = Verdicts::new(f.sink());
            judged.add(&mut out.records);
            (
                out.forward.map(|c| Bytes::from(c.into_owned())),
                out.replies,
                out.held,
                judged,
            )
        };
        let turn = self.judging.lock().await;
        let (forward, replies, held, mut judged) = match Away::take(body.len()) {
            None => judge(),
            Some(away) => match crate::mcp::offload::blocking(away, judge, drop).await {
                Some(judged) => judged,
                None => {
                    let why = "[toolwall] the message could not be judged; it was not forwarded";
                    return (None, vec![error_response("null", INTERNAL_ERROR, why)]);
                }
            },
        };
        drop(turn);
        // A call that waits for a person (`approval.rs`): this POST waits with it.
        let (forward, replies) = match held.into_iter().next() {
            Some(held) => {
                let out = crate::mcp::asking::settle(
                    &self.filter,
                    held,
                    None::<&NoProgress>,
                    // The client leaving drops this request, and the question with it.
                    std::future::pending(),
                )
                .await;
                let mut out = out;
                judged.add(&mut out.records);
                (
                    out.forward.map(|c| Bytes::from(c.into_owned())),
                    out.replies,
                )
            }
            None => (forward, replies),
        };
        let mut replies = replies;
        if let Some(message) = &forward {
            judged.forwarding();
            if let Err(e) = self.upstream.send(message.clone()).await {
                // Sent and unanswered (or a server error): the upstream may have run it.
                let what = match e.may_have_run() {
                    true => {
                        judged.settle_unanswered(&e);
                        "did not answer the request (it may have run)"
                    }
                    false => {
                        judged.settle(Some(&format!(
                            "the upstream MCP server refused the request: {e}"
                        )));
                        "refused the request"
                    }
                };
                for id in request_ids(message) {
                    replies.push(error_response(
                        &id,
                        INTERNAL_ERROR,
                        &format!("[toolwall] the upstream MCP server {what}: {e}"),
                    ));
                }
                report_send_error(shared, e, false);
                return (None, replies);
            } else if !self
                .get_opened
                .swap(true, std::sync::atomic::Ordering::Relaxed)
                && let Err(e) = self.upstream.open_get_stream(None).await
            {
                tracing::warn!("upstream GET stream: {e}");
            }
        }
        judged.settle(None);
        (forward, replies)
    }
}

impl BridgedSession {
    /// Lists every tool page in this session; each response is judged by the session's filter
    /// on its way in (which makes its tools callable) and taken here, not by the client.
    async fn list_for(&self, shared: &Shared, first: ListFirst) -> Result<(), String> {
        let mut pages = ListPages::new(first, shared.timeout, shared.max_message);
        loop {
            let (request, id) = pages.request()?;
            let left = pages.time_left()?;
            let key = IdKey::of(&Value::from(id.as_str()).to_string())
                .ok_or("a listing id that is no JSON-RPC id")?;
            let (tx, mut rx) = mpsc::channel(1);
            if let Ok(mut w) = self.waiting.lock() {
                w.insert(key.clone(), tx);
            }
            let _waiter = Waiters {
                session: self,
                ids: vec![key],
            };
            let asked = async {
                self.upstream
                    .send(request)
                    .await
                    .map_err(|e| format!("sending tools/list: {e}"))?;
                rx.recv()
                    .await
                    .ok_or_else(|| "the session ended".to_owned())
            };
            let (answer, _charge) = tokio::time::timeout(left, asked)
                .await
                .map_err(|_| too_slow())??;
            if pages.answered(&answer)? {
                return Ok(());
            }
        }
    }
}

/// Opens an upstream session for a new client session and starts delivering its messages.
pub(super) async fn bridge(
    shared: &Arc<Shared>,
    client: &HeaderMap,
    stream: Option<mpsc::Sender<Outbound>>,
) -> Result<Arc<BridgedSession>, Response<ProxyBody>> {
    // The session sets its own protocol headers; the client's others (auth) go along.
    let mut headers = upstream_headers(shared, client);
    for name in ["accept", "last-event-id"] {
        headers.remove(name);
    }
    // Every `Mcp-*` header (session, version, and the 2026-07-28 routing headers `Mcp-Method`,
    // `Mcp-Name`, `Mcp-Param-*`) is the session's own to set per message: a client's, kept for
    // the session, would go with every later message, whatever it says (an upstream routing
    // on `Mcp-Name: echo` ran echo for an allowed call).
    let client_mcp: Vec<HeaderName> = headers
        .keys()
        .filter(|n| n.as_str().starts_with("mcp-"))
        .cloned()
        .collect();
    for name in client_mcp {
        headers.remove(name);
    }
    let (upstream, mut inbox) = match UpstreamSession::open(
        shared.http.clone(),
        &shared.upstream.to_string(),
        shared.transport,
        headers,
        shared.timeout,
        Some(shared.session_budget()),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            if matches!(e, McpClientError::Connect { .. }) {
                shared.suspect(&e);
            }
            return Err(plain(StatusCode::BAD_GATEWAY, &e.to_string()));
        }
    };
    let session = Arc::new(BridgedSession {
        upstream,
        filter: Mutex::new(shared.filter()),
        judging: tokio::sync::Mutex::new(()),
        stream: Mutex::new(stream),
        queued: Mutex::default(),
        waiting: Mutex::default(),
        get_opened: std::sync::atomic::AtomicBool::new(false),
        last_active: Mutex::new(tokio::time::Instant::now()),
        ended: tokio::sync::Notify::new(),
        opened_by: shared.identities.of(client, None),
    });
    let weak = Arc::downgrade(&session);
    let shared2 = shared.clone();
    tokio::spawn(async move {
        while let Some(item) = inbox.recv().await {
            let Some(session) = weak.upgrade() else {
                return;
            };
            let (message, charge) = match item {
                Ok(m) => m.into_parts(),
                Err(e) => {
                    shared2.suspect(format!("a bridged session ended: {e}"));
                    session.end(&shared2);
                    return;
                }
            };
            // A large one off the proxy's thread (`mcp/offload.rs`), the session's filter
            // locked there meanwhile.
            let len = message.len();
            let judging = session.clone();
            let judge = move || {
                let mut f = judging.filter.lock().unwrap_or_else(|e| e.into_inner());
                f.on_server(&message)
                    .record(f.sink())
                    .forward
                    .map(|c| Bytes::from(one_line(&c).into_owned()))
            };
            let turn = session.judging.lock().await;
            let filtered = match Away::take(len) {
                None => judge(),
                // Recorded where it was judged: nothing is left to do once no one waits.
                Some(away) => match crate::mcp::offload::blocking(away, judge, drop).await {
                    Some(filtered) => filtered,
                    None => {
                        tracing::error!("judging a server message failed; its session ends");
                        session.end(&shared2);
                        return;
                    }
                },
            };
            drop(turn);
            if let Some(m) = filtered
                && !session.deliver(&shared2, m, charge).await
            {
                return;
            }
        }
    });
    Ok(session)
}
