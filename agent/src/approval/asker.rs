//! How a layer puts a call to a person: through the daemon's own [`Approvals`] when it runs
//! in the daemon, or over the daemon's socket when it runs stand-alone (the question's
//! progress comes back as JSON lines).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;

use super::{Answer, Approvals, Asked, Call, QuestionId};
use crate::{
    decision::{CallStage, Decision},
    framing::{LineFramer, strip_newline},
};

/// Who a layer asks: the daemon's own [`Approvals`] (its layers), or the daemon over its
/// socket (`toolwall shim` and `toolwall mcp-proxy` run on the host as the daemon's user:
/// `POST /api/approvals`, `daemon/api/approvals.rs`).
#[derive(Clone, Debug)]
pub(crate) enum Asker {
    /// In the daemon.
    Local(Arc<Approvals>),
    /// Through the daemon's socket.
    Daemon(std::path::PathBuf),
}

impl Asker {
    /// Asks about `call`; `waiting` gets the question's id as soon as it waits (for the
    /// client's progress notifications).
    pub(crate) async fn ask(
        &self,
        call: Call<'_>,
        waiting: &watch::Sender<Option<QuestionId>>,
    ) -> (Option<QuestionId>, Answer) {
        match self {
            Asker::Local(approvals) => match approvals.put(call) {
                Asked::Now(id, answer) => (id, answer),
                Asked::Waiting(asked) => {
                    let id = asked.id.clone();
                    waiting.send_replace(Some(id.clone()));
                    (Some(id), asked.answer().await)
                }
            },
            Asker::Daemon(socket) => {
                let posted = Posted {
                    layer: call.layer.to_owned(),
                    session_id: call.session_id.to_owned(),
                    stage: call.stage,
                    decision: call.decision.clone(),
                    arguments: call.arguments.cloned(),
                };
                match remote(socket, &posted, |id| {
                    waiting.send_replace(Some(id));
                })
                .await
                {
                    Ok(answered) => answered,
                    Err(error) => (None, Answer::Unavailable(format!("{error:#}"))),
                }
            }
        }
    }
}

/// What `POST /api/approvals` takes: a call a stand-alone layer holds.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Posted {
    pub layer: String,
    pub session_id: String,
    pub stage: CallStage,
    pub decision: Decision,
    pub arguments: Option<Value>,
}

/// One line of `POST /api/approvals`'s answer (JSON lines): the question's id once it
/// waits, then how it ended.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Progress {
    /// Put to a person under this id.
    Waiting(QuestionId),
    /// Ended: the question's id (if one was asked) and the answer.
    Answered(Option<QuestionId>, Answer),
}

async fn remote(
    socket: &std::path::Path,
    posted: &Posted,
    mut on_waiting: impl FnMut(QuestionId),
) -> anyhow::Result<(Option<QuestionId>, Answer)> {
    use anyhow::Context as _;
    use http_body_util::BodyExt as _;
    let api = crate::client::ApiClient::connect(socket).await?;
    let mut body = api
        .post_streaming("/api/approvals", serde_json::to_vec(posted)?)
        .await?;
    let mut lines = LineFramer::with_limit(1 << 20);
    while let Some(frame) = body.frame().await {
        let frame = frame.context("the daemon's answer broke off")?;
        if let Some(data) = frame.data_ref() {
            lines.buffer_mut().extend_from_slice(data);
        }
        while let Some(line) = lines.next_line().context("the daemon's answer")? {
            match serde_json::from_slice::<Progress>(strip_newline(&line))
                .context("the daemon's answer")?
            {
                Progress::Waiting(id) => on_waiting(id),
                Progress::Answered(id, answer) => return Ok((id, answer)),
            }
        }
    }
    anyhow::bail!("the daemon ended its answer before the question was answered")
}
