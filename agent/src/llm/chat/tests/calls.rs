//! Single calls and the legacy `function_call`: recording, names decided when they are final,
//! index reuse, repeated keys.

use super::*;

#[test]
fn allowed_call_recorded_with_arguments() {
    let input = chunks(&[
        &first("mcp__fs__read", 0, 0),
        &args(0, 0, "{\\\"p\\\":"),
        &args(0, 0, "2}"),
        &finish(0, "tool_calls"),
    ]);
    let (_, records) = run(Dialect::OpenAiChat, &[], &input);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].input, Some(json!({"p": 2})));
    assert_eq!(records[0].tool_call_id, "call_0");
}

#[test]
fn name_growing_into_a_blocked_one_after_arguments_is_blocked_cleanly() {
    let input = chunks(&[
        r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"mcp__fs__del","arguments":""}}]},"finish_reason":null}"#,
        r#"{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"ete","arguments":"{}"}}]},"finish_reason":null}"#,
    ]);
    let (out, records, closed) = run_chunks(
        Dialect::OpenAiChat,
        &["mcp__fs__delete"],
        &[&input],
        1 << 20,
    );
    assert!(!closed, "no cut stream");
    assert_no_blocked_call(&out, &["mcp__fs__delete"]);
    let got = assemble(&data_values(&out));
    assert!(got[0].1.is_empty(), "{got:?}");
    assert!(got[0].0.contains("Tool 'mcp__fs__delete' blocked"));
    assert_eq!(records.len(), 1);
}

#[test]
fn held_name_at_end_of_stream_is_decided() {
    let body = format!(
        "data: {{{HEAD},\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":0,\"id\":\"c\",\"type\":\"function\",\"function\":{{\"name\":\"mcp__fs__read\"}}}}]}},\"finish_reason\":null}}]}}\n\n"
    );
    let (out, records) = run(Dialect::OpenAiChat, &[], body.as_bytes());
    let got = assemble(&data_values(&out));
    assert_eq!(got[0].1, vec![("mcp__fs__read".to_owned(), String::new())]);
    assert_eq!(records.len(), 1);
    let (out, _) = run(Dialect::OpenAiChat, &["mcp__fs__read"], body.as_bytes());
    let got = assemble(&data_values(&out));
    assert!(got[0].1.is_empty());
    assert!(got[0].0.contains("blocked by policy"));
}

#[test]
fn legacy_function_call_blocked_ends_the_stream() {
    let input = chunks(&[
        r#"{"index":0,"delta":{"role":"assistant","content":null,"function_call":{"name":"mcp__fs__delete","arguments":""}},"finish_reason":null}"#,
        r#"{"index":0,"delta":{"function_call":{"arguments":"{\"SECRET\":1}"}},"finish_reason":null}"#,
    ]);
    let (out, records, closed) = run_chunks(
        Dialect::OpenAiChat,
        &["mcp__fs__delete"],
        &[&input],
        1 << 20,
    );
    assert!(closed);
    assert!(!String::from_utf8_lossy(&out).contains("SECRET"));
    assert!(!String::from_utf8_lossy(&out).contains("\"function_call\""));
    assert_eq!(records.len(), 1);
    let (out, _) = run(Dialect::OpenAiChat, &[], &input);
    assert_eq!(out, input);
}

#[test]
fn a_blocked_call_reusing_an_allowed_calls_index_never_gets_through() {
    // Index left out (defaults to 0) or repeated, as Gemini's OpenAI-compatible API sends.
    for second in [
        r#"{"index":0,"delta":{"tool_calls":[{"id":"c2","type":"function","function":{"name":"mcp__srv__delete_all","arguments":"{}"}}]},"finish_reason":null}"#,
        r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c2","type":"function","function":{"name":"mcp__srv__delete_all","arguments":"{}"}}]},"finish_reason":null}"#,
    ] {
        let input = chunks(&[
            r#"{"index":0,"delta":{"tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":"{}"}}]},"finish_reason":null}"#,
            second,
        ]);
        let (out, records, closed) = run_chunks(
            Dialect::OpenAiChat,
            &["mcp__srv__delete_all"],
            &[&input],
            1 << 20,
        );
        // TypeScript keeps the last name fragment: the call is the blocked one there, so it
        // is blocked, cleanly (held until the stream ended, as its name could still change).
        assert!(!closed, "no cut stream");
        let text = String::from_utf8_lossy(&out);
        assert!(
            !text.contains("delete_all\""),
            "the blocked name never leaves: {text}"
        );
        assert!(text.contains("blocked by policy"), "{text}");
        assert_no_blocked_call(&out, &["mcp__srv__delete_all"]);
        assert_eq!(records.len(), 1);
    }
}

#[test]
fn a_held_name_replaced_by_a_blocked_fragment_is_blocked() {
    // A name held back in pieces, then a fragment with arguments: appended, the name is
    // `xmcp__srv__delete_all` (not MCP, allowed); a client that replaces names instead keeps
    // `mcp__srv__delete_all`, which must not reach it.
    let input = chunks(&[
        r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"x"}}]},"finish_reason":null}"#,
        r#"{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"mcp__srv__delete_all","arguments":"{}"}}]},"finish_reason":null}"#,
        &finish(0, "tool_calls"),
    ]);
    let out = assert_split_invariant(Dialect::OpenAiChat, &["mcp__srv__delete_all"], &input);
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("delete_all\""), "blocked name left: {text}");
    let got = assemble(&data_values(&out));
    assert!(got[0].1.is_empty(), "{got:?}");
    assert!(got[0].0.contains("blocked by policy"));
    assert_eq!(got[0].2.as_deref(), Some("stop"));
}

