//! Streamable HTTP to Streamable HTTP, at the HTTP level: each request judged and forwarded
//! as the filter's text, each response filtered (a stream in its body, [`FilteredSse`]).

use super::*;

/// How long the rest of an answered response stream is read for its connection to be reused: a
/// server ends it right after its last response; one that does not holds a connection no
/// longer than this per abandoned request (rather than one per POST for `--timeout`).
const DRAIN_AFTER_ANSWER: Duration = Duration::from_secs(5);

pub(super) async fn passthrough(
    shared: Arc<Shared>,
    upstream: &UpstreamConn,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let (parts, body) = req.into_parts();
    let session = parts
        .headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // The session's GET stream goes ahead of its requests ([`StreamOrder`]).
    let opening = match (&parts.method, &session) {
        (&Method::GET, Some(session)) => Some(shared.streams.opening(session.clone())),
        (&Method::DELETE, Some(session)) => {
            shared.streams.ended(session);
            if let Ok(mut listings) = shared.listings.lock() {
                listings.ended(session);
            }
            None
        }
        _ => None,
    };
    // A GET stream (a resumed response stream may carry listings) shares its session's list;
    // a POST's is chosen once its body says who it speaks for; a DELETE judges nothing.
    let mut filter = Filter::shared(shared.ctx.clone());
    if parts.method == Method::GET {
        let identity = shared.identities.of(&parts.headers, None);
        filter = filter.with_listing(shared.listing_of(session.as_deref(), identity));
    }
    // The ids this request's requests wait under, held until its response ends.
    let mut claimed = None;
    // What was judged of the request, recorded once its fate is known: a call is recorded
    // `allow` only once the upstream took it.
    let mut judged = Verdicts::new(filter.sink());
    let mut replies = Vec::new();
    // The requests forwarded upstream: their responses complete the response stream.
    let mut requests = 0;
    // GET and DELETE carry no body (checked in `handle`); a POST's is judged and what goes
    // upstream is the filter's canonical text.
    let forward_body = if parts.method == Method::POST {
        let body = match read_body(body, &parts.headers, shared.max_message, shared.timeout).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        // Judged against the list this session and identity was given: its headers, and at
        // 2026-07-28 its envelope (a server without sessions lists per request).
        let envelope = match request_envelope(&body) {
            Ok(e) => e,
            Err(why) => {
                tracing::warn!("refused a request: {why}");
                return full(
                    StatusCode::BAD_REQUEST,
                    Some("application/json"),
                    error_response("null", INVALID_REQUEST, &format!("[toolwall] {why}")),
                );
            }
        };
        let identity = shared.identities.of(&parts.headers, envelope.as_ref());
        let listing = shared.listing_of(session.as_deref(), identity);
        filter = filter.with_listing(listing.clone());
        // A call before the session listed: its list first, asked in its session with its
        // credentials, so the call is judged against what the server would list to it.
        if let Some(first) = filter.list_first(&body) {
            let lister = Filter::shared(shared.ctx.clone()).with_listing(listing);
            match list_http(&shared, upstream, &parts.headers, first, lister).await {
                Ok(()) => {}
                Err(ListFailed::Answer(response)) => {
                    // The client gets the upstream's refusal; its call is recorded refused.
                    let mut out = filter.on_client(&body);
                    judged.add(&mut out.records);
                    judged.settle(Some(&"the upstream refused the client's credentials"));
                    return response;
                }
                Err(ListFailed::Why(why)) => {
                    filter.listing_failed();
                    tracing::warn!(
                        "could not list tools on a session's behalf before its call ({why}); the call is refused"
                    )
                }
            }
        }
        // A large body is judged off the runtime's thread (`mcp/offload.rs`); should the
        // client leave meanwhile, what was judged is recorded refused, as it would be here.
        let sink = filter.sink().cloned();
        let judging = crate::mcp::offload::judge(
            filter,
            body.len(),
            move |filter| filter.on_client(&body),
            move |out| {
                let left = "the client left before the request was forwarded";
                super::verdicts::record_judged(sink.as_ref(), out.records, Some(&left));
            },
        );
        let Some((judged_by, mut out)) = judging.await else {
            return lost_judgement();
        };
        filter = judged_by;
        // What was judged is recorded once the request's fate is known: a call the header
        // check below refuses is recorded refused, never `allow`.
        judged.add(&mut out.records);
        // A call that waits for a person (`approval.rs`): this POST waits with it.
        if let Some(held) = out.held.pop() {
            let waiting = std::sync::Mutex::new(filter);
            out = crate::mcp::asking::settle(
                &waiting,
                held,
                None::<&NoProgress>,
                // The client leaving drops this request, and the question with it.
                std::future::pending(),
            )
            .await;
            filter = waiting.into_inner().unwrap_or_else(|e| e.into_inner());
            // An approved call is recorded `allow` only once the upstream took it, like any.
            judged.add(&mut out.records);
        }
        replies = out.replies;
        let text = match out.forward {
            None => {
                judged.settle(None);
                return json_reply(replies);
            }
            Some(text) => Bytes::from(text.into_owned()),
        };
        requests = filter.requests();
        if let Some(session) = &session
            && requests > 0
        {
            shared.streams.before_request(session, shared.timeout).await;
        }
        // The upstream may route on the 2026-07-28 headers: they must say what the body says.
        if let Err(mismatch) = headers::check(&parts.headers, &text) {
            return refused(judged, &text, headers::HEADER_MISMATCH, &mismatch);
        }
        // A server routes a session's responses by id: no two of its requests wait under one
        // (the ids the filter passed on, read as the peers compare them).
        if let Some(session) = &session {
            match shared.outstanding.claim(session, filter.outstanding_ids()) {
                Ok(ids) => claimed = Some(ids),
                Err(why) => return refused(judged, &text, INVALID_REQUEST, &why),
            }
        }
        text
    } else {
        Bytes::new()
    };
    let mut headers = upstream_headers(&shared, &parts.headers);
    if parts.method == Method::POST {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    judged.forwarding();
    let response = match forward(
        &shared,
        upstream,
        parts.method.clone(),
        headers,
        forward_body,
    )
    .await
    {
        Ok(r) => r,
        // The upstream had the request (past --timeout, or a connection that failed once it
        // was written) and may have run it: as judged, saying so. Its ids stay held
        // (stranded), in case it runs.
        Err(failed) if failed.may_have_run => {
            judged.settle_unanswered(&format_args!(
                "the upstream sent no answer (HTTP {} to the client)",
                failed.response.status()
            ));
            return failed.response;
        }
        Err(failed) => {
            let why = format!(
                "not forwarded: the upstream could not be sent it (HTTP {})",
                failed.response.status()
            );
            judged.settle(Some(&why));
            return failed.response;
        }
    };
    // A deletion the upstream confirmed ends what the session held; one it refused (a server
    // may answer 405 to every DELETE) ends nothing.
    if parts.method == Method::DELETE
        && response.status().is_success()
        && let Some(session) = &session
    {
        shared.outstanding.ended(session);
    }
    let status = response.status();
    if client::is_challenge(status, response.headers()) {
        let why = format!("the upstream refused the client's credentials (HTTP {status})");
        judged.settle(Some(&why));
        if let Some(ids) = claimed.as_mut() {
            ids.answered();
        }
        return refused_credentials(&shared, &parts.headers, "/mcp", response).await;
    }
    // A server error (5xx: a gateway in front timing out, a handler failing after its work):
    // its calls may have run, and their ids stay held (stranded), in case an answer comes.
    // Refused whole otherwise (an unknown session, a 4xx): the upstream took none of them.
    let refused = (!status.is_success() && !status.is_server_error())
        .then(|| format!("the upstream refused the request (HTTP {status})"));
    match status.is_server_error() {
        true => judged.settle_unanswered(&format_args!("the upstream answered HTTP {status}")),
        false => judged.settle(refused.as_ref().map(|r| r as &dyn std::fmt::Display)),
    }
    // Refused whole: nothing of it runs, no answer will come.
    if refused.is_some()
        && let Some(ids) = claimed.as_mut()
    {
        ids.answered();
    }
    drop(opening);
    let (mut rparts, rbody) = response.into_parts();
    crate::edge::strip_hop_by_hop(&mut rparts.headers);
    rparts.headers.remove(http::header::CONTENT_LENGTH);
    if crate::edge::is_event_stream(&rparts.headers) {
        // The filtered body's length is ours to say.
        rparts.headers.remove(http::header::CONTENT_LENGTH);
        let mut body = FilteredSse::new(
            rbody,
            filter,
            replies,
            shared.probe.clone(),
            shared.max_message,
        );
        if requests > 0 {
            body = body.answering(requests, shared.timeout.min(DRAIN_AFTER_ANSWER));
            // Its ids are free once every answer passed; a stream that ends or is dropped
            // before strands them.
            if let Some(mut ids) = claimed.take() {
                body = body.when_answered(move || ids.answered());
            }
            match body.gather(shared.timeout).await {
                Ok(gathered) => {
                    if let Some(rest) = gathered.rest {
                        upstream.hold_rest(rest);
                    }
                    let mut response = Response::new(whole(gathered.body));
                    *response.status_mut() = rparts.status;
                    *response.headers_mut() = rparts.headers;
                    return response;
                }
                // Nothing can have reached the client yet: an error status says it.
                Err(streaming) if streaming.broke_before_anything() => {
                    return plain(
                        StatusCode::BAD_GATEWAY,
                        "upstream MCP server broke its response stream before any event",
                    );
                }
                Err(streaming) => body = streaming,
            }
        }
        let mut response = Response::new(body.map_err(BoxError::from).boxed());
        *response.status_mut() = rparts.status;
        // The upstream's headers as they were (repeated ones included); it already says
        // `text/event-stream`.
        *response.headers_mut() = rparts.headers;
        return response;
    }
    // Bounded like a client's message, in size and time.
    let read = tokio::time::timeout(
        shared.timeout,
        http_body_util::Limited::new(rbody, shared.max_message).collect(),
    );
    let rbody = match read.await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            tracing::warn!("an upstream response is larger than the message limit; refused");
            return plain(
                StatusCode::BAD_GATEWAY,
                "upstream MCP server's response is larger than --max-message-bytes",
            );
        }
        Ok(Err(e)) => {
            shared.suspect(format!("reading a response: {e}"));
            return plain(
                StatusCode::BAD_GATEWAY,
                "upstream MCP server broke the response",
            );
        }
        Err(_) => {
            return plain(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream MCP server did not finish its response in time",
            );
        }
    };
    // Any successful non-stream body is a JSON-RPC message whatever its content type says:
    // a client may parse it regardless, so it is filtered (and dropped if it is not JSON).
    let out_body: Bytes = if rparts.status.is_success() && !rbody.is_empty() {
        let Some((judged_by, forward)) = judge_server(filter, rbody).await else {
            return lost_judgement();
        };
        filter = judged_by;
        match (forward, replies.is_empty()) {
            (Some(f), true) => f,
            (Some(f), false) => Bytes::from(join_array(Some(&f), &replies)),
            (None, _) => Bytes::from(join_array(None, &replies)),
        }
    } else if !replies.is_empty() && rparts.status == StatusCode::ACCEPTED {
        // Only notifications went upstream; the refused calls still need their answers.
        return json_reply(replies);
    } else if !rbody.is_empty() {
        // An error status's body: the SDKs read a JSON-RPC error from it, so it is judged like
        // any message; one that is no JSON-RPC (an error page) is not passed on.
        let Some((judged_by, forward)) = judge_server(filter, rbody).await else {
            return lost_judgement();
        };
        filter = judged_by;
        forward.unwrap_or(Bytes::from_static(
            b"toolwall: the upstream MCP server's error body is not a JSON-RPC message; not passed on",
        ))
    } else {
        rbody
    };
    // Its ids are free when the body answered every request (each answer passed the filter).
    if filter.all_answered()
        && let Some(ids) = claimed.as_mut()
    {
        ids.answered();
    }
    let mut response = Response::new(whole(out_body));
    *response.status_mut() = rparts.status;
    *response.headers_mut() = rparts.headers;
    response
}

