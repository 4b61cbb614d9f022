//! `mcp-proxy --stdio`: one client on stdin/stdout, bridged to an upstream session.

use super::*;
use tokio::sync::oneshot;

pub(super) async fn serve_stdio(shared: Arc<Shared>, max_message: usize) -> anyhow::Result<()> {
    let (session, mut inbox) = UpstreamSession::open(
        shared.http.clone(),
        &shared.upstream.to_string(),
        shared.transport,
        shared.upstream_headers.clone(),
        shared.timeout,
        Some(shared.session_budget()),
    )
    .await
    .context("opening the upstream session")?;
    let session = Arc::new(session);
    let filter = Arc::new(Mutex::new(shared.filter()));
    let stdout = Arc::new(tokio::sync::Mutex::new(crate::mcp::async_stdout()));
    // A `tools/list` page the proxy asks on the client's behalf: its answer comes here, not to
    // the client.
    let awaited: Arc<Awaited> = Arc::default();

    let down = {
        let (filter, stdout, shared, awaited) = (
            filter.clone(),
            stdout.clone(),
            shared.clone(),
            awaited.clone(),
        );
        async move {
            while let Some(item) = inbox.recv().await {
                let message = match item {
                    Ok(m) => m,
                    Err(e) => {
                        shared.lost(e);
                        return Ok(());
                    }
                };
                let out = {
                    let mut f = filter.lock().unwrap_or_else(|e| e.into_inner());
                    f.on_server(&message)
                        .record(f.sink())
                        .forward
                        .map(|c| one_line(&c).into_owned())
                };
                let out = match out {
                    Some(line) => taken_by(&awaited, line),
                    None => None,
                };
                if let Some(line) = out {
                    let mut w = stdout.lock().await;
                    w.write_all(&line).await?;
                    w.write_all(b"\n").await?;
                    w.flush().await?;
                }
            }
            Ok::<(), std::io::Error>(())
        }
    };
    let up = async {
        let mut stdin = crate::mcp::async_stdin();
        let mut framer = LineFramer::with_limit(max_message);
        let mut get_opened = false;
        loop {
            // The store behind: the client's next messages wait unread.
            if let Some(sink) = &shared.ctx.events {
                sink.room().await;
            }
            let n = stdin
                .read_buf(framer.buffer_mut())
                .await
                .context("reading stdin")?;
            let mut eof = n == 0;
            loop {
                let next = match framer.next_line() {
                    Ok(None) if eof => framer.finish(),
                    other => other,
                };
                let line = match next {
                    Ok(Some(line)) => line,
                    Ok(None) => break,
                    Err(too_long) => {
                        // Dropped whole: answer the request, or stop when it cannot be
                        // answered (no readable id).
                        tracing::warn!("client message refused: {too_long}");
                        let Some(id) = too_long.id.as_deref() else {
                            return Err(anyhow::Error::new(too_long).context("reading stdin"));
                        };
                        let reply =
                            error_response(id, INVALID_REQUEST, &format!("[toolwall] {too_long}"));
                        let mut w = stdout.lock().await;
                        w.write_all(&reply).await?;
                        w.write_all(b"\n").await?;
                        w.flush().await?;
                        continue;
                    }
                };
                let line = strip_newline(&line);
                // A call before the client listed: its list first, in its session.
                let first = filter
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .list_first(line);
                if let Some(first) = first
                    && let Err(why) = list_for(&shared, &session, &awaited, first).await
                {
                    filter
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .listing_failed();
                    tracing::warn!(
                        "could not list tools on the client's behalf before its call ({why}); the call is refused"
                    );
                }
                // Recorded once the upstream took the request or refused it.
                let (forward, replies, held, mut judged) = {
                    let mut f = filter.lock().unwrap_or_else(|e| e.into_inner());
                    let out = f.on_client(line);
                    (
                        out.forward.map(|c| Bytes::from(c.into_owned())),
                        out.replies,
                        out.held,
                        out.records,
                    )
                };
                // A call that waits for a person (`approval.rs`) holds the client's later
                // messages behind it; the client hears it waits when it asked for progress.
                let (forward, replies) = match held.into_iter().next() {
                    Some(held) => {
                        let mut ended = eof;
                        let hangup = async {
                            if !eof {
                                crate::mcp::asking::until_hangup(
                                    &mut stdin,
                                    &mut framer,
                                    max_message,
                                    &mut ended,
                                )
                                .await
                            }
                        };
                        let out =
                            crate::mcp::asking::settle(&filter, held, Some(&*stdout), hangup).await;
                        judged.extend(out.records);
                        eof = ended;
                        (
                            out.forward.map(|c| Bytes::from(c.into_owned())),
                            out.replies,
                        )
                    }
                    None => (forward, replies),
                };
                let sink = filter
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .sink()
                    .cloned();
                // Refusals are recorded now (a client gone while they are answered loses
                // none); the calls let through once the upstream took them or not.
                judged.retain(|event| match event {
                    crate::events::Event::McpToolCalled(call)
                        if call.action == crate::decision::Action::Allow =>
                    {
                        true
                    }
                    _ => {
                        if let Some(sink) = &sink {
                            sink.emit(event.clone());
                        }
                        false
                    }
                });
                if !replies.is_empty() {
                    let mut w = stdout.lock().await;
                    for r in replies {
                        w.write_all(&r).await?;
                        w.write_all(b"\n").await?;
                    }
                    w.flush().await?;
                }
                if let Some(message) = forward {
                    if let Err(e) = session.send(message.clone()).await {
                        let judged = std::mem::take(&mut judged);
                        // Sent and unanswered (or a server error): the upstream may have run it.
                        let what = match e.may_have_run() {
                            true => {
                                record_unanswered(sink.as_ref(), judged, &e);
                                "did not answer the request (it may have run)"
                            }
                            false => {
                                record_judged(
                                    sink.as_ref(),
                                    judged,
                                    Some(&format!(
                                        "the upstream MCP server refused the request: {e}"
                                    )),
                                );
                                "refused the request"
                            }
                        };
                        // A refused request is answered, so the client does not wait for ever.
                        let mut w = stdout.lock().await;
                        for id in request_ids(&message) {
                            let reply = error_response(
                                &id,
                                INTERNAL_ERROR,
                                &format!("[toolwall] the upstream MCP server {what}: {e}"),
                            );
                            w.write_all(&reply).await?;
                            w.write_all(b"\n").await?;
                        }
                        w.flush().await?;
                        drop(w);
                        report_send_error(&shared, e, true);
                    } else if !get_opened {
                        get_opened = true;
                        if let Err(e) = session.open_get_stream(None).await {
                            shared.lost(e);
                        }
                    }
                }
                record_judged(sink.as_ref(), judged, None);
            }
            if eof {
                return Ok::<(), anyhow::Error>(());
            }
        }
    };
    tokio::select! {
        result = up => result?,
        result = down => result.context("writing stdout")?,
    }
    if let Ok(session) = Arc::try_unwrap(session) {
        session.close().await;
    }
    Ok(())
}

