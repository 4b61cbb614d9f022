//! Asking a person about a call (issue 16): an argument rule with `action: ask` makes the
//! policy answer "block, unless someone approves" ([`Decision::ask`]); a layer that can wait
//! puts the call here, and the daemon's API, the CLI (`toolwall approve|deny ID`) and the web
//! view answer it. No answer within `approval.timeout_secs` is a denial.
//!
//! One call is asked about once: a call the LLM layer saw proposed and a person approved is
//! remembered ([`Grant`]) and runs at the MCP layer without a second question — the same
//! session, server, tool and arguments (by `registry::value_hash`), once, within the time-out.
//! Everything is bounded: `approval.max_pending` questions at once (one more is denied at
//! once), [`MAX_GRANTS`] remembered approvals.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use crate::config::ApprovalConfig;
use crate::decision::{Action, CallStage, Decision};

/// Approvals remembered for the MCP layer at once; the oldest goes first.
const MAX_GRANTS: usize = 256;

/// What a person is asked: enough to decide, nothing the record would not keep (arguments
/// as recorded, redact rules applied).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Question {
    /// The number `toolwall approve` takes.
    pub id: u64,
    /// `llm`, `shim` or `mcp-proxy`.
    pub layer: String,
    /// The agent session, or empty.
    pub session_id: String,
    /// The server id.
    pub server_id: String,
    /// The tool's name on its server.
    pub tool: String,
    /// The call's arguments as the record keeps them.
    pub arguments: Option<Value>,
    /// Which rule asks, and why.
    pub reason: String,
    /// When it was asked.
    pub asked_at: DateTime<Utc>,
    /// When it is denied unless answered.
    pub expires_at: DateTime<Utc>,
}

/// A call a layer wants a person to decide.
#[derive(Clone, Debug)]
pub(crate) struct Call<'a> {
    /// `llm`, `shim` or `mcp-proxy`.
    pub layer: &'a str,
    /// The agent session, or empty.
    pub session_id: &'a str,
    /// Where the call is in its life: a proposed call's approval also lets it run once.
    pub stage: CallStage,
    /// The policy's decision (its `ask` says why).
    pub decision: &'a Decision,
    /// The arguments, whole (for the fingerprint; shown as the record would keep them).
    pub arguments: Option<&'a Value>,
}

/// How a question ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Answer {
    /// Approved by whom.
    Approved(String),
    /// Denied by whom, and why if they said.
    Denied(String, Option<String>),
    /// No one answered in time.
    TimedOut(Duration),
    /// Too many calls wait already.
    Busy(usize),
    /// Too many calls of this session wait already.
    SessionBusy(usize),
    /// No one can be asked from here (no daemon answers); why.
    Unavailable(String),
    /// The client that made the call left before anyone answered.
    Withdrawn,
}

impl Answer {
    /// `decision` (an asked call's block) as the answer makes it: allowed when approved, else
    /// refused saying why; `id` names the question in the reason.
    pub(crate) fn settle(&self, id: Option<u64>, mut decision: Decision) -> Decision {
        let rule = decision.ask.take().unwrap_or_default();
        let which = id.map(|id| format!("approval {id}")).unwrap_or_default();
        match self {
            Answer::Approved(by) => {
                decision.action = Action::Allow;
                decision.reason = format!("approved by {by} ({which}; {rule})");
            }
            Answer::Denied(by, why) => {
                decision.action = Action::Block;
                decision.reason = format!(
                    "denied by {by}{} ({which}; {rule})",
                    why.as_deref().map(|w| format!(": {w}")).unwrap_or_default()
                );
            }
            Answer::TimedOut(after) => {
                decision.action = Action::Block;
                decision.reason = format!(
                    "no one answered within {} s: denied ({which}; {rule})",
                    after.as_secs()
                );
            }
            Answer::Busy(n) => {
                decision.action = Action::Block;
                decision.reason = format!(
                    "{n} calls already wait for a person (approval.max_pending): denied at once ({rule})"
                );
            }
            Answer::SessionBusy(n) => {
                decision.action = Action::Block;
                decision.reason = format!(
                    "{n} calls of this session already wait for a person (a quarter of approval.max_pending): denied at once ({rule})"
                );
            }
            Answer::Unavailable(why) => {
                decision.action = Action::Block;
                decision.reason = format!("{rule}; no one can be asked ({why}): refused");
            }
            Answer::Withdrawn => {
                decision.action = Action::Block;
                decision.reason =
                    format!("the client left before anyone answered: not run ({rule})");
            }
        }
        decision
    }
}