/// Judges a message of the upstream's (off the runtime's thread when it is large: see
/// `mcp/offload.rs`) and records what was judged: what passes on, the same bytes when it was
/// untouched.
pub(super) async fn judge_server(
    mut filter: Filter,
    msg: Bytes,
) -> Option<(Filter, Option<Bytes>)> {
    let len = msg.len();
    if len >= crate::mcp::offload::INLINE_BYTES {
        // A list it carries is applied in the order it came, however long it takes.
        filter.arrive();
    }
    let work = move |filter: &mut Filter| {
        let out = filter.on_server(&msg).record(filter.sink());
        match out.forward {
            Some(Cow::Borrowed(b)) if b.len() == msg.len() => Some(msg.clone()),
            Some(f) => Some(Bytes::from(f.into_owned())),
            None => None,
        }
    };
    // Recorded where it was judged: nothing is left to do for a client that left.
    crate::mcp::offload::judge(filter, len, work, drop).await
}

/// A judgement that was lost (it panicked, or the proxy is ending): nothing was passed on.
fn lost_judgement() -> Response<ProxyBody> {
    plain(
        StatusCode::INTERNAL_SERVER_ERROR,
        "toolwall could not judge the message; nothing of it was passed on",
    )
}

/// A request refused before it was forwarded: its calls recorded refused, and an HTTP 400
/// with a JSON-RPC error (`code`) for its first request.
fn refused(
    judged: Verdicts,
    text: &[u8],
    code: i64,
    why: &dyn std::fmt::Display,
) -> Response<ProxyBody> {
    tracing::warn!("refused a request: {why}");
    judged.settle(Some(&format!("refused before forwarding: {why}")));
    let id = request_ids(text).into_iter().next();
    full(
        StatusCode::BAD_REQUEST,
        Some("application/json"),
        error_response(
            id.as_deref().unwrap_or("null"),
            code,
            &format!("[toolwall] {why}"),
        ),
    )
}