/// The id of the listing page the proxy waits for, and where its answer goes.
type Awaited = Mutex<Option<(String, oneshot::Sender<Bytes>)>>;

/// A server message for the client, unless it answers the listing the proxy waits for.
fn taken_by(awaited: &Awaited, line: Vec<u8>) -> Option<Vec<u8>> {
    let mut slot = awaited.lock().unwrap_or_else(|e| e.into_inner());
    match slot.take() {
        Some((id, tx)) if answers(&line, &id) => {
            let _ = tx.send(Bytes::from(line));
            None
        }
        other => {
            *slot = other;
            Some(line)
        }
    }
}

/// Lists every tool page in the `--stdio` client's session; each response is judged by the
/// session's filter on its way in (which makes its tools callable) and taken here.
async fn list_for(
    shared: &Shared,
    session: &UpstreamSession,
    awaited: &Awaited,
    first: ListFirst,
) -> Result<(), String> {
    let mut pages = ListPages::new(first, shared.timeout, shared.max_message);
    loop {
        let left = pages.time_left()?;
        let (request, id) = pages.request()?;
        let (tx, rx) = oneshot::channel();
        *awaited.lock().unwrap_or_else(|e| e.into_inner()) = Some((id, tx));
        let asked = async {
            session
                .send(request)
                .await
                .map_err(|e| format!("sending tools/list: {e}"))?;
            rx.await.map_err(|_| "the session ended".to_owned())
        };
        let answer = tokio::time::timeout(left, asked)
            .await
            .unwrap_or_else(|_| Err(too_slow()));
        awaited.lock().unwrap_or_else(|e| e.into_inner()).take();
        if pages.answered(&answer?)? {
            return Ok(());
        }
    }
}

/// A message as one line: SSE data may legally hold a pretty-printed (multi-line) message.
pub(super) fn one_line(message: &[u8]) -> Cow<'_, [u8]> {
    if memchr::memchr(b'\n', message).is_none() {
        return Cow::Borrowed(message);
    }
    match serde_json::from_slice::<Value>(message).and_then(|v| serde_json::to_vec(&v)) {
        Ok(compact) => Cow::Owned(compact),
        Err(_) => Cow::Owned(
            message
                .iter()
                .map(|b| if *b == b'\n' { b' ' } else { *b })
                .collect(),
        ),
    }
}

/// A failed upstream send. A connection that failed or broke makes the watchdog probe: the
/// upstream's loss ends the proxy, while one broken connection (a tool may break its own, a
/// balancer may drop one) ends nothing, not even `--stdio`'s only session. A session whose
/// stream closed ends the proxy when it was its only one (`--stdio`). An HTTP refusal of one
/// message is logged (the client's request is answered with an error).
pub(super) fn report_send_error(shared: &Shared, e: McpClientError, only_session: bool) {
    match e {
        McpClientError::Closed { .. } if only_session => shared.lost(e),
        McpClientError::Connect { .. } | McpClientError::Closed { .. } => shared.suspect(e),
        other => tracing::warn!("upstream refused a message: {other}"),
    }
}
