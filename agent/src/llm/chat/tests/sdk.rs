//! What the official SDKs' accumulators build from toolwall's output: dense renumbering, both
//! name views, names shown at `arguments.done`, entries after a choice finished.

use super::*;

/// Upstream indices are list positions to the SDKs, so index 0, 2, 2 (a new id), 1
/// builds `ec` + `ho` = `echo` at position 1 when passed as they came. toolwall renumbers
/// densely, so what the SDKs build is exactly what it judged.
#[test]
fn index_aliasing_never_builds_an_unjudged_name() {
    let input = chunks(&[
        ROLE,
        &entry(0, Some("c0"), Some("read_file"), Some("")),
        &entry(2, Some("c2"), Some("ec"), Some("")),
        &entry(2, Some("c3"), None, Some("{}")),
        &entry(1, Some("c1"), Some("ho"), Some("{}")),
        &finish(0, "tool_calls"),
    ]);
    let out = assert_split_invariant(Dialect::OpenAiChat, &["echo"], &input);
    let calls = assert_no_blocked_call(&out, &["echo"]);
    let names: Vec<&str> = calls[0].iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, ["read_file", "ec", "ho"]);
    // A name that only the aliasing builds is blocked wherever its pieces come from.
    let input = chunks(&[
        &entry(0, Some("c0"), Some("ec"), Some("")),
        &entry(0, Some("c1"), Some("ho"), Some("{}")),
        &finish(0, "tool_calls"),
    ]);
    let out = assert_split_invariant(Dialect::OpenAiChat, &["echo"], &input);
    let calls = assert_no_blocked_call(&out, &["echo"]);
    assert!(calls.first().is_none_or(Vec::is_empty), "{calls:?}");
    let got = assemble(&data_values(&out));
    assert!(got[0].0.contains("Tool 'echo' blocked"), "{got:?}");
    assert_eq!(got[0].2.as_deref(), Some("stop"));
}

/// Python appends name fragments (`echo` twice is `echoecho`), TypeScript keeps the last one
/// (`x` then `echo` is `echo`): a call passes only if both names are allowed.
#[test]
fn both_sdk_name_views_are_judged() {
    for (blocked, first_name, second_name) in [
        ("echo", "x", "echo"),
        ("echoecho", "echo", "echo"),
        ("echo", "ec", "ho"),
    ] {
        let input = chunks(&[
            &entry(0, Some("c0"), Some(first_name), Some("")),
            &entry(0, None, Some(second_name), Some("{\\\"SECRET\\\":1}")),
            &finish(0, "tool_calls"),
        ]);
        let out = assert_split_invariant(Dialect::OpenAiChat, &[blocked], &input);
        let text = String::from_utf8_lossy(&out);
        assert!(!text.contains("SECRET"), "{blocked}: {text}");
        let calls = assert_no_blocked_call(&out, &[blocked]);
        assert!(calls.first().is_none_or(Vec::is_empty), "{calls:?}");
        let got = assemble(&data_values(&out));
        assert!(got[0].0.contains("blocked by policy"), "{got:?}");
        assert_eq!(got[0].2.as_deref(), Some("stop"));
        let (_, records) = run(Dialect::OpenAiChat, &[blocked], &input);
        assert_eq!(records.len(), 1, "{blocked}");
        assert_eq!(records[0].decision.action, Action::Block);
    }
}

