//! The approval routes (`approval.rs`): who may see the calls that wait for a person, and who
//! may answer them. The socket serves the daemon's user outside every session (`route`): a
//! process inside a session — the agent whose call waits — can neither list nor answer. On
//! loopback the web view answers with the token in an `Authorization` header (a page of
//! another origin cannot set one without a preflight this API never grants) and, if the
//! browser sends an `Origin`, only from this API's own.

use super::*;

/// Longest answer body (`{"approve": false, "reason": "..."}`).
const MAX_ANSWER: usize = 4096;
/// Longest reason kept with a denial.
const MAX_REASON: usize = 500;

/// `GET /api/approvals`: the calls waiting, oldest first.
pub(super) fn list(state: &DaemonState) -> Response<Body> {
    json_response(StatusCode::OK, &state.approvals.pending())
}

/// `GET /api/stream/approvals`: the waiting calls as server-sent events, the whole list now
/// and again whenever it changes (the web view's "waiting for you").
pub(super) fn stream(state: &DaemonState) -> Response<Body> {
    let approvals = state.approvals.clone();
    let mut changed = approvals.subscribe();
    changed.mark_changed();
    let frames = futures_util::stream::unfold(
        (approvals, changed),
        |(approvals, mut changed)| async move {
            changed.changed().await.ok()?;
            let chunk = match serde_json::to_vec(&approvals.pending()) {
                Ok(json) => encode_event(None, None, &json),
                Err(e) => encode_event(Some("error"), None, e.to_string().as_bytes()),
            };
            Some((
                Ok::<_, Infallible>(Frame::data(Bytes::from(chunk))),
                (approvals, changed),
            ))
        },
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(BodyExt::boxed(StreamBody::new(frames)))
        .expect("static response parts are valid")
}

/// Longest question a stand-alone layer posts (its arguments are the call's, bounded by its
/// `--max-message-bytes`, at most 16 MiB).
const MAX_QUESTION: usize = 16 * 1024 * 1024 + 64 * 1024;

/// `POST /api/approvals` (the socket: the daemon's user outside every session): a call a
/// stand-alone shim or filter proxy holds (`approval::Asker::Daemon`). The answer is JSON
/// lines (`approval::Progress`): the question's id as soon as it waits, then how it
/// ended. A poster that goes away takes its question with it.
pub(super) async fn ask(
    state: &DaemonState,
    req: Request<Incoming>,
) -> anyhow::Result<Response<Body>> {
    use crate::approval::{Asked, Call, Posted, Progress};
    let body = writes::body(req, MAX_QUESTION).await?;
    let mut posted: Posted = serde_json::from_slice(&body).context("not a held call")?;
    anyhow::ensure!(
        posted.decision.ask.is_some(),
        "the decision asks no one (no `ask`)"
    );
    anyhow::ensure!(
        matches!(posted.layer.as_str(), "shim" | "mcp-proxy"),
        "only a stand-alone shim or filter proxy posts its held calls here, not {:?}",
        posted.layer
    );
    // Only processes on the host post here (`route`): their calls are the host's, whatever
    // the body says (a claimed session would spend that session's share).
    posted.session_id.clear();
    let line = |progress: &Progress| {
        let mut line = serde_json::to_vec(progress).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, Infallible>(Frame::data(Bytes::from(line)))
    };
    let approvals = state.approvals.clone();
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    // The question lives in this task; the response's end (the poster gone) ends it.
    tokio::spawn(async move {
        let call = Call {
            layer: &posted.layer,
            session_id: &posted.session_id,
            stage: posted.stage,
            decision: &posted.decision,
            arguments: posted.arguments.as_ref(),
        };
        let answered = match approvals.put(call) {
            Asked::Now(id, answer) => Progress::Answered(id, answer),
            Asked::Waiting(waiting) => {
                let id = waiting.id.clone();
                if tx.send(line(&Progress::Waiting(id.clone()))).await.is_err() {
                    return;
                }
                tokio::select! {
                    answer = waiting.answer() => Progress::Answered(Some(id), answer),
                    () = tx.closed() => return,
                }
            }
        };
        let _ = tx.send(line(&answered)).await;
    });
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (frame, rx))
    });
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(BodyExt::boxed(StreamBody::new(frames)))
        .expect("static response parts are valid"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerBody {
    approve: bool,
    /// The digest of the question answered, as it was listed.
    #[serde(default)]
    digest: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

/// `POST /api/approvals/ID` `{"approve": bool, "digest", "reason"}`: a person's answer to the
/// question with that id and digest; `by` is who, as the connection says (never the body).
/// An id no waiting question has is 404; a digest that is not the question's, or none, is 409
/// with the question that waits (`"question"`), so the one answering sees what it is.
pub(super) async fn answer(
    state: &DaemonState,
    req: Request<Incoming>,
    id: &str,
    by: String,
) -> anyhow::Result<Response<Body>> {
    let body = writes::body(req, MAX_ANSWER).await?;
    let answer: AnswerBody = serde_json::from_slice(&body).context(
        "the body is `{\"approve\": true|false, \"digest\": \"...\", \"reason\": \"...\"}`",
    )?;
    let reason = answer
        .reason
        .map(|r| r.trim().chars().take(MAX_REASON).collect::<String>())
        .filter(|r| !r.is_empty());
    match state
        .approvals
        .answer(id, answer.digest.as_deref(), answer.approve, by, reason)
    {
        Ok(question) => Ok(json_response(
            StatusCode::OK,
            &json!({ "answered": question, "approve": answer.approve }),
        )),
        Err(why) => Ok(match why.waiting() {
            Some(question) => json_response(
                StatusCode::CONFLICT,
                &json!({ "error": why.to_string(), "question": question }),
            ),
            None => error(StatusCode::NOT_FOUND, &why.to_string()),
        }),
    }
}

/// Whether a loopback request may answer: the token in its `Authorization` header (not the
/// query: a link must not answer), and no `Origin` but this API's own.
pub(super) fn loopback_may_answer(
    req: &Request<Incoming>,
    edge: &Edge,
) -> Result<(), &'static str> {
    use subtle::ConstantTimeEq;
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "));
    if !bearer.is_some_and(|given| bool::from(given.as_bytes().ct_eq(edge.token.as_bytes()))) {
        return Err(
            "answering a call needs the web token in an `Authorization: Bearer` header (the web view sends it)",
        );
    }
    let port = edge.origin.rsplit(':').next().unwrap_or("");
    let ours = |origin: &[u8]| {
        ["127.0.0.1", "localhost", "[::1]"]
            .iter()
            .any(|name| origin == format!("http://{name}:{port}").as_bytes())
    };
    match req.headers().get(header::ORIGIN) {
        Some(origin) if !ours(origin.as_bytes()) => {
            Err("answers are taken only from this API's own web view")
        }
        _ => Ok(()),
    }
}
