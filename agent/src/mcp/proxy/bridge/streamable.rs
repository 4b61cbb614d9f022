//! A Streamable HTTP client in front of a legacy SSE upstream, served from a bridged session;
//! and the reaping of those its clients left.

use super::*;

/// Streamable HTTP client in front of a legacy SSE upstream: POST answered with the
/// responses to its requests (JSON), GET carries everything else, DELETE ends the session.
pub(in crate::mcp::proxy) async fn bridge_streamable(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let session_id = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let existing = session_id
        .as_ref()
        .and_then(|id| shared.bridged.lock().ok().and_then(|m| m.get(id).cloned()));
    if let Some(session) = &existing
        && let Err(refused) = session.check_opener(&shared, req.headers())
    {
        return *refused;
    }
    match (req.method().clone(), existing, session_id) {
        (Method::POST, existing, sid) => {
            let (parts, body) = req.into_parts();
            let body =
                match read_body(body, &parts.headers, shared.max_message, shared.timeout).await {
                    Ok(b) => b,
                    Err(r) => return r,
                };
            let (session, id) = match (existing, sid) {
                (Some(s), Some(id)) => (s, id),
                (None, Some(_)) => return plain(StatusCode::NOT_FOUND, "unknown session"),
                (_, None) => {
                    // Each session holds an upstream session and its connections: one is made
                    // only for an `initialize`, and only so many at once.
                    if !is_initialize(&body) {
                        return plain(
                            StatusCode::BAD_REQUEST,
                            "a request without Mcp-Session-Id must be an initialize request",
                        );
                    }
                    let full = shared
                        .bridged
                        .lock()
                        .map(|m| m.len() >= MAX_BRIDGED)
                        .unwrap_or(true);
                    if full {
                        tracing::warn!(
                            "{MAX_BRIDGED} bridged sessions open; refusing a new one until some end"
                        );
                        return plain(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "too many open sessions; end one (DELETE) or try later",
                        );
                    }
                    let session = match bridge(&shared, &parts.headers, None).await {
                        Ok(s) => s,
                        Err(r) => return r,
                    };
                    let id = new_session_id();
                    if let Ok(mut map) = shared.bridged.lock() {
                        map.insert(id.clone(), session.clone());
                    }
                    (session, id)
                }
            };
            session.touch();
            // Register the waiters before sending, so a fast answer is not missed.
            let ids = request_ids(&body);
            let mut keys: Vec<IdKey> = ids.iter().filter_map(|id| IdKey::of(id)).collect();
            let (tx, mut rx) = mpsc::channel(ids.len().max(1));
            if let Ok(mut w) = session.waiting.lock() {
                // An id another request waits under stays that request's: the filter refuses
                // this one, and its waiter must not take (then drop) the other's answer.
                keys.retain(|key| !w.contains_key(key));
                for key in &keys {
                    w.insert(key.clone(), tx.clone());
                }
            }
            // A client that leaves takes its waiters with it (else the session never idles).
            let _waiters = Waiters {
                session: &session,
                ids: keys,
            };
            let (forward, mut replies) = session.client_message(&shared, &body).await;
            // Ids answered locally (refused calls) or not sent do not wait.
            let sent_ids = forward.as_deref().map(request_ids).unwrap_or_default();
            if let Ok(mut w) = session.waiting.lock() {
                for id in ids.iter().filter(|id| !sent_ids.contains(id)) {
                    if let Some(key) = IdKey::of(id)
                        && w.get(&key).is_some_and(|waiter| waiter.same_channel(&tx))
                    {
                        w.remove(&key);
                    }
                }
            }
            // Each answer, or an error once `--timeout` has passed: a POST never waits for ever.
            let deadline = tokio::time::Instant::now() + shared.timeout;
            let mut unanswered = sent_ids;
            while !unanswered.is_empty() {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some((m, _charge))) => {
                        if let Some(id) = response_id(&m).and_then(|id| IdKey::of(&id)) {
                            unanswered.retain(|u| IdKey::of(u).as_ref() != Some(&id));
                        }
                        replies.push(m.to_vec());
                    }
                    Ok(None) => break,
                    Err(_) => {
                        if let Ok(mut w) = session.waiting.lock() {
                            for key in unanswered.iter().filter_map(|id| IdKey::of(id)) {
                                w.remove(&key);
                            }
                        }
                        for id in unanswered.drain(..) {
                            replies.push(error_response(
                                &id,
                                REQUEST_TIMEOUT,
                                "[toolwall] the upstream MCP server did not answer in time",
                            ));
                        }
                    }
                }
            }
            session.touch();
            let mut response = json_reply(replies);
            if let Ok(v) = HeaderValue::from_str(&id) {
                response.headers_mut().insert(SESSION_HEADER, v);
            }
            response
        }
        (Method::GET, Some(session), _) => {
            session.touch();
            let (tx, rx) = mpsc::channel(64);
            let queued = session
                .queued
                .lock()
                .map(|mut q| std::mem::take(&mut *q))
                .unwrap_or_default();
            for (m, charge) in queued {
                let _ = tx
                    .send((Bytes::from(encode_event(Some("message"), None, &m)), charge))
                    .await;
            }
            if let Ok(mut s) = session.stream.lock() {
                *s = Some(tx);
            }
            sse_response(rx)
        }
        (Method::DELETE, Some(_), Some(id)) => {
            let session = shared.bridged.lock().ok().and_then(|mut m| m.remove(&id));
            drop(session);
            full(StatusCode::OK, None, Bytes::new())
        }
        (Method::GET | Method::DELETE, _, _) => plain(StatusCode::NOT_FOUND, "unknown session"),
        _ => plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
    }
}

/// Ends bridged Streamable HTTP sessions their clients left without a DELETE (each holds an
/// upstream session and its connections). Legacy `/sse` sessions end with their stream.
pub(in crate::mcp::proxy) async fn reap_idle_sessions(shared: std::sync::Weak<Shared>) {
    let every = match shared.upgrade() {
        Some(s) => (s.session_idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(30)),
        None => return,
    };
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let now = tokio::time::Instant::now();
        let ended: Vec<Arc<BridgedSession>> = match shared.bridged.lock() {
            Ok(mut map) => {
                let idle: Vec<String> = map
                    .iter()
                    .filter(|(_, s)| s.idle(shared.session_idle, now))
                    .map(|(id, _)| id.clone())
                    .collect();
                idle.iter().filter_map(|id| map.remove(id)).collect()
            }
            Err(_) => Vec::new(),
        };
        if !ended.is_empty() {
            tracing::info!(
                "ended {} bridged session(s) idle for {:?}",
                ended.len(),
                shared.session_idle
            );
        }
    }
}