/// Compatibility: a blocked call at index 0 and an allowed one at index 1 must reach the SDKs
/// as one call at index 0 in every chunk (both helpers crash on a gap).
#[test]
fn kept_calls_are_renumbered_densely() {
    let input = chunks(&[
        ROLE,
        &first("mcp__fs__delete", 0, 0),
        &first("mcp__fs__read", 1, 0),
        &args(0, 0, "{\\\"SECRET\\\":1}"),
        &args(1, 0, "{\\\"a\\\":"),
        &args(1, 0, "1}"),
        &finish(0, "tool_calls"),
    ]);
    let out = assert_split_invariant(Dialect::OpenAiChat, &["mcp__fs__delete"], &input);
    assert!(!String::from_utf8_lossy(&out).contains("SECRET"));
    let calls = assert_no_blocked_call(&out, &["mcp__fs__delete"]);
    assert_eq!(
        calls[0],
        vec![(
            "mcp__fs__read".to_owned(),
            "mcp__fs__read".to_owned(),
            r#"{"a":1}"#.to_owned()
        )]
    );
    let got = assemble(&data_values(&out));
    assert!(got[0].0.contains("mcp__fs__delete' blocked"));
    assert_eq!(got[0].2.as_deref(), Some("tool_calls"));
    // Upstream gaps with nothing blocked are closed too; a dense allowed stream is untouched.
    let gappy = chunks(&[
        &first("mcp__fs__read", 3, 0),
        &first("mcp__fs__list", 7, 0),
        &args(3, 0, "{}"),
        &args(7, 0, "{}"),
        &finish(0, "tool_calls"),
    ]);
    let out = assert_split_invariant(Dialect::OpenAiChat, &[], &gappy);
    let calls = assert_no_blocked_call(&out, &[]);
    let names: Vec<&str> = calls[0].iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, ["mcp__fs__read", "mcp__fs__list"]);
    let dense = chunks(&[
        &first("mcp__fs__read", 0, 0),
        &first("mcp__fs__list", 1, 0),
        &args(0, 0, "{}"),
        &args(1, 0, "{}"),
        &finish(0, "tool_calls"),
    ]);
    let (out, _) = run(Dialect::OpenAiChat, &[], &dense);
    assert_eq!(out, dense);
}

/// A name that grows after its first piece carried `"arguments":""` is judged whole: the
/// client gets the block text, not a cut stream, with or without a `finish_reason`.
#[test]
fn a_name_growing_after_arguments_gets_the_block_text() {
    for with_finish in [true, false] {
        let mut choices = vec![
            ROLE.to_owned(),
            entry(0, Some("c"), Some("mcp__fs__del"), Some("")),
            entry(0, None, Some("ete"), Some("{\\\"SECRET\\\":1}")),
        ];
        if with_finish {
            choices.push(finish(0, "tool_calls"));
        }
        let refs: Vec<&str> = choices.iter().map(String::as_str).collect();
        let input = chunks(&refs);
        let (out, records, closed) = run_chunks(
            Dialect::OpenAiChat,
            &["mcp__fs__delete"],
            &[&input],
            1 << 20,
        );
        assert!(!closed, "never a cut stream");
        assert_split_invariant(Dialect::OpenAiChat, &["mcp__fs__delete"], &input);
        let text = String::from_utf8_lossy(&out);
        assert!(!text.contains("SECRET"), "{text}");
        assert!(!text.contains("mcp__fs__del\""), "no partial call: {text}");
        assert_no_blocked_call(&out, &["mcp__fs__delete"]);
        let got = assemble(&data_values(&out));
        assert!(
            got[0].0.contains("Tool 'mcp__fs__delete' blocked"),
            "{got:?}"
        );
        if with_finish {
            assert_eq!(got[0].2.as_deref(), Some("stop"));
        }
        assert_eq!(records.len(), 1);
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    }
}

/// Held names are bounded by the buffer limit: 1 MiB name pieces without arguments end the
/// stream cleanly once more than the limit is held.
#[test]
fn held_names_are_bounded() {
    let piece = "a".repeat(1 << 20);
    let mut input = Vec::new();
    let one = format!(
        "data: {{{HEAD},\"choices\":[{}]}}\n\n",
        entry(0, Some("c"), Some(&piece), None)
    );
    for _ in 0..16 {
        input.extend_from_slice(one.as_bytes());
    }
    let reads: Vec<&[u8]> = input.chunks(64 * 1024).collect();
    let (out, _, closed) = run_chunks(Dialect::OpenAiChat, &[], &reads, 4 << 20);
    assert!(closed, "the stream is ended");
    assert!(out.len() < 4096, "nothing held leaves: {} bytes", out.len());
    let values = data_values(&out);
    assert!(values.last().is_some_and(|v| v.get("error").is_some()));
}