/// Why an answer was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum AnswerError {
    /// No such question waits (answered, timed out, or never asked).
    #[error(
        "no call waits under approval {0} (it was answered, timed out, or never asked): `toolwall approvals` lists the waiting ones"
    )]
    NotWaiting(u64),
}

struct Pending {
    question: Question,
    answer: oneshot::Sender<Answer>,
}

/// A proposed call a person approved: it may run once.
#[derive(Debug)]
struct Grant {
    key: (String, String, String, String),
    id: u64,
    by: String,
    until: Instant,
}

#[derive(Default)]
struct Inner {
    next: u64,
    pending: BTreeMap<u64, Pending>,
    grants: VecDeque<Grant>,
}

/// The questions waiting for a person, shared by the daemon's layers and its API.
pub(crate) struct Approvals {
    timeout: Duration,
    max_pending: usize,
    inner: Mutex<Inner>,
    /// Bumped whenever a question comes or goes: the web view and long polls wait on it.
    changed: watch::Sender<u64>,
    /// The webhook's queue (`daemon/webhook.rs`), when one is configured.
    webhook: Option<tokio::sync::mpsc::Sender<Question>>,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("timeout", &self.timeout)
            .field("max_pending", &self.max_pending)
            .finish_non_exhaustive()
    }
}

