use serde_json::{Value, json};

/// Per choice: content, (tool name, arguments) in index order, finish reason.
type Assembled = Vec<(String, Vec<(String, String)>, Option<String>)>;
/// A case's expectation: content, calls, finish reason.
type Want = Vec<(
    &'static str,
    Vec<(&'static str, &'static str)>,
    &'static str,
)>;
/// Calls by tool index while assembling.
type Slots = Vec<(String, Vec<(u64, String, String)>, Option<String>)>;

use crate::decision::Action;
use crate::llm::Dialect;
use crate::llm::testing::{assert_split_invariant, data_values, run, run_chunks};

const HEAD: &str =
    r#""id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o""#;

/// One chunk per `choices` JSON.
pub(crate) fn chunks(choices: &[&str]) -> Vec<u8> {
    let mut out = String::new();
    for c in choices {
        out.push_str(&format!("data: {{{HEAD},\"choices\":[{c}]}}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

fn first(name: &str, index: u64, choice: u64) -> String {
    format!(
        r#"{{"index":{choice},"delta":{{"tool_calls":[{{"index":{index},"id":"call_{index}","type":"function","function":{{"name":"{name}","arguments":""}}}}]}},"finish_reason":null}}"#
    )
}

fn args(index: u64, choice: u64, text: &str) -> String {
    format!(
        r#"{{"index":{choice},"delta":{{"tool_calls":[{{"index":{index},"function":{{"arguments":"{text}"}}}}]}},"finish_reason":null}}"#
    )
}

fn finish(choice: u64, reason: &str) -> String {
    format!(r#"{{"index":{choice},"delta":{{}},"finish_reason":"{reason}"}}"#)
}

const ROLE: &str =
    r#"{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}"#;

/// What an SDK would assemble per choice: (content, tool name → arguments, finish reason).
fn assemble(values: &[Value]) -> Assembled {
    let mut out: Slots = Vec::new();
    for v in values {
        assert!(v.get("error").is_none(), "unexpected error chunk {v}");
        for c in v["choices"].as_array().expect("choices") {
            let ci = c["index"].as_u64().expect("index") as usize;
            while out.len() <= ci {
                out.push((String::new(), Vec::new(), None));
            }
            let slot = &mut out[ci];
            if let Some(t) = c["delta"]["content"].as_str() {
                slot.0.push_str(t);
            }
            for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let ti = tc["index"].as_u64().expect("tool index");
                let pos = match slot.1.iter().position(|t| t.0 == ti) {
                    Some(p) => p,
                    None => {
                        slot.1.push((ti, String::new(), String::new()));
                        slot.1.len() - 1
                    }
                };
                if let Some(n) = tc["function"]["name"].as_str() {
                    slot.1[pos].1.push_str(n);
                }
                if let Some(a) = tc["function"]["arguments"].as_str() {
                    slot.1[pos].2.push_str(a);
                }
            }
            if let Some(f) = c["finish_reason"].as_str() {
                slot.2 = Some(f.to_owned());
            }
        }
    }
    out.into_iter()
        .map(|(c, t, f)| (c, t.into_iter().map(|(_, n, a)| (n, a)).collect(), f))
        .collect()
}

#[test]
fn state_table() {
    struct Case {
        name: &'static str,
        choices: Vec<String>,
        blocked: &'static [&'static str],
        want: Want,
        identical: bool,
        records: Vec<(&'static str, Action)>,
    }
    let cases = vec![
        Case {
            name: "single blocked",
            choices: vec![
                ROLE.into(),
                first("mcp__fs__delete", 0, 0),
                args(0, 0, "{\\\"p\\\":\\\"SECRET\\\"}"),
                finish(0, "tool_calls"),
            ],
            blocked: &["mcp__fs__delete"],
            want: vec![(
                "[toolwall] Tool 'mcp__fs__delete' blocked by policy: denied by test",
                vec![],
                "stop",
            )],
            identical: false,
            records: vec![("mcp__fs__delete", Action::Block)],
        },
        Case {
            name: "single allowed, byte-identical",
            choices: vec![
                ROLE.into(),
                first("mcp__fs__read", 0, 0),
                args(0, 0, "{\\\"p\\\":\\\"x\\\"}"),
                finish(0, "tool_calls"),
            ],
            blocked: &["mcp__fs__delete"],
            want: vec![("", vec![("mcp__fs__read", r#"{"p":"x"}"#)], "tool_calls")],
            identical: true,
            records: vec![("mcp__fs__read", Action::Allow)],
        },
        Case {
            name: "partial, interleaved parallel indices",
            choices: vec![
                ROLE.into(),
                first("mcp__fs__read", 0, 0),
                first("mcp__fs__delete", 1, 0),
                args(1, 0, "{\\\"SECRET\\\":1"),
                args(0, 0, "{\\\"a\\\":"),
                args(1, 0, "}"),
                args(0, 0, "1}"),
                finish(0, "tool_calls"),
            ],
            blocked: &["mcp__fs__delete"],
            want: vec![(
                "[toolwall] Tool 'mcp__fs__delete' blocked by policy: denied by test",
                vec![("mcp__fs__read", r#"{"a":1}"#)],
                "tool_calls",
            )],
            identical: false,
            records: vec![
                ("mcp__fs__delete", Action::Block),
                ("mcp__fs__read", Action::Allow),
            ],
        },
        Case {
            name: "name split over chunks, blocked",
            choices: vec![
                ROLE.into(),
                r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"mcp__fs__"}}]},"finish_reason":null}"#.into(),
                r#"{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"delete"}}]},"finish_reason":null}"#.into(),
                args(0, 0, "{\\\"SECRET\\\":1}"),
                finish(0, "tool_calls"),
            ],
            blocked: &["mcp__fs__delete"],
            want: vec![(
                "[toolwall] Tool 'mcp__fs__delete' blocked by policy: denied by test",
                vec![],
                "stop",
            )],
            identical: false,
            records: vec![("mcp__fs__delete", Action::Block)],
        },
        Case {
            name: "name split over chunks, allowed, re-emitted",
            choices: vec![
                ROLE.into(),
                r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"mcp__fs__"}}]},"finish_reason":null}"#.into(),
                r#"{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"read"}}]},"finish_reason":null}"#.into(),
                args(0, 0, "{}"),
                finish(0, "tool_calls"),
            ],
            blocked: &["mcp__fs__delete"],
            want: vec![("", vec![("mcp__fs__read", "{}")], "tool_calls")],
            identical: false,
            records: vec![("mcp__fs__read", Action::Allow)],
        },
        Case {
            name: "name in the same chunk as finish_reason",
            choices: vec![
                ROLE.into(),
                r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"mcp__fs__delete"}}]},"finish_reason":"tool_calls"}"#.into(),
            ],
            blocked: &["mcp__fs__delete"],
            want: vec![(
                "[toolwall] Tool 'mcp__fs__delete' blocked by policy: denied by test",
                vec![],
                "stop",
            )],
            identical: false,
            records: vec![("mcp__fs__delete", Action::Block)],
        },
        Case {
            name: "forced call with finish_reason stop is still looked at",
            choices: vec![
                ROLE.into(),
                first("mcp__fs__delete", 0, 0),
                args(0, 0, "{\\\"SECRET\\\":1}"),
                finish(0, "stop"),
            ],
            blocked: &["mcp__fs__delete"],
            want: vec![(
                "[toolwall] Tool 'mcp__fs__delete' blocked by policy: denied by test",
                vec![],
                "stop",
            )],
            identical: false,
            records: vec![("mcp__fs__delete", Action::Block)],
        },
        Case {
            name: "several choices",
            choices: vec![
                format!(
                    "{},{}",
                    first("mcp__fs__delete", 0, 0),
                    first("mcp__fs__read", 0, 1)
                ),
                format!("{},{}", args(0, 0, "{\\\"SECRET\\\":1}"), args(0, 1, "{}")),
                format!("{},{}", finish(0, "tool_calls"), finish(1, "tool_calls")),
            ],
            blocked: &["mcp__fs__delete"],
            want: vec![
                (
                    "[toolwall] Tool 'mcp__fs__delete' blocked by policy: denied by test",
                    vec![],
                    "stop",
                ),
                ("", vec![("mcp__fs__read", "{}")], "tool_calls"),
            ],
            identical: false,
            records: vec![
                ("mcp__fs__delete", Action::Block),
                ("mcp__fs__read", Action::Allow),
            ],
        },
        Case {
            name: "text only",
            choices: vec![
                ROLE.into(),
                r#"{"index":0,"delta":{"content":"hello \"tool_calls\""},"finish_reason":null}"#
                    .into(),
                finish(0, "stop"),
            ],
            blocked: &["mcp__fs__delete"],
            want: vec![("hello \"tool_calls\"", vec![], "stop")],
            identical: true,
            records: vec![],
        },
    ];
    for case in cases {
        let refs: Vec<&str> = case.choices.iter().map(String::as_str).collect();
        let input = chunks(&refs);
        let out = assert_split_invariant(Dialect::OpenAiChat, case.blocked, &input);
        let got = assemble(&data_values(&out));
        let want: Assembled = case
            .want
            .iter()
            .map(|(c, t, f)| {
                (
                    (*c).to_owned(),
                    t.iter()
                        .map(|(n, a)| ((*n).to_owned(), (*a).to_owned()))
                        .collect(),
                    Some((*f).to_owned()),
                )
            })
            .collect();
        assert_eq!(got, want, "{}", case.name);
        let text = String::from_utf8_lossy(&out);
        assert!(
            !text.contains("SECRET"),
            "{}: blocked arguments leaked",
            case.name
        );
        if case.identical {
            assert_eq!(out, input, "{}: must be byte-identical", case.name);
        }
        let (_, records) = run(Dialect::OpenAiChat, case.blocked, &input);
        let got: Vec<(&str, Action)> = records
            .iter()
            .map(|r| (r.tool_name.as_str(), r.decision.action))
            .collect();
        assert_eq!(got, case.records, "{}", case.name);
    }
}

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

