//! The state table: what the SDKs assemble from each case's output, case by case.

use super::*;

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
