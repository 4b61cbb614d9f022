//! Asking about calls end to end: an answer, no answer, a full list, a holder's share, a call
//! approved when proposed running once, and answers that name another question.

use std::sync::Arc;

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
    a.answer(
        q.id.as_str(),
        Some(&q.digest),
        true,
        "uid 0 (cli)".into(),
        None,
    )
    .unwrap();
    let (id, answer) = asking.await.unwrap();
    let settled = answer.settle(id.as_ref(), decision);
    assert_eq!(settled.action, Action::Allow);
    assert!(
        settled
            .reason
            .starts_with(&format!("approved by uid 0 (cli) (approval {};", q.id)),
        "{}",
        settled.reason
    );
    assert!(settled.ask.is_none());
    assert!(a.pending().is_empty());
    assert_eq!(
        a.answer(q.id.as_str(), Some(&q.digest), false, "x".into(), None),
        Err(AnswerError::NotWaiting(q.id.clone())),
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
    assert_eq!((&id, &busy), (&None, &Answer::Busy(1)));
    assert!(busy.settle(id.as_ref(), decision.clone()).is_blocked());
    let (id, answer) = waiting.await.unwrap();
    assert_eq!(answer, Answer::TimedOut(Duration::from_secs(5)));
    let settled = answer.settle(id.as_ref(), decision);
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
    a.answer(
        q.id.as_str(),
        Some(&q.digest),
        true,
        "the web view".into(),
        None,
    )
    .unwrap();
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
    a.answer(
        q2.id.as_str(),
        Some(&q2.digest),
        false,
        "uid 0 (cli)".into(),
        Some("no".into()),
    )
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

/// Asks about `args` in the background; the question once it waits, and the asking task.
async fn waiting_on(
    a: &Arc<Approvals>,
    args: Value,
) -> (
    Question,
    tokio::task::JoinHandle<(Option<QuestionId>, Answer)>,
) {
    let asking = {
        let a = a.clone();
        tokio::spawn(async move {
            a.ask(Call {
                layer: "shim",
                session_id: "s1",
                stage: CallStage::Executing,
                decision: &asked(),
                arguments: Some(&args),
            })
            .await
        })
    };
    (first_waiting(a).await, asking)
}

#[tokio::test]
async fn an_answer_names_its_question_by_id_and_digest() {
    let a = approvals(60, 4);
    let (q, asking) = waiting_on(&a, json!({"path": "/etc/x"})).await;
    assert_eq!(
        q.digest,
        question::digest(
            &q.id,
            &q.layer,
            &q.session_id,
            &q.server_id,
            &q.tool,
            q.arguments.as_ref(),
            &q.reason
        )
    );
    assert_eq!(q.digest.len(), 16);
    // Each field the person reads is in the digest.
    let other = |q: &Question| {
        question::digest(
            &q.id,
            &q.layer,
            &q.session_id,
            &q.server_id,
            &q.tool,
            q.arguments.as_ref(),
            &q.reason,
        )
    };
    for changed in [
        Question {
            id: QuestionId::new("zzzz", 1),
            ..q.clone()
        },
        Question {
            layer: "mcp-proxy".into(),
            ..q.clone()
        },
        Question {
            session_id: "s2".into(),
            ..q.clone()
        },
        Question {
            server_id: "bank".into(),
            ..q.clone()
        },
        Question {
            tool: "transfer".into(),
            ..q.clone()
        },
        Question {
            arguments: Some(json!({"path": "/etc/y"})),
            ..q.clone()
        },
        Question {
            reason: "another rule".into(),
            ..q.clone()
        },
    ] {
        assert_ne!(other(&changed), q.digest, "{changed:?}");
    }

    let id = q.id.as_str();
    let by = || "uid 0 (cli)".to_owned();
    // No digest, another digest: refused, showing what waits; nothing is answered.
    let none = a.answer(id, None, true, by(), None).unwrap_err();
    assert_eq!(none.waiting(), Some(&q));
    assert!(none.to_string().contains("names none"), "{none}");
    let wrong = a
        .answer(id, Some("0123456789abcdef"), true, by(), None)
        .unwrap_err();
    assert_eq!(wrong.waiting(), Some(&q));
    let said = wrong.to_string();
    assert!(
        said.contains(&q.digest) && said.contains("write_file") && said.contains("/etc/x"),
        "{said}"
    );
    // Not ids of this run: never another question.
    for typed in ["1", "k3f9", "-1", &format!("{id}x"), &id.replace('-', "-0")] {
        assert!(
            matches!(
                a.answer(typed, Some(&q.digest), true, by(), None),
                Err(AnswerError::NotAnId(_))
            ),
            "{typed}"
        );
    }
    assert_eq!(a.pending(), std::slice::from_ref(&q), "still waiting");
    // The digest as listed (any case) answers it.
    let answered = a
        .answer(id, Some(&q.digest.to_uppercase()), false, by(), None)
        .unwrap();
    assert_eq!(answered, q);
    assert!(matches!(asking.await.unwrap(), (Some(i), Answer::Denied(..)) if i == q.id));
}

/// A daemon that restarted asks its first question under a new id; an id listed before the
/// restart is refused, not taken for the new question of the same count.
#[tokio::test]
async fn an_id_from_before_a_restart_answers_nothing() {
    let before = approvals(60, 4);
    let (old, _asking) = waiting_on(&before, json!({"amount": 1})).await;
    // A restart is a new `Approvals`; its prefix is random (one in a million the same: then
    // another restart).
    let after = loop {
        let after = approvals(60, 4);
        if after.prefix != before.prefix {
            break after;
        }
    };
    let (new, _asking) = waiting_on(&after, json!({"amount": 9999})).await;
    assert_ne!(new.id, old.id);
    assert_eq!(
        (old.id.as_str().split_once('-').map(|p| p.1)),
        (new.id.as_str().split_once('-').map(|p| p.1)),
        "the same count in each run"
    );
    let refused = after
        .answer(
            old.id.as_str(),
            Some(&old.digest),
            true,
            "uid 0 (cli)".into(),
            None,
        )
        .unwrap_err();
    assert!(matches!(refused, AnswerError::OtherRun(_)), "{refused:?}");
    assert!(
        refused.to_string().contains("was not asked by this daemon"),
        "{refused}"
    );
    // Its digest neither answers the new question under the new id.
    let refused = after
        .answer(
            new.id.as_str(),
            Some(&old.digest),
            true,
            "uid 0 (cli)".into(),
            None,
        )
        .unwrap_err();
    assert_eq!(refused.waiting(), Some(&new));
    assert_eq!(after.pending(), [new]);
}

/// What the CLI prints, the webhook's text and the 409 say of a question: the characters a
/// person does not see are escaped, so the tool and arguments read as what they are.
#[tokio::test]
async fn a_question_is_described_with_its_hidden_characters_escaped() {
    let a = approvals(60, 4);
    let (q, _asking) = waiting_on(&a, json!({"path": "/etc/x\u{202E}txt.exe"})).await;
    let q = Question {
        tool: "read\u{2060}_file".into(),
        ..q
    };
    let said = q.describe();
    assert!(
        said.contains(&format!("approval {} (digest {}): ", q.id, q.digest))
            && said.contains(r"read\u{2060}_file on files (session s1)")
            && said
                .contains(r#"with {"path":"/etc/x\u{202e}txt.exe"}; asked because argument rule"#),
        "{said}"
    );
    assert!(!said.chars().any(crate::hidden::is_hidden), "{said}");
}