/// The calls of each choice as the official SDKs' stream accumulators build them from `values`
/// (what toolwall sent): (Python name, TypeScript name, arguments) by list position. Python
/// `openai` 2.x appends name fragments; TypeScript `openai` 6.x keeps the last non-empty one.
/// Both take `index` as a list position, and both helpers crash on an index past the end of
/// the list (Python `IndexError`, TypeScript reading `id` of `undefined`): asserted here.
fn sdk_calls(values: &[Value]) -> Vec<Vec<(String, String, String)>> {
    let mut out: Vec<Vec<(String, String, String)>> = Vec::new();
    for v in values {
        assert!(v.get("error").is_none(), "unexpected error chunk {v}");
        for c in v["choices"].as_array().into_iter().flatten() {
            let ci = c["index"].as_u64().expect("index") as usize;
            while out.len() <= ci {
                out.push(Vec::new());
            }
            let calls = &mut out[ci];
            for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let ti = tc["index"].as_u64().expect("tool index") as usize;
                assert!(
                    ti <= calls.len(),
                    "index {ti} past the end of {} calls: the SDK helpers crash",
                    calls.len()
                );
                if ti == calls.len() {
                    calls.push(Default::default());
                }
                let call = &mut calls[ti];
                if let Some(n) = tc["function"]["name"].as_str() {
                    call.0.push_str(n);
                    if !n.is_empty() {
                        call.1 = n.to_owned();
                    }
                }
                if let Some(a) = tc["function"]["arguments"].as_str() {
                    call.2.push_str(a);
                }
            }
        }
    }
    out
}

