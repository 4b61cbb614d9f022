//! Calls seen more than once or where no item can replace them: a call whose name, code or
//! arguments change after it was judged is judged again (every copy the SDK keeps), a call with
//! argument rules is held until its arguments are whole, and a blocked call the stream cannot
//! replace ends the stream.

use serde_json::Value;

use super::{
    check_consistent, completed_output, custom_stream, function_stream, function_stream_changing,
    output_types,
};
use crate::decision::Action;
use crate::llm::Dialect;
use crate::llm::responses::{mcp_references, normalise_code};
use crate::llm::testing::{assert_split_invariant, data_values, run, sse};

/// Every function call the agent's SDK would keep: `output_item.done` items and the
/// `response.completed` output, as `namespace__name`.
fn kept_calls(values: &[Value]) -> Vec<String> {
    let done = values
        .iter()
        .filter(|v| v["type"] == "response.output_item.done")
        .map(|v| v["item"].clone());
    done.chain(completed_output(values))
        .filter(|i| i["type"] == "function_call")
        .map(|i| {
            let name = i["name"].as_str().unwrap_or_default();
            match i["namespace"].as_str() {
                Some(ns) => format!("{ns}__{name}"),
                None => name.to_owned(),
            }
        })
        .collect()
}

#[test]
fn a_call_renamed_after_it_was_allowed_is_judged_again() {
    const DENIED: &str = "mcp__everything__delete_all";
    let allowed = ("mcp__everything", "get_sum");
    let denied = ("mcp__everything", "delete_all");
    struct Case {
        name: &'static str,
        added: (&'static str, &'static str),
        done: (&'static str, &'static str),
        completed: (&'static str, &'static str),
    }
    let cases = [
        Case {
            name: "renamed at done (and in completed)",
            added: allowed,
            done: denied,
            completed: denied,
        },
        Case {
            name: "renamed only in completed",
            added: allowed,
            done: allowed,
            completed: denied,
        },
        Case {
            name: "namespace changed at done",
            added: ("mcp__other", "delete_all"),
            done: denied,
            completed: denied,
        },
        Case {
            name: "a native call turned into a denied MCP call",
            added: ("", "shell"),
            done: denied,
            completed: denied,
        },
    ];
    for case in cases {
        let input = function_stream_changing(case.added, case.done, case.completed);
        let out = assert_split_invariant(Dialect::OpenAiResponses, &[DENIED], &input);
        let values = data_values(&out);
        let kept = kept_calls(&values);
        assert!(
            !kept.iter().any(|k| k == DENIED),
            "{}: denied call reached the agent: {kept:?}",
            case.name
        );
        assert_eq!(
            output_types(&values),
            ["message", "message"],
            "{}",
            case.name
        );
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("[toolwall] Tool 'mcp__everything__delete_all' blocked by policy"),
            "{}",
            case.name
        );
        let (_, records) = run(Dialect::OpenAiResponses, &[DENIED], &input);
        assert!(
            records
                .iter()
                .any(|r| r.tool_name == DENIED && r.decision.action == Action::Block),
            "{}: {records:?}",
            case.name
        );
    }
}

#[test]
fn an_unchanged_allowed_call_is_judged_and_recorded_once() {
    let input = function_stream("mcp__everything", "get_sum");
    let (out, records) = run(Dialect::OpenAiResponses, &[], &input);
    assert_eq!(out, input);
    assert_eq!(records.len(), 1, "{records:?}");
}

#[test]
fn code_mode_call_whose_final_code_differs_is_judged_again() {
    let benign = serde_json::to_string("return 1;").expect("json");
    let evil = serde_json::to_string("await tools.mcp__everything__echo({message: \"SECRET\"});")
        .expect("json");
    let input = custom_stream(&benign);
    let input = String::from_utf8(input).expect("utf-8");
    // The completed output carries other code than the streamed item.
    let cut = input.find("event: response.completed").expect("completed");
    let (head, tail) = input.split_at(cut);
    let tampered = format!("{head}{}", tail.replace(&benign, &evil));
    let out = assert_split_invariant(
        Dialect::OpenAiResponses,
        &["mcp__everything__echo"],
        tampered.as_bytes(),
    );
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("SECRET"), "blocked code reached the agent");
    assert_eq!(output_types(&data_values(&out)), ["message"]);
}

/// A call item in an event the machine does not build output from (an unknown type here, as
/// the fuzzer sent it) is judged too: a blocked one ends the stream, an allowed one passes.
#[test]
fn a_blocked_call_in_an_unexpected_event_ends_the_stream() {
    let item = r#"{"type":"function_call","id":"fc","call_id":"c1","namespace":"mcp__fs","name":"delete","arguments":"{\"p\":\"SECRET\"}"}"#;
    let input = sse(&[
        (
            "response.created",
            r#"{"type":"response.created","response":{"id":"r","output":[]}}"#,
        ),
        (
            "x",
            &format!(
                r#"{{"type":"messageresponse.output_item.added","output_index":0,"item":{item}}}"#
            ),
        ),
        (
            "response.in_progress",
            &format!(
                r#"{{"type":"response.in_progress","response":{{"id":"r","output":[{item}]}}}}"#
            ),
        ),
    ]);
    let out = assert_split_invariant(Dialect::OpenAiResponses, &["mcp__fs__delete"], &input);
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("SECRET"), "{text}");
    assert!(text.contains("toolwall_blocked"), "{text}");
    let (allowed, _) = run(Dialect::OpenAiResponses, &[], &input);
    assert_eq!(allowed, input);
}

