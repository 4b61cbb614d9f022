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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerBody {
    approve: bool,
    #[serde(default)]
    reason: Option<String>,
}

/// `POST /api/approvals/ID` `{"approve": bool, "reason"}`: a person's answer; `by` is who,
/// as the connection says (never the body).
pub(super) async fn answer(
    state: &DaemonState,
    req: Request<Incoming>,
    id: &str,
    by: String,
) -> anyhow::Result<Response<Body>> {
    let Ok(id) = id.parse::<u64>() else {
        return Ok(error(
            StatusCode::NOT_FOUND,
            &format!("{id:?} is not an approval number (`toolwall approvals` lists them)"),
        ));
    };
    let body = writes::body(req, MAX_ANSWER).await?;
    let answer: AnswerBody = serde_json::from_slice(&body)
        .context("the body is `{\"approve\": true|false, \"reason\": \"...\"}`")?;
    let reason = answer
        .reason
        .map(|r| r.trim().chars().take(MAX_REASON).collect::<String>())
        .filter(|r| !r.is_empty());
    match state.approvals.answer(id, answer.approve, by, reason) {
        Ok(question) => Ok(json_response(
            StatusCode::OK,
            &json!({ "answered": question, "approve": answer.approve }),
        )),
        Err(why) => Ok(error(StatusCode::NOT_FOUND, &why.to_string())),
    }
}

/// Whether a loopback request may answer: the token in its `Authorization` header (not the
/// query: a link must not answer), and no `Origin` but this API's own.
pub(super) fn loopback_may_answer(req: &Request<Incoming>, edge: &Edge) -> Result<(), &'static str> {
    use subtle::ConstantTimeEq;
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "));
    if !bearer.is_some_and(|given| bool::from(given.as_bytes().ct_eq(edge.token.as_bytes()))) {
        return Err("answering a call needs the web token in an `Authorization: Bearer` header (the web view sends it)");
    }
    match req.headers().get(header::ORIGIN) {
        Some(origin) if origin.as_bytes() != edge.origin.as_bytes() => {
            Err("answers are taken only from this API's own web view")
        }
        _ => Ok(()),
    }
}
