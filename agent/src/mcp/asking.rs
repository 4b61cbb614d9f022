//! Every MCP transport's wait for a person (`approval.rs`): a `tools/call` the filter held
//! ([`Held`]) is put to the context's [`Asker`], the client is told it waits when it asked for
//! progress (`params._meta.progressToken`; on stdio, where toolwall writes the client's stream
//! itself), and the answer is handed to [`Filter::settle`].

use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::filter::{Filter, Held, Outcome};
use crate::approval::{Answer, Call};
use crate::decision::CallStage;

/// The client stream of a transport that cannot send progress notifications (HTTP: the
/// answer is the POST's response).
pub(crate) type NoProgress = tokio::sync::Mutex<tokio::io::Sink>;

/// How often a client that asked for progress hears that its call still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Waits for the answer to `held` and settles it: what to forward and answer, recorded.
/// `client` is where progress notifications go (`None`: the transport cannot send them).
pub(crate) async fn settle<W: AsyncWrite + Unpin>(
    filter: &Mutex<Filter>,
    held: Held,
    client: Option<&tokio::sync::Mutex<W>>,
) -> Outcome<'static> {
    let (asker, layer, session) = {
        let filter = filter.lock().unwrap_or_else(|e| e.into_inner());
        let ctx = filter.context();
        (ctx.approvals.clone(), ctx.layer, ctx.session_id.clone())
    };
    let (approval, answer) = match &asker {
        Some(asker) => {
            let (waiting, mut numbered) = tokio::sync::watch::channel(0u64);
            let asking = asker.ask(
                Call {
                    layer,
                    session_id: &session,
                    stage: CallStage::Executing,
                    decision: &held.decision,
                    arguments: held.arguments.as_ref(),
                },
                &waiting,
            );
            tokio::pin!(asking);
            // Told as soon as its question has a number, then every PROGRESS_EVERY.
            let start = tokio::time::Instant::now() + PROGRESS_EVERY;
            let mut tick = tokio::time::interval_at(start, PROGRESS_EVERY);
            let mut progress = 0u64;
            let mut tell = client.filter(|_| held.progress_token.is_some());
            let mut first = true;
            loop {
                tokio::select! {
                    answered = &mut asking => break answered,
                    changed = numbered.changed(), if first && tell.is_some() => {
                        first = false;
                        if changed.is_err() {
                            continue;
                        }
                    }
                    _ = tick.tick(), if tell.is_some() => {}
                }
                progress += 1;
                let id = *numbered.borrow();
                if let Some(out) = tell
                    && notify(out, &held, progress, id).await.is_err()
                {
                    // The client is gone: its call waits on, unanswered, to its time-out.
                    tell = None;
                }
            }
        }
        // The filter holds a call only when someone can be asked.
        None => (None, Answer::Unavailable("no one to ask".into())),
    };
    let mut filter = filter.lock().unwrap_or_else(|e| e.into_inner());
    filter.settle(held, approval, &answer).record(filter.sink())
}

async fn notify<W: AsyncWrite + Unpin>(
    out: &tokio::sync::Mutex<W>,
    held: &Held,
    progress: u64,
    id: u64,
) -> std::io::Result<()> {
    let token = held
        .progress_token
        .as_deref()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .unwrap_or_default();
    let which = match id {
        0 => "a person".to_owned(),
        id => format!("a person (toolwall approve {id} / toolwall deny {id})"),
    };
    let note = serde_json::json!({
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {
            "progressToken": token,
            "progress": progress,
            "message": format!("toolwall: this call waits for {which}"),
        }
    });
    let mut line = note.to_string().into_bytes();
    line.push(b'\n');
    let mut out = out.lock().await;
    out.write_all(&line).await?;
    out.flush().await
}