impl Approvals {
    /// As `approval:` says; `webhook` gets every question as it is asked.
    pub(crate) fn new(
        config: &ApprovalConfig,
        webhook: Option<tokio::sync::mpsc::Sender<Question>>,
    ) -> Self {
        Approvals {
            timeout: Duration::from_secs(config.timeout_secs),
            max_pending: config.max_pending,
            inner: Mutex::default(),
            changed: watch::channel(0).0,
            webhook,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Nothing under this lock can leave it half-changed.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `call` to a person and waits for the answer (at most the time-out); returns the
    /// question's id (none when it was not asked) and the answer.
    pub(crate) async fn ask(&self, call: Call<'_>) -> (Option<u64>, Answer) {
        match self.put(call) {
            Asked::Now(id, answer) => (id, answer),
            Asked::Waiting(waiting) => {
                let id = waiting.id;
                (Some(id), waiting.answer().await)
            }
        }
    }

    /// Puts `call` to a person: answered at once (an approval remembered from the LLM layer,
    /// or too many waiting), or a question to wait on ([`Waiting::answer`]).
    pub(crate) fn put(&self, call: Call<'_>) -> Asked<'_> {
        let identity = call.decision.tool.as_ref();
        let server_id = identity.map(|t| t.server_id.clone()).unwrap_or_default();
        let tool = identity.map(|t| t.tool.clone()).unwrap_or_default();
        let key = (
            call.session_id.to_owned(),
            server_id.clone(),
            tool.clone(),
            call.arguments
                .map(crate::registry::value_hash)
                .unwrap_or_default(),
        );
        let now = Instant::now();
        let mut inner = self.lock();
        inner.grants.retain(|g| g.until > now);
        if call.stage == CallStage::Executing
            && let Some(at) = inner.grants.iter().position(|g| g.key == key)
            && let Some(grant) = inner.grants.remove(at)
        {
            return Asked::Now(
                Some(grant.id),
                Answer::Approved(format!("{} when the model proposed it", grant.by)),
            );
        }
        if inner.pending.len() >= self.max_pending {
            return Asked::Now(None, Answer::Busy(inner.pending.len()));
        }
        // One holder — a session, or the LLM proxy's requests without a session key, which
        // any agent can send — holds at most a quarter of the places: an agent that asks and
        // never lets go (helper-34), through its session and without its key (helper-35),
        // leaves the others at least half.
        let share = (self.max_pending / 4).max(1);
        let holder = Holder::of(call.layer, call.session_id);
        let own = inner
            .pending
            .values()
            .filter(|p| Holder::of(&p.question.layer, &p.question.session_id) == holder)
            .count();
        if own >= share {
            return Asked::Now(None, Answer::SessionBusy(own));
        }
        // A person must see what they approve: arguments the record would keep only as a
        // marker (too large or too deep) are not put to anyone (helper-34: padding hid the
        // value the rule asked about).
        let arguments = match call.arguments {
            None => None,
            Some(a) => match crate::events::bound::bounded(a) {
                Some(marker) => {
                    let why = marker
                        .get("toolwall_truncated")
                        .and_then(Value::as_str)
                        .unwrap_or("too large")
                        .to_owned();
                    return Asked::Now(
                        None,
                        Answer::Unavailable(format!(
                            "its arguments cannot be shown to a person whole: {why}"
                        )),
                    );
                }
                None => Some(match call.decision.redact.as_slice() {
                    [] => a.clone(),
                    pointers => crate::policy::redacted(a, pointers),
                }),
            },
        };
        inner.next += 1;
        let id = inner.next;
        let asked_at = Utc::now();
        let question = Question {
            id,
            layer: call.layer.to_owned(),
            session_id: call.session_id.to_owned(),
            server_id,
            tool,
            arguments,
            reason: call.decision.ask.clone().unwrap_or_default(),
            asked_at,
            expires_at: asked_at + chrono::Duration::from_std(self.timeout).unwrap_or_default(),
        };
        let (tx, rx) = oneshot::channel();
        if let Some(webhook) = &self.webhook
            && webhook.try_send(question.clone()).is_err()
        {
            tracing::warn!(
                id,
                "approval webhook queue full: this question is not posted"
            );
        }
        tracing::info!(id, server = %question.server_id, tool = %question.tool, "a call waits for a person: toolwall approve|deny {id}");
        inner.pending.insert(
            id,
            Pending {
                question,
                answer: tx,
            },
        );
        drop(inner);
        self.changed.send_modify(|n| *n += 1);
        Asked::Waiting(Waiting {
            approvals: self,
            id,
            rx: Some(rx),
            key: Some(key),
            stage: call.stage,
        })
    }

    /// A person's answer to question `id`; `by` says who (`uid 0 (cli)`, `the web view`).
    pub(crate) fn answer(
        &self,
        id: u64,
        approve: bool,
        by: String,
        why: Option<String>,
    ) -> Result<Question, AnswerError> {
        let pending = self
            .lock()
            .pending
            .remove(&id)
            .ok_or(AnswerError::NotWaiting(id))?;
        tracing::info!(id, approve, %by, "approval answered");
        let answer = match approve {
            true => Answer::Approved(by),
            false => Answer::Denied(by, why),
        };
        // The asker may have gone (its client left) in the meantime: then nothing runs.
        let _ = pending.answer.send(answer);
        self.changed.send_modify(|n| *n += 1);
        Ok(pending.question)
    }

    /// The questions waiting, oldest first.
    pub(crate) fn pending(&self) -> Vec<Question> {
        self.lock()
            .pending
            .values()
            .map(|p| p.question.clone())
            .collect()
    }

    /// Changes whenever a question comes or goes.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// Whose share of the places a question takes.
#[derive(Debug, PartialEq, Eq)]
enum Holder<'a> {
    Session(&'a str),
    /// The LLM proxy's requests without a `/s/<key>`: anyone on the host, sessions included,
    /// can send them, so they are not the host's.
    Unkeyed,
}

impl<'a> Holder<'a> {
    fn of(layer: &str, session: &'a str) -> Self {
        match (layer, session) {
            ("llm", "") => Holder::Unkeyed,
            _ => Holder::Session(session),
        }
    }
}

/// How a question's session is shown: a proxy request without a session key is no one's.
pub(crate) fn session_label(question: &Question) -> &str {
    match Holder::of(&question.layer, &question.session_id) {
        Holder::Unkeyed => "(no /s/ key)",
        Holder::Session("") => "-",
        Holder::Session(session) => session,
    }
}

/// What [`Approvals::put`] gives back.
pub(crate) enum Asked<'a> {
    /// Decided without a person now; the question's id when there was one.
    Now(Option<u64>, Answer),
    /// Put to a person.
    Waiting(Waiting<'a>),
}

/// A question put to a person; dropped, it is taken off the list (its client left).
pub(crate) struct Waiting<'a> {
    approvals: &'a Approvals,
    /// The question's number.
    pub id: u64,
    rx: Option<oneshot::Receiver<Answer>>,
    key: Option<(String, String, String, String)>,
    stage: CallStage,
}

impl Waiting<'_> {
    /// The answer, or a denial once the time-out passed.
    pub(crate) async fn answer(mut self) -> Answer {
        let timeout = self.approvals.timeout;
        let answer = match self.rx.take() {
            Some(rx) => match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) | Err(_) => Answer::TimedOut(timeout),
            },
            None => Answer::TimedOut(timeout),
        };
        if self.stage == CallStage::Proposed
            && let Answer::Approved(by) = &answer
            && let Some(key) = self.key.take()
        {
            let mut inner = self.approvals.lock();
            if inner.grants.len() == MAX_GRANTS {
                inner.grants.pop_front();
            }
            inner.grants.push_back(Grant {
                key,
                id: self.id,
                by: by.clone(),
                until: Instant::now() + timeout,
            });
        }
        answer
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.approvals.lock().pending.remove(&self.id).is_some() {
            self.approvals.changed.send_modify(|n| *n += 1);
        }
    }
}

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