#[test]
fn legacy_function_call_names_are_kept_per_choice() {
    // Two choices (`n: 2`) interleave their name fragments: choice 0 names the blocked
    // `mcp__fs__delete`, choice 1 a harmless tool. Mixed into one buffer neither is seen.
    let input = chunks(&[
        r#"{"index":0,"delta":{"role":"assistant","content":null,"function_call":{"name":"mcp__fs__","arguments":""}},"finish_reason":null}"#,
        r#"{"index":1,"delta":{"role":"assistant","content":null,"function_call":{"name":"get_","arguments":""}},"finish_reason":null}"#,
        r#"{"index":0,"delta":{"function_call":{"name":"delete"}},"finish_reason":null}"#,
        r#"{"index":1,"delta":{"function_call":{"name":"time"}},"finish_reason":null}"#,
        r#"{"index":0,"delta":{"function_call":{"arguments":"{\"SECRET\":1}"}},"finish_reason":null}"#,
    ]);
    let (out, records, closed) = run_chunks(
        Dialect::OpenAiChat,
        &["mcp__fs__delete"],
        &[&input],
        1 << 20,
    );
    assert!(closed, "the blocked choice ends the stream");
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("SECRET"), "{text}");
    assert!(!text.contains("\"delete\""), "{text}");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].tool_name, "mcp__fs__delete");
    // A harmless name made of two choices' fragments is not blocked by the mix.
    let input = chunks(&[
        r#"{"index":0,"delta":{"function_call":{"name":"mcp__fs__","arguments":""}},"finish_reason":null}"#,
        r#"{"index":1,"delta":{"function_call":{"name":"delete","arguments":""}},"finish_reason":null}"#,
    ]);
    let (out, _) = run(Dialect::OpenAiChat, &["mcp__fs__delete"], &input);
    assert_eq!(out, input);
}

/// A choice that repeats its `"delta"` key (Python's json keeps the last one, which holds a
/// blocked call) is valid JSON our reading refuses: it ends the stream even with `fail_open`.
#[test]
fn a_repeated_key_hiding_a_call_ends_the_stream_even_failing_open() {
    let input = chunks(&[
        r#"{"index":0,"delta":{},"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"mcp__fs__delete","arguments":"SECRET"}}]},"finish_reason":null}"#,
    ]);
    let text =
        crate::llm::testing::run_failing_open(Dialect::OpenAiChat, &["mcp__fs__delete"], input);
    assert!(!text.contains("SECRET"), "{text}");
    assert!(text.contains("toolwall_blocked"), "{text}");
}

/// The calls of a choice are held until it finishes; then a call argument rules
/// judge is decided on its whole arguments — one of two calls of the same tool refused, the
/// other kept (renumbered), at every split.
#[test]
fn argument_rules_judge_a_finished_choices_calls_on_their_whole_arguments() {
    let input = chunks(&[
        ROLE,
        &first("mcp__fs__guarded", 0, 0),
        &args(0, 0, "{\\\"a\\\":\\\"SECRET_"),
        &args(0, 0, "2\\\"}"),
        &first("mcp__fs__guarded", 1, 0),
        &args(1, 0, "{\\\"a\\\":\\\"SECRET_1\\\"}"),
        &finish(0, "tool_calls"),
    ]);
    let out = assert_split_invariant(Dialect::OpenAiChat, &[], &input);
    let got = assemble(&data_values(&out));
    assert_eq!(
        got[0].1,
        vec![(
            "mcp__fs__guarded".to_owned(),
            r#"{"a":"SECRET_1"}"#.to_owned()
        )],
        "{got:?}"
    );
    assert!(got[0].0.contains("argument rule of the test"), "{got:?}");
    assert!(
        !String::from_utf8_lossy(&out).contains("SECRET_\""),
        "the refused call's fragments never leave"
    );
    let (_, records) = run(Dialect::OpenAiChat, &[], &input);
    let actions: Vec<Action> = records.iter().map(|r| r.decision.action).collect();
    assert_eq!(actions, [Action::Block, Action::Allow], "{records:?}");
    assert_eq!(records[1].input, Some(json!({"a": "[toolwall:redacted]"})));
}

/// Arguments for a kept call after its choice finished, and a legacy `function_call` of a tool
/// argument rules judge, end the stream (no one would judge them).
#[test]
fn arguments_after_the_finish_and_legacy_calls_of_judged_tools_end_the_stream() {
    let late = chunks(&[
        ROLE,
        &first("mcp__fs__guarded", 0, 0),
        &finish(0, "tool_calls"),
        &args(0, 0, "{\\\"a\\\":\\\"SECRET_2\\\"}"),
    ]);
    let (out, _, closed) = run_chunks(Dialect::OpenAiChat, &[], &[&late], 1 << 20);
    let text = String::from_utf8_lossy(&out);
    assert!(closed, "{text}");
    assert!(!text.contains("SECRET_2"), "{text}");
    let legacy = chunks(&[
        r#"{"index":0,"delta":{"role":"assistant","function_call":{"name":"mcp__fs__guarded","arguments":""}},"finish_reason":null}"#,
        r#"{"index":0,"delta":{"function_call":{"arguments":"{\"a\":\"SECRET_2\"}"}},"finish_reason":null}"#,
        &finish(0, "function_call"),
    ]);
    let (out, records, closed) = run_chunks(Dialect::OpenAiChat, &[], &[&legacy], 1 << 20);
    assert!(closed);
    assert!(!String::from_utf8_lossy(&out).contains("SECRET_2"));
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].decision.action, Action::Block);
}
