//! Legacy HTTP+SSE clients (`GET /sse`, `POST /message`), each served from a bridged session
//! of its own (`bridge/`).

use super::*;

/// Legacy SSE client: `GET /sse` opens a session; the first event names our `/message` URL.
pub(super) async fn sse_open(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ProxyBody> {
    // Each stream holds an upstream session and its connections, as a bridged Streamable HTTP
    // session does: as many at once, at most.
    let full = shared
        .sse_sessions
        .lock()
        .map(|m| m.len() >= MAX_BRIDGED)
        .unwrap_or(true);
    if full {
        tracing::warn!("{MAX_BRIDGED} legacy SSE sessions open; refusing a new one until some end");
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many open sessions; close a stream or try later",
        );
    }
    let (tx, rx) = mpsc::channel(64);
    let id = new_session_id();
    let endpoint = encode_event(
        Some("endpoint"),
        None,
        format!("/message?sessionId={id}").as_bytes(),
    );
    if tx.send((Bytes::from(endpoint), None)).await.is_err() {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "stream closed");
    }
    let session = match bridge(&shared, req.headers(), Some(tx.clone())).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    if let Ok(mut map) = shared.sse_sessions.lock() {
        map.insert(id.clone(), session.clone());
    }
    // When the client goes away, end its upstream session; when the upstream session ends,
    // end the client's stream (this task's sender is the last one left).
    let shared2 = shared.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = tx.closed() => {}
            _ = session.ended.notified() => {}
        }
        drop(tx);
        let session = shared2
            .sse_sessions
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&id));
        drop(session);
    });
    sse_response(rx)
}

pub(super) fn query_param<'a>(uri: &'a Uri, key: &str) -> Option<&'a str> {
    uri.query()?.split('&').find_map(|kv| {
        kv.split_once('=')
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v)
    })
}

/// Legacy SSE client: `POST /message?sessionId=...`; answers come on the stream.
pub(super) async fn sse_message(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let Some(id) = query_param(req.uri(), "sessionId").map(str::to_owned) else {
        return plain(StatusCode::BAD_REQUEST, "missing sessionId");
    };
    let Some(session) = shared
        .sse_sessions
        .lock()
        .ok()
        .and_then(|m| m.get(&id).cloned())
    else {
        return plain(StatusCode::NOT_FOUND, "unknown session");
    };
    if let Err(refused) = session.check_opener(&shared, req.headers()) {
        return *refused;
    }
    let (parts, body) = req.into_parts();
    let body = match read_body(body, &parts.headers, shared.max_message, shared.timeout).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (_, replies) = session.client_message(&shared, &body).await;
    for r in replies {
        session.deliver(&shared, Bytes::from(r), None).await;
    }
    plain(StatusCode::ACCEPTED, "Accepted")
}
