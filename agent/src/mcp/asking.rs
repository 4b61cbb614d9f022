//! Every MCP transport's wait for a person (`approval.rs`): a `tools/call` the filter held
//! ([`Held`]) is put to the context's [`Asker`], the client is told it waits when it asked for
//! progress (`params._meta.progressToken`; on stdio, where toolwall writes the client's stream
//! itself), and the answer is handed to [`Filter::settle`].

use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::framing::LineFramer;

use super::filter::{Filter, Held, Outcome};
use crate::approval::{Answer, Call};
use crate::decision::CallStage;

/// The client stream of a transport that cannot send progress notifications (HTTP: the
/// answer is the POST's response).
pub(crate) type NoProgress = tokio::sync::Mutex<tokio::io::Sink>;

/// How often a client that asked for progress hears that its call still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Waits for the answer to `held` and settles it: what to forward and answer, and the record
/// (in [`Outcome::records`]), which the caller writes once it knows whether the call was
/// forwarded (an approved call the upstream refused is recorded refused).
/// `client` is where progress notifications go (`None`: the transport cannot send them);
/// `hangup` resolves when the client is gone (its stream ended): the question is withdrawn and
/// the call, refused, reaches no one.
pub(crate) async fn settle<W: AsyncWrite + Unpin + Send>(
    filter: &Mutex<Filter>,
    held: Held,
    client: Option<&tokio::sync::Mutex<W>>,
    hangup: impl Future<Output = ()>,
) -> Outcome<'static> {
    // A transport whose client leaves by dropping this future (an HTTP request) still
    // records the call: refused, as one whose client hung up.
    let unsettled = Unsettled {
        filter,
        held: Some(held),
    };
    let held = unsettled.held.as_ref().expect("set above");
    let (asker, layer, session) = {
        let filter = filter.lock().unwrap_or_else(|e| e.into_inner());
        let ctx = filter.context();
        (ctx.approvals.clone(), ctx.layer, ctx.session_id.clone())
    };
    let (approval, answer) = match &asker {
        Some(asker) => {
            let (waiting, mut named) = tokio::sync::watch::channel(None);
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
            tokio::pin!(hangup);
            // Told as soon as its question has an id, then every PROGRESS_EVERY. A client
            // that does not read holds a notification's write, never the wait: the time-out
            // and the answer go on while it is pending (otherwise a full pipe holds the
            // question past its time-out, and its `max_pending` slot with it).
            let start = tokio::time::Instant::now() + PROGRESS_EVERY;
            let mut tick = tokio::time::interval_at(start, PROGRESS_EVERY);
            let mut progress = 0u64;
            let tell = client.filter(|_| held.progress_token.is_some());
            let mut sending: Option<
                std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send + '_>>,
            > = None;
            let mut dead = tell.is_none();
            let mut first = true;
            let answered = loop {
                let due = tokio::select! {
                    answered = &mut asking => break answered,
                    () = &mut hangup => break (None, Answer::Withdrawn),
                    sent = async { sending.as_mut().expect("guarded").await }, if sending.is_some() => {
                        sending = None;
                        dead |= sent.is_err();
                        false
                    }
                    changed = named.changed(), if first && !dead => {
                        first = false;
                        changed.is_ok()
                    }
                    _ = tick.tick(), if !dead => true,
                };
                if due
                    && sending.is_none()
                    && let Some(out) = tell
                {
                    progress += 1;
                    let id = named.borrow().clone();
                    sending = Some(Box::pin(notify(out, held, progress, id)));
                }
            };
            // A notification half written is finished first: the client's stream stays whole.
            if let Some(sending) = sending {
                let _ = sending.await;
            }
            answered
        }
        // The filter holds a call only when someone can be asked.
        None => (None, Answer::Unavailable("no one to ask".into())),
    };
    unsettled.settle(approval, &answer)
}

/// A held call not settled yet: dropped so (its transport's future dropped mid-wait), it is
/// settled as withdrawn and its record goes to the filter's sink, so a call whose client left
/// mid-question is recorded as one whose client hung up.
struct Unsettled<'a> {
    filter: &'a Mutex<Filter>,
    held: Option<Held>,
}

impl Unsettled<'_> {
    fn settle(
        mut self,
        approval: Option<crate::approval::QuestionId>,
        answer: &Answer,
    ) -> Outcome<'static> {
        let held = self.held.take().expect("settled once");
        let mut filter = self.filter.lock().unwrap_or_else(|e| e.into_inner());
        filter.settle(held, approval, answer)
    }
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else { return };
        let mut filter = self.filter.lock().unwrap_or_else(|e| e.into_inner());
        let out = filter.settle(held, None, &Answer::Withdrawn);
        out.record(filter.sink());
    }
}

/// A stdio client's hang-up while a call of its waits: reads on (what it sends is kept in
/// `framer`, in order, for after the answer) and resolves once its stream ended, setting
/// `ended`. A client that sends more than `max` bytes meanwhile is treated as gone too: unread,
/// its hang-up could not be seen, and its call would run for no one.
pub(crate) async fn until_hangup<R: AsyncRead + Unpin>(
    client: &mut R,
    framer: &mut LineFramer,
    max: usize,
    ended: &mut bool,
) {
    loop {
        if framer.buffer_mut().len() >= max {
            tracing::warn!(
                max,
                "the client sent more than its message limit while its call waited for a person: its session ends"
            );
            *ended = true;
            return;
        }
        match client.read_buf(framer.buffer_mut()).await {
            Ok(0) | Err(_) => {
                *ended = true;
                return;
            }
            Ok(_) => {}
        }
    }
}

async fn notify<W: AsyncWrite + Unpin>(
    out: &tokio::sync::Mutex<W>,
    held: &Held,
    progress: u64,
    id: Option<crate::approval::QuestionId>,
) -> std::io::Result<()> {
    let token = held
        .progress_token
        .as_deref()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .unwrap_or_default();
    let which = match id {
        None => "a person".to_owned(),
        Some(id) => format!("a person (toolwall approve {id} / toolwall deny {id})"),
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