/// The SDKs' `tool_calls.function.arguments.done` event names a call as accumulated when the
/// stream switches to another index: a blocked name shown there is blocked even if later
/// fragments make the final name an allowed one.
#[test]
fn names_shown_when_the_sdks_switch_calls_are_judged() {
    let input = chunks(&[
        &entry(
            0,
            Some("c0"),
            Some("mcp__fs__delete"),
            Some("{\\\"SECRET\\\":1}"),
        ),
        &entry(1, Some("c1"), Some("mcp__fs__read"), Some("{}")),
        &entry(0, None, Some("_safe"), None),
        &finish(0, "tool_calls"),
    ]);
    let out = assert_split_invariant(Dialect::OpenAiChat, &["mcp__fs__delete"], &input);
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("SECRET"), "{text}");
    let calls = assert_no_blocked_call(&out, &["mcp__fs__delete"]);
    let names: Vec<&str> = calls[0].iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, ["mcp__fs__read"]);
    // Fragments of one name with no switch between them are judged whole only.
    let input = chunks(&[
        &entry(0, Some("c0"), Some("mcp__fs__delete"), None),
        &entry(0, None, Some("_safe"), Some("{}")),
        &finish(0, "tool_calls"),
    ]);
    let (out, _) = run(Dialect::OpenAiChat, &["mcp__fs__delete"], &input);
    assert_eq!(out, input);
}

/// After its choice finished, a blocked call's entries are dropped; arguments for an allowed
/// call, a new call or a new name there end the stream (arguments then would be judged by no
/// one).
#[test]
fn entries_after_finish() {
    let base = [
        first("mcp__fs__delete", 0, 0),
        first("mcp__fs__read", 1, 0),
        finish(0, "tool_calls"),
    ];
    let mut late = base.to_vec();
    late.push(args(0, 0, "SECRET"));
    let refs: Vec<&str> = late.iter().map(String::as_str).collect();
    let input = chunks(&refs);
    let out = assert_split_invariant(Dialect::OpenAiChat, &["mcp__fs__delete"], &input);
    assert!(!String::from_utf8_lossy(&out).contains("SECRET"));
    let calls = assert_no_blocked_call(&out, &["mcp__fs__delete"]);
    assert_eq!(calls[0].len(), 1);
    assert_eq!(calls[0][0].2, "");
    for bad in [
        args(1, 0, "{}"),
        entry(1, None, Some("x"), None),
        entry(2, Some("c2"), Some("mcp__fs__read"), Some("{}")),
    ] {
        let mut late = base.to_vec();
        late.push(bad);
        let refs: Vec<&str> = late.iter().map(String::as_str).collect();
        let (_, _, closed) = run_chunks(
            Dialect::OpenAiChat,
            &["mcp__fs__delete"],
            &[&chunks(&refs)],
            1 << 20,
        );
        assert!(closed);
    }
}

#[test]
fn tool_calls_in_a_choice_before_its_lower_indices_end_the_stream() {
    // Python's accumulator files an unseen choice index past its list's end at the end, so
    // choice 2 then choice 1 name one entry: "ec" + "ho".
    let input = chunks(&[
        r#"{"index":2,"delta":{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"ec","arguments":""}}]},"finish_reason":null}"#,
        r#"{"index":1,"delta":{"tool_calls":[{"index":0,"function":{"name":"ho","arguments":"{}"}}]},"finish_reason":null}"#,
    ]);
    let (_, _, closed) = run_chunks(Dialect::OpenAiChat, &["echo"], &[&input], 1 << 20);
    assert!(closed, "ended, fail closed");
    // Choices in order pass.
    let input = chunks(&[
        r#"{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}"#,
        r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"mcp__fs__read","arguments":"{}"}}]},"finish_reason":null}"#,
        r#"{"index":0,"delta":{},"finish_reason":"tool_calls"}"#,
    ]);
    let (out, _, closed) = run_chunks(Dialect::OpenAiChat, &["echo"], &[&input], 1 << 20);
    assert!(!closed);
    assert_eq!(out, input);
}
