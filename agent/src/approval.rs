//! Asking a person about a call: an argument rule with `action: ask` makes the
//! policy answer "block, unless someone approves" ([`Decision::ask`]); a layer that can wait
//! puts the call here, and the daemon's API, the CLI (`toolwall approve|deny ID`) and the web
//! view answer it. No answer within `approval.timeout_secs` is a denial. An answer names its
//! question twice: by an id no other daemon run gives out, and by the digest of what was asked
//! (`question.rs`); an answer naming anything else is refused, showing what waits.
//!
//! One call is asked about once: a call the LLM layer saw proposed and a person approved is
//! remembered ([`Grant`]) and runs at the MCP layer without a second question — the same
//! session, server, tool and arguments (by `registry::value_hash`), once, within the time-out.
//! Everything is bounded: `approval.max_pending` questions at once (one more is denied at
//! once), [`MAX_GRANTS`] remembered approvals.

mod asker;
mod question;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

use crate::config::ApprovalConfig;
use crate::decision::{Action, CallStage, Decision};

pub(crate) use asker::{Asker, Posted, Progress};
pub(crate) use question::{Question, QuestionId, run_prefix};

/// Approvals remembered for the MCP layer at once; the oldest goes first.
const MAX_GRANTS: usize = 256;

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
    pub(crate) fn settle(&self, id: Option<&QuestionId>, mut decision: Decision) -> Decision {
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

/// Why an answer was not taken; each says what to do, and those about a waiting question show
/// it (escaped as every view escapes, `hidden.rs`).
#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum AnswerError {
    /// Not an id this API gives out.
    #[error(
        "`{0}` is not an approval id (ids look like k3f9-1): `toolwall approvals` lists the waiting calls"
    )]
    NotAnId(String),
    /// An id of another daemon run (before a restart), or mistyped: never another question.
    #[error(
        "approval {0} was not asked by this daemon (it has restarted since, or the id is mistyped): nothing was answered; `toolwall approvals` lists the waiting calls and their ids"
    )]
    OtherRun(String),
    /// No such question waits (answered, timed out, or its client left).
    #[error(
        "no call waits under approval {0} (it was answered, timed out, or its client left): `toolwall approvals` lists the waiting ones"
    )]
    NotWaiting(QuestionId),
    /// The answer named no digest.
    #[error(
        "an answer names the digest of the question it answers, and this one names none: nothing was answered; waiting is {}; answer it with `toolwall approve|deny ID --digest D`",
        .0.describe()
    )]
    NoDigest(Box<Question>),
    /// The answer named another digest than the waiting question's.
    #[error(
        "the call waiting under approval {} is not the one digest {given} names (another question, or a mistyped digest): nothing was answered; waiting is {}; if that is the call you mean, answer it with its digest",
        .question.id,
        .question.describe()
    )]
    Mismatch {
        /// The digest the answer named (escaped, cut).
        given: String,
        /// What waits under the id.
        question: Box<Question>,
    },
}

impl AnswerError {
    /// The question waiting under the id, when the answer named another digest or none.
    pub(crate) fn waiting(&self) -> Option<&Question> {
        match self {
            AnswerError::NoDigest(question) | AnswerError::Mismatch { question, .. } => {
                Some(question)
            }
            _ => None,
        }
    }
}

/// Text a person typed, quoted in an error: escaped, at most 40 characters.
fn quoted(text: &str) -> String {
    let cut: String = text.chars().take(40).collect();
    crate::hidden::escaped(&cut).into_owned()
}

struct Pending {
    question: Question,
    answer: oneshot::Sender<Answer>,
}