/// What `POST /api/approvals` takes: a call a stand-alone layer holds.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Posted {
    pub layer: String,
    pub session_id: String,
    pub stage: CallStage,
    pub decision: Decision,
    pub arguments: Option<Value>,
}

/// One line of `POST /api/approvals`'s answer (JSON lines): the question's number once it
/// waits, then how it ended.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Progress {
    /// Put to a person as this number.
    Waiting(u64),
    /// Ended: the question's number (if one was asked) and the answer.
    Answered(Option<u64>, Answer),
}

impl Asker {
    /// Asks about `call`; `waiting` gets the question's number as soon as it waits (for the
    /// client's progress notifications).
    pub(crate) async fn ask(
        &self,
        call: Call<'_>,
        waiting: &watch::Sender<u64>,
    ) -> (Option<u64>, Answer) {
        match self {
            Asker::Local(approvals) => match approvals.put(call) {
                Asked::Now(id, answer) => (id, answer),
                Asked::Waiting(asked) => {
                    let id = asked.id;
                    waiting.send_replace(id);
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
                    waiting.send_replace(id);
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

async fn remote(
    socket: &std::path::Path,
    posted: &Posted,
    mut on_waiting: impl FnMut(u64),
) -> anyhow::Result<(Option<u64>, Answer)> {
    use anyhow::Context as _;
    use http_body_util::BodyExt as _;
    let api = crate::client::ApiClient::connect(socket).await?;
    let mut body = api
        .post_streaming("/api/approvals", serde_json::to_vec(posted)?)
        .await?;
    let mut lines = crate::mcp::framing::LineFramer::with_limit(1 << 20);
    while let Some(frame) = body.frame().await {
        let frame = frame.context("the daemon's answer broke off")?;
        if let Some(data) = frame.data_ref() {
            lines.buffer_mut().extend_from_slice(data);
        }
        while let Some(line) = lines.next_line().context("the daemon's answer")? {
            match serde_json::from_slice::<Progress>(crate::mcp::framing::strip_newline(&line))
                .context("the daemon's answer")?
            {
                Progress::Waiting(id) => on_waiting(id),
                Progress::Answered(id, answer) => return Ok((id, answer)),
            }
        }
    }
    anyhow::bail!("the daemon ended its answer before the question was answered")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::ToolIdentity;
    use serde_json::json;

    fn asked() -> Decision {
        Decision {
            action: Action::Block,
            reason: "argument rule [0] asks a person".into(),
            tool: Some(ToolIdentity {
                server_id: "files".into(),
                server_type: "stdio".into(),
                server_addr: String::new(),
                tool: "write_file".into(),
                tool_hash: String::new(),
            }),
            redact: vec!["/token".into()],
            ask: Some("argument rule [0] asks a person".into()),
        }
    }

    fn approvals(timeout_secs: u64, max_pending: usize) -> Arc<Approvals> {
        Arc::new(Approvals::new(
            &ApprovalConfig {
                timeout_secs,
                max_pending,
                webhook: None,
            },
            None,
        ))
    }

    async fn first_waiting(approvals: &Approvals) -> Question {
        let mut changed = approvals.subscribe();
        loop {
            if let Some(q) = approvals.pending().into_iter().next() {
                return q;
            }
            changed.changed().await.expect("open");
        }
    }

    #[tokio::test]
    async fn an_approved_call_runs_and_the_question_shows_what_the_record_keeps() {
        let a = approvals(60, 4);
        let decision = asked();
        let args = json!({"path": "/etc/x", "token": "s3cret"});
        let asking = {
            let (a, decision, args) = (a.clone(), decision.clone(), args.clone());
            tokio::spawn(async move {
                a.ask(Call {
                    layer: "shim",
                    session_id: "s1",
                    stage: CallStage::Executing,
                    decision: &decision,
                    arguments: Some(&args),
                })
                .await
            })
        };
        let q = first_waiting(&a).await;
        assert_eq!(
            (q.server_id.as_str(), q.tool.as_str()),
            ("files", "write_file")
        );
        assert_eq!(q.arguments.as_ref().unwrap()["path"], "/etc/x");
        assert_ne!(
            q.arguments.as_ref().unwrap()["token"],
            "s3cret",
            "redacted: {q:?}"
        );
        a.answer(q.id, true, "uid 0 (cli)".into(), None).unwrap();
        let (id, answer) = asking.await.unwrap();
        let settled = answer.settle(id, decision);
        assert_eq!(settled.action, Action::Allow);
        assert!(
            settled
                .reason
                .starts_with("approved by uid 0 (cli) (approval 1;"),
            "{}",
            settled.reason
        );
        assert!(settled.ask.is_none());
        assert!(a.pending().is_empty());
        assert_eq!(
            a.answer(q.id, false, "x".into(), None),
            Err(AnswerError::NotWaiting(q.id)),
            "answered once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_answer_is_a_denial_and_a_full_list_denies_at_once() {
        let a = approvals(5, 1);
        let decision = asked();
        let waiting = {
            let (a, decision) = (a.clone(), decision.clone());
            tokio::spawn(async move {
                a.ask(Call {
                    layer: "shim",
                    session_id: "",
                    stage: CallStage::Executing,
                    decision: &decision,
                    arguments: None,
                })
                .await
            })
        };
        first_waiting(&a).await;
        let (id, busy) = a
            .ask(Call {
                layer: "shim",
                session_id: "another",
                stage: CallStage::Executing,
                decision: &decision,
                arguments: None,
            })
            .await;
        assert_eq!((id, &busy), (None, &Answer::Busy(1)));
        assert!(busy.settle(id, decision.clone()).is_blocked());
        let (id, answer) = waiting.await.unwrap();
        assert_eq!(answer, Answer::TimedOut(Duration::from_secs(5)));
        let settled = answer.settle(id, decision);
        assert!(settled.is_blocked() && settled.reason.contains("no one answered within 5 s"));
        assert!(a.pending().is_empty(), "a timed-out question is gone");
    }

    #[tokio::test]
    async fn one_session_holds_a_quarter_of_the_places_and_unshowable_arguments_are_not_asked() {
        let a = approvals(60, 4);
        let decision = asked();
        let call = |session: &'static str, args: &'static Value| Call {
            layer: "shim",
            session_id: session,
            stage: CallStage::Executing,
            decision: Box::leak(Box::new(decision.clone())),
            arguments: Some(args),
        };
        let empty: &'static Value = Box::leak(Box::new(json!({})));
        let held = [a.put(call("s1", empty)), a.put(call("s1", empty))];
        assert!(matches!(held[0], Asked::Waiting(_)));
        assert!(matches!(held[1], Asked::Now(None, Answer::SessionBusy(1))));
        // The proxy's requests without a session key are nobody's session, the host's neither.
        let unkeyed = a.put(Call {
            layer: "llm",
            ..call("", empty)
        });
        assert!(matches!(unkeyed, Asked::Waiting(_)));
        assert!(matches!(
            a.put(Call {
                layer: "llm",
                ..call("", empty)
            }),
            Asked::Now(None, Answer::SessionBusy(1))
        ));
        let host = a.put(call("", empty));
        assert!(matches!(host, Asked::Waiting(_)));
        drop((unkeyed, host));
        assert!(matches!(a.put(call("s2", empty)), Asked::Waiting(_)));
        let deep: &'static Value = Box::leak(Box::new((0..40).fold(json!(1), |v, _| json!([v]))));
        assert!(matches!(
            a.put(call("s3", deep)),
            Asked::Now(None, Answer::Unavailable(why)) if why.contains("cannot be shown to a person whole")
        ));
        drop(held);
        assert_eq!(a.pending().len(), 0, "dropped questions are withdrawn");
    }

    #[tokio::test]
    async fn a_call_approved_when_proposed_runs_once_without_a_second_question() {
        let a = approvals(60, 4);
        let decision = asked();
        let args = json!({"path": "/etc/x"});
        let proposed = {
            let (a, decision, args) = (a.clone(), decision.clone(), args.clone());
            tokio::spawn(async move {
                a.ask(Call {
                    layer: "llm",
                    session_id: "s1",
                    stage: CallStage::Proposed,
                    decision: &decision,
                    arguments: Some(&args),
                })
                .await
            })
        };
        let q = first_waiting(&a).await;
        a.answer(q.id, true, "the web view".into(), None).unwrap();
        assert!(matches!(proposed.await.unwrap().1, Answer::Approved(_)));
        let run = |args: Value| {
            let (a, decision) = (a.clone(), decision.clone());
            async move {
                a.ask(Call {
                    layer: "shim",
                    session_id: "s1",
                    stage: CallStage::Executing,
                    decision: &decision,
                    arguments: Some(&args),
                })
                .await
            }
        };
        // Other arguments are another call: asked anew.
        let other = tokio::spawn(run(json!({"path": "/etc/y"})));
        let q2 = first_waiting(&a).await;
        assert_ne!(q2.id, q.id);
        a.answer(q2.id, false, "uid 0 (cli)".into(), Some("no".into()))
            .unwrap();
        assert!(matches!(other.await.unwrap().1, Answer::Denied(_, _)));
        let (id, answer) = run(args.clone()).await;
        assert_eq!(id, Some(q.id));
        assert_eq!(
            answer,
            Answer::Approved("the web view when the model proposed it".into())
        );
        // Once.
        let again = tokio::spawn(run(args));
        first_waiting(&a).await;
        again.abort();
        let _ = again.await;
        assert!(
            a.pending().is_empty(),
            "a caller that left takes its question"
        );
    }
}