/// An `output_item.added`/`.done` without an `output_index` cannot have its item replaced in
/// place: a blocked call in it ends the stream rather than passing.
#[test]
fn a_blocked_call_without_an_output_index_ends_the_stream() {
    let item = r#"{"type":"function_call","id":"fc","call_id":"c1","namespace":"mcp__fs","name":"delete","arguments":"{\"p\":\"SECRET\"}"}"#;
    for ty in ["response.output_item.added", "response.output_item.done"] {
        let input = sse(&[(ty, &format!(r#"{{"type":"{ty}","item":{item}}}"#))]);
        let out = assert_split_invariant(Dialect::OpenAiResponses, &["mcp__fs__delete"], &input);
        let text = String::from_utf8_lossy(&out);
        assert!(!text.contains("SECRET"), "{ty}: {text}");
        assert!(text.contains("toolwall_blocked"), "{ty}: {text}");
    }
}

#[test]
fn code_mode_spellings_are_normalised_before_the_scan() {
    // A scan for the literal name misses every one of these.
    for (code, want) in [
        (r#"tools["mcp__s__ec"+"ho"]({})"#, ("s", "echo")),
        (r#"tools['mcp__s__e' + "c" +  `ho`]({})"#, ("s", "echo")),
        (r"tools.mcp__s__\u0065cho({})", ("s", "echo")),
        (r"tools.mcp__s__\u{65}cho({})", ("s", "echo")),
        (r#"tools["mcp__s__\x65cho"]()"#, ("s", "echo")),
    ] {
        let normalised = normalise_code(code);
        assert!(
            mcp_references(&normalised).contains(&want),
            "{code} -> {normalised}"
        );
    }
}

/// A function call argument rules judge is held from `added` until `done`, then
/// passed as it came or replaced by a message — at every split of the stream.
#[test]
fn a_function_call_argument_rules_judge_is_held_until_done() {
    let allowed = function_stream("mcp__srv", "guarded");
    let out = assert_split_invariant(Dialect::OpenAiResponses, &[], &allowed);
    assert_eq!(out, allowed, "an allowed held call leaves as it came");
    let (_, records) = run(Dialect::OpenAiResponses, &[], &allowed);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].decision.action, Action::Allow);
    assert_eq!(records[0].input, Some(serde_json::json!({"a": "SECRET"})));

    let text = String::from_utf8_lossy(&allowed).replace(r#"RET\"}"#, r#"RET_2\"}"#);
    let refused = text.into_bytes();
    let out = assert_split_invariant(Dialect::OpenAiResponses, &[], &refused);
    let values = data_values(&out);
    check_consistent(&values);
    assert_eq!(output_types(&values), ["message", "message"]);
    let shown = String::from_utf8_lossy(&out);
    assert!(
        !shown.contains("RET_2") && !shown.contains("\"SEC"),
        "{shown}"
    );
    assert!(
        shown.contains("argument rule of the test"),
        "the model is told why"
    );
    let (_, records) = run(Dialect::OpenAiResponses, &[], &refused);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].decision.action, Action::Block);
}

/// A final `response.completed` that carries the passed call with other arguments (the SDK's
/// `get_final_response` returns those) is judged again on them.
#[test]
fn a_final_copy_with_other_arguments_is_judged_again() {
    let stream = String::from_utf8_lossy(&function_stream("mcp__srv", "guarded")).into_owned();
    let at = stream
        .rfind(r#"SECRET\""#)
        .expect("the final copy's arguments");
    let changed = format!(
        "{}SECRET_2{}",
        &stream[..at],
        &stream[at + "SECRET".len()..]
    );
    let out = assert_split_invariant(Dialect::OpenAiResponses, &[], changed.as_bytes());
    let values = data_values(&out);
    let completed = values
        .iter()
        .find(|v| v["type"] == "response.completed")
        .expect("completed");
    let text = completed.to_string();
    assert!(!text.contains("SECRET_2"), "{text}");
    assert!(text.contains("argument rule of the test"), "{text}");
    let (_, records) = run(Dialect::OpenAiResponses, &[], changed.as_bytes());
    assert!(
        records.iter().any(|r| r.decision.action == Action::Block),
        "{records:?}"
    );
}

/// A held call is judged on every view of its arguments the SDKs show: what its deltas build
/// (their snapshots), what `function_call_arguments.done` states, what the done item holds.
/// Any view an argument rule refuses refuses the call.
#[test]
fn every_view_of_a_held_calls_arguments_is_judged() {
    let allowed = String::from_utf8_lossy(&function_stream("mcp__srv", "guarded")).into_owned();
    let delta_only = allowed.replacen(r#""delta":"RET\"}""#, r#""delta":"RET_2\"}""#, 1);
    let stated_only = allowed.replacen(
        r#""arguments":"{\"a\":\"SECRET\"}""#,
        r#""arguments":"{\"a\":\"SECRET_2\"}""#,
        1,
    );
    for (what, stream) in [("deltas", &delta_only), (".done", &stated_only)] {
        assert_ne!(stream, &allowed, "{what}: the case changes the stream");
        let out = assert_split_invariant(Dialect::OpenAiResponses, &[], stream.as_bytes());
        let shown = String::from_utf8_lossy(&out);
        assert!(
            !shown.contains("RET_2") && !shown.contains("\"SEC"),
            "{what}: {shown}"
        );
        let (_, records) = run(Dialect::OpenAiResponses, &[], stream.as_bytes());
        assert_eq!(
            records
                .iter()
                .map(|r| r.decision.action)
                .collect::<Vec<_>>(),
            [Action::Block],
            "{what}"
        );
    }
}