/// A proposed call a person approved: it may run once.
#[derive(Debug)]
struct Grant {
    key: (String, String, String, String),
    id: QuestionId,
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
    /// This run's id prefix: ids of another run are refused, not matched to this run's.
    prefix: String,
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
            prefix: question::run_prefix(),
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
    pub(crate) async fn ask(&self, call: Call<'_>) -> (Option<QuestionId>, Answer) {
        match self.put(call) {
            Asked::Now(id, answer) => (id, answer),
            Asked::Waiting(waiting) => {
                let id = waiting.id.clone();
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
        // never lets go, through its session and without its key, leaves the others at least
        // half (`one_session_holds_a_quarter_of_the_places_and_unshowable_arguments_are_not_asked`).
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
        // marker (too large or too deep) are not put to anyone (else padding would hide the
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
        let count = inner.next;
        let id = QuestionId::new(&self.prefix, count);
        let reason = call.decision.ask.clone().unwrap_or_default();
        let asked_at = Utc::now();
        let question = Question {
            digest: question::digest(
                &id,
                call.layer,
                call.session_id,
                &server_id,
                &tool,
                arguments.as_ref(),
                &reason,
            ),
            id: id.clone(),
            layer: call.layer.to_owned(),
            session_id: call.session_id.to_owned(),
            server_id,
            tool,
            arguments,
            reason,
            asked_at,
            expires_at: asked_at + chrono::Duration::from_std(self.timeout).unwrap_or_default(),
        };
        let (tx, rx) = oneshot::channel();
        if let Some(webhook) = &self.webhook
            && webhook.try_send(question.clone()).is_err()
        {
            tracing::warn!(
                %id,
                "approval webhook queue full: this question is not posted"
            );
        }
        tracing::info!(%id, digest = %question.digest, server = %question.server_id, tool = %question.tool, "a call waits for a person: toolwall approve|deny {id}");
        inner.pending.insert(
            count,
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
            count,
            rx: Some(rx),
            key: Some(key),
            stage: call.stage,
        })
    }

    /// A person's answer to question `id`, naming the `digest` of what they were shown; `by`
    /// says who (`uid 0 (cli)`, `the web view`). An id of another run, or a digest that is not
    /// the question's (or none), answers nothing.
    pub(crate) fn answer(
        &self,
        id: &str,
        digest: Option<&str>,
        approve: bool,
        by: String,
        why: Option<String>,
    ) -> Result<Question, AnswerError> {
        let count = self.count_of(id)?;
        let mut inner = self.lock();
        let waiting = &inner
            .pending
            .get(&count)
            .ok_or_else(|| AnswerError::NotWaiting(QuestionId::new(&self.prefix, count)))?
            .question;
        match digest.map(str::trim) {
            None => return Err(AnswerError::NoDigest(Box::new(waiting.clone()))),
            Some(given) if !given.eq_ignore_ascii_case(&waiting.digest) => {
                return Err(AnswerError::Mismatch {
                    given: quoted(given),
                    question: Box::new(waiting.clone()),
                });
            }
            Some(_) => {}
        }
        let pending = inner
            .pending
            .remove(&count)
            .ok_or_else(|| AnswerError::NotWaiting(QuestionId::new(&self.prefix, count)))?;
        drop(inner);
        tracing::info!(%id, approve, %by, "approval answered");
        let answer = match approve {
            true => Answer::Approved(by),
            false => Answer::Denied(by, why),
        };
        // The asker may have gone (its client left) in the meantime: then nothing runs.
        let _ = pending.answer.send(answer);
        self.changed.send_modify(|n| *n += 1);
        Ok(pending.question)
    }

    /// The count of this run's question `id` (`PREFIX-COUNT`, as [`QuestionId`] writes it).
    fn count_of(&self, id: &str) -> Result<u64, AnswerError> {
        let count = id
            .rsplit_once('-')
            .filter(|(prefix, _)| {
                !prefix.is_empty() && prefix.chars().all(|c| c.is_ascii_alphanumeric())
            })
            .and_then(|(prefix, count)| Some((prefix, count.parse::<u64>().ok()?)))
            .filter(|&(prefix, count)| QuestionId::new(prefix, count).as_str() == id);
        match count {
            None => Err(AnswerError::NotAnId(quoted(id))),
            Some((prefix, _)) if prefix != self.prefix => Err(AnswerError::OtherRun(quoted(id))),
            Some((_, count)) => Ok(count),
        }
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
    Now(Option<QuestionId>, Answer),
    /// Put to a person.
    Waiting(Waiting<'a>),
}

/// A question put to a person; dropped, it is taken off the list (its client left).
pub(crate) struct Waiting<'a> {
    approvals: &'a Approvals,
    /// The question's id.
    pub id: QuestionId,
    /// Its key in the pending list.
    count: u64,
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
                id: self.id.clone(),
                by: by.clone(),
                until: Instant::now() + timeout,
            });
        }
        answer
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.approvals.lock().pending.remove(&self.count).is_some() {
            self.approvals.changed.send_modify(|n| *n += 1);
        }
    }
}

#[cfg(test)]
mod tests;
