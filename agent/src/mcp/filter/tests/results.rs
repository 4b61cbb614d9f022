//! Results and questions: a secret in a result is redacted and recorded without it, a withheld
//! result becomes an error, and a call that asks a person is held only where it can wait.

use super::*;

/// A fake AWS access key id (gitleaks' `aws-access-token`).
const AWS: &str = "AKIAQYLPMN5HHHFPZAM2";

#[test]
fn a_secret_in_a_tool_result_is_redacted_and_recorded_without_it() {
    let (sink, _rx) = EventSink::channel();
    let mut f = Filter::new(ctx(&[], Some(sink)));
    let call = br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"read","arguments":{}}}"#;
    assert!(f.on_client(call).forward.is_some());
    let result = format!(
        r#"{{"jsonrpc":"2.0","id":5,"result":{{"content":[{{"type":"text","text":"aws_access_key_id = {AWS}"}}]}}}}"#
    );
    let out = f.on_server(result.as_bytes());
    let forwarded = String::from_utf8(out.forward.expect("forwarded").into_owned()).expect("utf8");
    assert!(!forwarded.contains(AWS), "{forwarded}");
    assert!(
        forwarded.contains("[toolwall:redacted:aws-access-token]"),
        "{forwarded}"
    );
    let record = out
        .records
        .iter()
        .find_map(|r| match r {
            Event::McpResultInspected(e) => Some(e),
            _ => None,
        })
        .expect("a result record");
    assert_eq!(record.tool_name, "read");
    assert_eq!(record.jsonrpc_id, serde_json::json!(5));
    assert_eq!(record.inspection, crate::decision::ResultAction::Redact);
    assert_eq!(record.action, Action::Allow);
    assert!(!serde_json::to_string(record).expect("json").contains(AWS));
    // The call was answered: a later message with that id is no longer the tool's.
    assert!(f.pending.is_empty());
}

#[test]
fn results_without_findings_are_the_same_bytes_and_batches_are_inspected_per_item() {
    let mut f = filter(&[]);
    let quiet = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"the key to it all"}]}}"#;
    assert!(is_borrowed_same(&f.on_server(quiet), quiet));
    let batch = format!(
        r#"[{},{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":"{AWS}"}}}}]"#,
        String::from_utf8_lossy(quiet)
    );
    let out = f.on_server(batch.as_bytes());
    let forwarded = String::from_utf8(out.forward.expect("forwarded").into_owned()).expect("utf8");
    assert!(forwarded.starts_with(&format!("[{}", String::from_utf8_lossy(quiet))));
    assert!(!forwarded.contains(AWS) && forwarded.contains("[toolwall:redacted:"));
}

#[test]
fn a_withheld_result_is_a_tool_error_and_other_responses_an_rpc_error() {
    let tool = super::listing::withheld("7", true, "1 finding (x): withheld");
    let v: Value = serde_json::from_slice(&tool).expect("JSON");
    assert_eq!(v["id"], 7);
    assert_eq!(v["result"]["isError"], true);
    assert!(
        v["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("toolwall withheld this result"))
    );
    let other: Value =
        serde_json::from_slice(&super::listing::withheld("\"r\"", false, "why")).expect("JSON");
    assert_eq!(other["id"], "r");
    assert_eq!(other["error"]["code"], -32603);
}

/// A filter whose policy asks about `add` calls with `a` from 100 up; `asker` is who it asks.
fn asking(asker: Option<crate::approval::Asker>) -> Filter {
    let config = crate::config::Config::parse(
        "sandbox:\n  mcp:\n    argument_rules:\n      - tool: add\n        action: ask\n        when:\n          - pointer: /a\n            range: { min: 100 }\n",
        "test.yaml",
    )
    .expect("config");
    let registry = crate::registry::Registry::in_memory().expect("registry");
    let gate =
        Arc::new(crate::policy::Policy::new(&config, Arc::new(registry), &[]).expect("policy"));
    Filter::new(FilterContext {
        gate,
        approvals: asker,
        ..ctx(&[], None)
    })
}

#[test]
fn a_call_that_asks_is_held_once_alone_and_refused_where_it_cannot_wait() {
    let approvals = Arc::new(crate::approval::Approvals::new(
        &crate::config::ApprovalConfig::default(),
        None,
    ));
    let mut f = asking(Some(crate::approval::Asker::Local(approvals)));
    let call = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"add","arguments":{"a":500},"_meta":{"progressToken":"p1"}}}"#;
    let mut out = f.on_client(call);
    assert!(out.forward.is_none() && out.replies.is_empty(), "{out:?}");
    let held = out.held.pop().expect("held");
    assert_eq!(
        (held.id.as_str(), held.progress_token.as_deref()),
        ("3", Some("\"p1\""))
    );
    // While it waits, its id is taken.
    let again = f.on_client(call);
    assert!(again.held.is_empty() && again.forward.is_none());
    assert!(String::from_utf8_lossy(&again.replies[0]).contains("already used"));
    // Approved: the server gets the text that was judged, and the result is known as `add`'s.
    let approved = f.settle(
        held,
        Some(crate::approval::QuestionId::new("k3f9", 1)),
        &crate::approval::Answer::Approved("uid 0 (cli)".into()),
    );
    let forwarded = approved.forward.expect("forwarded");
    assert_eq!(
        serde_json::from_slice::<Value>(&forwarded).unwrap(),
        serde_json::from_slice::<Value>(call).unwrap()
    );
    assert_eq!(f.requests(), 1);
    assert!(
        f.on_server(br#"{"jsonrpc":"2.0","id":3,"result":{"content":[]}}"#)
            .forward
            .is_some()
    );
    let held = f.on_client(call).held.pop().expect("held again");
    let denied = f.settle(
        held,
        Some(crate::approval::QuestionId::new("k3f9", 2)),
        &crate::approval::Answer::Denied("the web view".into(), Some("no".into())),
    );
    assert!(denied.forward.is_none());
    let reply: Value = serde_json::from_slice(&denied.replies[0]).unwrap();
    assert_eq!(reply["id"], 3);
    assert!(
        reply["error"]["message"].as_str().is_some_and(
            |m| m.starts_with("toolwall: denied by the web view: no (approval k3f9-2;")
        ),
        "{reply}"
    );

    // In a batch, or as a notification, a call cannot wait alone: refused, never forwarded.
    let batch = br#"[{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"add","arguments":{"a":500}}},{"jsonrpc":"2.0","id":5,"method":"ping"}]"#;
    let out = f.on_client(batch);
    assert!(out.held.is_empty());
    let kept: Value = serde_json::from_slice(&out.forward.expect("the ping")).unwrap();
    assert_eq!(
        kept,
        serde_json::json!([{"jsonrpc":"2.0","id":5,"method":"ping"}])
    );
    assert!(String::from_utf8_lossy(&out.replies[0]).contains("inside a batch cannot wait"));
    let note =
        br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"add","arguments":{"a":500}}}"#;
    let out = f.on_client(note);
    assert!(out.held.is_empty() && out.forward.is_none());

    // With no one to ask, refused saying so.
    let mut alone = asking(None);
    let out = alone.on_client(call);
    assert!(out.held.is_empty() && out.forward.is_none());
    assert!(
        String::from_utf8_lossy(&out.replies[0]).contains("no one can be asked here"),
        "{:?}",
        String::from_utf8_lossy(&out.replies[0])
    );
}