/// Asserts that no SDK view of `out` calls one of `blocked`, and that it never ends in an error.
fn assert_no_blocked_call(out: &[u8], blocked: &[&str]) -> Vec<Vec<(String, String, String)>> {
    let calls = sdk_calls(&data_values(out));
    for (py, ts, _) in calls.iter().flatten() {
        assert!(!blocked.contains(&py.as_str()), "Python builds {py}");
        assert!(!blocked.contains(&ts.as_str()), "TypeScript builds {ts}");
    }
    calls
}

fn entry(index: u64, id: Option<&str>, name: Option<&str>, args: Option<&str>) -> String {
    let id = id.map_or(String::new(), |i| {
        format!(r#""id":"{i}","type":"function","#)
    });
    let mut f = Vec::new();
    if let Some(n) = name {
        f.push(format!(r#""name":"{n}""#));
    }
    if let Some(a) = args {
        f.push(format!(r#""arguments":"{a}""#));
    }
    format!(
        r#"{{"index":0,"delta":{{"tool_calls":[{{"index":{index},{id}"function":{{{}}}}}]}},"finish_reason":null}}"#,
        f.join(",")
    )
}

/// Class 4: upstream indices are list positions to the SDKs, so index 0, 2, 2 (a new id), 1
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

/// After its choice finished, a blocked call's entries are dropped and an allowed call's
/// arguments pass; a new call or a new name there ends the stream.
#[test]
fn entries_after_finish() {
    let base = [
        first("mcp__fs__delete", 0, 0),
        first("mcp__fs__read", 1, 0),
        finish(0, "tool_calls"),
    ];
    let mut late = base.to_vec();
    late.push(args(0, 0, "SECRET"));
    late.push(args(1, 0, "{}"));
    let refs: Vec<&str> = late.iter().map(String::as_str).collect();
    let input = chunks(&refs);
    let out = assert_split_invariant(Dialect::OpenAiChat, &["mcp__fs__delete"], &input);
    assert!(!String::from_utf8_lossy(&out).contains("SECRET"));
    let calls = assert_no_blocked_call(&out, &["mcp__fs__delete"]);
    assert_eq!(calls[0].len(), 1);
    assert_eq!(calls[0][0].2, "{}");
    for bad in [
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
    // choice 2 then choice 1 name one entry: "ec" + "ho" (found by an attack session).
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
