use crate::decision::Action;
use crate::llm::Dialect;
use crate::llm::testing::{assert_split_invariant, data_values, run, run_chunks, sse};

const START: &str = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"usage":{"input_tokens":10,"output_tokens":1}}}"#;

/// A message with a text block then tool_use blocks at indices 1.. with the given names.
pub(crate) fn stream(tools: &[&str]) -> Vec<u8> {
    let mut ev: Vec<(String, String)> = vec![
        ("message_start".into(), START.into()),
        (
            "content_block_start".into(),
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#
                .into(),
        ),
        (
            "content_block_delta".into(),
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me check."}}"#.into(),
        ),
        ("ping".into(), r#"{"type": "ping"}"#.into()),
        (
            "content_block_stop".into(),
            r#"{"type":"content_block_stop","index":0}"#.into(),
        ),
    ];
    for (i, name) in tools.iter().enumerate() {
        let index = i + 1;
        ev.push(("content_block_start".into(), format!(r#"{{"type":"content_block_start","index":{index},"content_block":{{"type":"tool_use","id":"toolu_{index}","name":"{name}","input":{{}}}}}}"#)));
        ev.push(("content_block_delta".into(), format!(r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"input_json_delta","partial_json":""}}}}"#)));
        ev.push(("content_block_delta".into(), format!(r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"input_json_delta","partial_json":"{{\"a\": \"SECRET_{index}"}}}}"#)));
        ev.push(("content_block_delta".into(), format!(r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"input_json_delta","partial_json":"\"}}"}}}}"#)));
        ev.push((
            "content_block_stop".into(),
            format!(r#"{{"type":"content_block_stop","index":{index}}}"#),
        ));
    }
    let stop = if tools.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    ev.push(("message_delta".into(), format!(r#"{{"type":"message_delta","delta":{{"stop_reason":"{stop}","stop_sequence":null}},"usage":{{"output_tokens":42}}}}"#)));
    ev.push(("message_stop".into(), r#"{"type":"message_stop"}"#.into()));
    let refs: Vec<(&str, &str)> = ev.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    sse(&refs)
}

fn stop_reason(values: &[serde_json::Value]) -> Option<String> {
    values
        .iter()
        .find(|v| v["type"] == "message_delta")
        .and_then(|v| v["delta"]["stop_reason"].as_str().map(str::to_owned))
}

fn tool_names(values: &[serde_json::Value]) -> Vec<String> {
    values
        .iter()
        .filter(|v| v["type"] == "content_block_start" && v["content_block"]["type"] == "tool_use")
        .filter_map(|v| v["content_block"]["name"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn state_table() {
    struct Case {
        name: &'static str,
        tools: &'static [&'static str],
        blocked: &'static [&'static str],
        want_tools: &'static [&'static str],
        want_stop: &'static str,
        want_records: &'static [(&'static str, Action)],
    }
    let cases = [
        Case {
            name: "single blocked",
            tools: &["mcp__fs__delete"],
            blocked: &["mcp__fs__delete"],
            want_tools: &[],
            want_stop: "end_turn",
            want_records: &[("mcp__fs__delete", Action::Block)],
        },
        Case {
            name: "single allowed",
            tools: &["mcp__fs__read"],
            blocked: &["mcp__fs__delete"],
            want_tools: &["mcp__fs__read"],
            want_stop: "tool_use",
            want_records: &[("mcp__fs__read", Action::Allow)],
        },
        Case {
            name: "partial",
            tools: &["mcp__fs__read", "mcp__fs__delete"],
            blocked: &["mcp__fs__delete"],
            want_tools: &["mcp__fs__read"],
            want_stop: "tool_use",
            want_records: &[
                ("mcp__fs__read", Action::Allow),
                ("mcp__fs__delete", Action::Block),
            ],
        },
        Case {
            name: "all blocked",
            tools: &["mcp__fs__delete", "mcp__everything__get-sum"],
            blocked: &["mcp__fs__delete", "mcp__everything__get-sum"],
            want_tools: &[],
            want_stop: "end_turn",
            want_records: &[
                ("mcp__fs__delete", Action::Block),
                ("mcp__everything__get-sum", Action::Block),
            ],
        },
        Case {
            name: "native tool, not recorded",
            tools: &["Bash"],
            blocked: &[],
            want_tools: &["Bash"],
            want_stop: "tool_use",
            want_records: &[],
        },
        Case {
            name: "blocked MCP and allowed native keeps tool_use",
            tools: &["Bash", "mcp__fs__delete"],
            blocked: &["mcp__fs__delete"],
            want_tools: &["Bash"],
            want_stop: "tool_use",
            want_records: &[("mcp__fs__delete", Action::Block)],
        },
    ];
    for case in cases {
        let input = stream(case.tools);
        let out = assert_split_invariant(Dialect::Anthropic, case.blocked, &input);
        let (_, records) = run(Dialect::Anthropic, case.blocked, &input);
        let values = data_values(&out);
        assert_eq!(tool_names(&values), case.want_tools, "{}", case.name);
        assert_eq!(
            stop_reason(&values).as_deref(),
            Some(case.want_stop),
            "{}",
            case.name
        );
        let got: Vec<(&str, Action)> = records
            .iter()
            .map(|r| (r.tool_name.as_str(), r.decision.action))
            .collect();
        assert_eq!(got, case.want_records, "{}", case.name);
        let text = String::from_utf8_lossy(&out);
        for (i, tool) in case.tools.iter().enumerate() {
            let secret = format!("SECRET_{}", i + 1);
            if case.blocked.contains(tool) {
                assert!(
                    !text.contains(&secret),
                    "{}: blocked args leaked",
                    case.name
                );
                assert!(
                    text.contains(&format!(
                        "[toolwall] Tool '{tool}' blocked by policy: denied by test"
                    )),
                    "{}",
                    case.name
                );
                // Replacement block is a text block at the same index, opened and closed once.
                let index = i as u64 + 1;
                let at_index: Vec<&serde_json::Value> =
                    values.iter().filter(|v| v["index"] == index).collect();
                assert_eq!(at_index.len(), 3, "{}", case.name);
                assert_eq!(at_index[0]["content_block"]["type"], "text");
                assert_eq!(at_index[2]["type"], "content_block_stop");
            } else {
                assert!(
                    text.contains(&secret),
                    "{}: allowed args missing",
                    case.name
                );
            }
        }
        if case.blocked.is_empty() || case.want_records.iter().all(|r| r.1 == Action::Allow) {
            assert_eq!(
                out, input,
                "{}: nothing blocked must be byte-identical",
                case.name
            );
        }
    }
}

#[test]
fn allowed_mcp_call_is_recorded_with_its_input() {
    let (_, records) = run(Dialect::Anthropic, &[], &stream(&["mcp__fs__read"]));
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].tool_call_id, "toolu_1");
    assert_eq!(records[0].input, Some(serde_json::json!({"a": "SECRET_1"})));
}

#[test]
fn crlf_and_cr_streams_are_inspected_too() {
    let input = stream(&["mcp__fs__delete"]);
    for ending in ["\r\n", "\r"] {
        let converted = String::from_utf8_lossy(&input).replace('\n', ending);
        let out = assert_split_invariant(
            Dialect::Anthropic,
            &["mcp__fs__delete"],
            converted.as_bytes(),
        );
        let text = String::from_utf8_lossy(&out);
        assert!(!text.contains("SECRET_1"));
        assert!(!text.contains(r#""name":"mcp__fs__delete""#));
        assert_eq!(stop_reason(&data_values(&out)).as_deref(), Some("end_turn"));
    }
}

#[test]
fn data_without_space_and_multiline_data() {
    let input = b"event: content_block_start\ndata:{\"type\":\"content_block_start\",\"index\":0,\ndata:\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"mcp__x__y\",\"input\":{}}}\n\nevent: content_block_delta\ndata:{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"SECRET\"}}\n\n";
    let out = assert_split_invariant(Dialect::Anthropic, &["mcp__x__y"], input);
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("SECRET"));
    assert!(!text.contains("\"tool_use\""));
    assert!(text.contains("blocked by policy"));
}

#[test]
fn malformed_tool_event_fails_closed_other_malformed_passes() {
    let bad_tool = b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"name\":\"mcp__x__y\"\n\n";
    let (out, _, closed) = run_chunks(Dialect::Anthropic, &[], &[bad_tool], 1 << 20);
    assert!(closed);
    let values = data_values(&out);
    assert_eq!(values.len(), 1);
    assert_eq!(values[0]["type"], "error");

    let bad_text = b"event: message_start\ndata: {\"type\":\"message_start\",\n\n";
    let (out, _, closed) = run_chunks(Dialect::Anthropic, &[], &[bad_text], 1 << 20);
    assert!(!closed);
    assert_eq!(out, bad_text);

    let mut open = crate::llm::StreamInterceptor::new(
        Dialect::Anthropic,
        crate::llm::testing::gate(&[]),
        crate::llm::OnMalformed::FailOpen,
        1 << 20,
    );
    let mut out = crate::llm::Output::default();
    // fail_open passes a malformed event only if it cannot hold a call: this one may, and the
    // backstop, which cannot read it either, ends the stream (fail_open must not let a call
    // through unread).
    assert_eq!(
        open.feed(bytes::Bytes::copy_from_slice(bad_tool), &mut out),
        crate::llm::Flow::Closed
    );
    let values = data_values(&out.take_all());
    assert_eq!(
        values.last().map(|v| v["type"].clone()),
        Some("error".into())
    );
    let mut open = crate::llm::StreamInterceptor::new(
        Dialect::Anthropic,
        crate::llm::testing::gate(&[]),
        crate::llm::OnMalformed::FailOpen,
        1 << 20,
    );
    let mut out = crate::llm::Output::default();
    assert_eq!(
        open.feed(bytes::Bytes::copy_from_slice(bad_text), &mut out),
        crate::llm::Flow::Continue
    );
    assert_eq!(out.take_all(), bad_text);
}

#[test]
fn oversized_event_ends_the_stream_cleanly() {
    let mut input = stream(&["mcp__fs__delete"]);
    // A huge delta inside the blocked block.
    let huge = format!(
        "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":1,\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}}}\n\n",
        "S".repeat(10_000)
    );
    let at = input.len() - 100;
    input.splice(at..at, huge.bytes());
    let (out, _, closed) = run_chunks(
        Dialect::Anthropic,
        &["mcp__fs__delete"],
        &input.chunks(512).collect::<Vec<_>>(),
        4096,
    );
    assert!(closed);
    let values = data_values(&out);
    assert_eq!(
        values.last().map(|v| v["type"].clone()),
        Some("error".into())
    );
    assert!(!String::from_utf8_lossy(&out).contains("SSSS"));
}

#[test]
fn unterminated_last_event_is_inspected() {
    let input = b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"mcp__x__y\",\"input\":{}}}";
    let (out, _) = run(Dialect::Anthropic, &["mcp__x__y"], input);
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("\"tool_use\""));
    assert!(text.contains("blocked by policy"));
}

#[test]
fn tool_use_without_index_fails_closed() {
    let input = b"data: {\"type\":\"content_block_start\",\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"mcp__x__y\",\"input\":{}}}\n\n";
    let (out, _, closed) = run_chunks(Dialect::Anthropic, &[], &[input], 1 << 20);
    assert!(closed);
    assert!(!String::from_utf8_lossy(&out).contains("tool_use"));
}

#[test]
fn tool_use_in_message_start_content_is_judged() {
    // SDKs start the final message from `message_start`'s `message`, content included.
    let start = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"tool_use","id":"toolu_0","name":"mcp__fs__delete","input":{"SECRET":1}}],"model":"m","stop_reason":null,"usage":{"input_tokens":10,"output_tokens":1}}}"#;
    let input = sse(&[
        ("message_start", start),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":1}}"#,
        ),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ]);
    let out = assert_split_invariant(Dialect::Anthropic, &["mcp__fs__delete"], &input);
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("SECRET"), "blocked call left: {text}");
    assert!(!text.contains("\"tool_use\""), "{text}");
    assert!(text.contains("[toolwall] Tool 'mcp__fs__delete' blocked by policy"));
    assert_eq!(stop_reason(&data_values(&out)).as_deref(), Some("end_turn"));
    let (_, records) = run(Dialect::Anthropic, &["mcp__fs__delete"], &input);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].decision.action, Action::Block);
    // Allowed: byte-identical.
    let (out, _) = run(Dialect::Anthropic, &[], &input);
    assert_eq!(out, input);
}

/// Events that hide a tool use from a literal pre-filter: a JSON unicode escape, and a
/// repeated `"type"` key after a text delta's (Python's `json`, which the SDK uses, keeps the
/// last). Both must be parsed and the call blocked.
#[test]
fn escaped_or_repeated_keys_cannot_slip_a_tool_use_past_the_hot_path() {
    let escaped = r#"{"type":"\u0063ontent_block_start","index":1,"\u0063ontent_block":{"type":"\u0074ool_use","id":"t1","name":"mcp__x__y","input":{}}}"#;
    let repeated = r#"{"type":"content_block_delta","index":1,"type":"content_block_start","content_block":{"type":"tool_use","id":"t1","name":"mcp__x__y","input":{}}}"#;
    for data in [escaped, repeated] {
        let input = sse(&[("message_start", START), ("", data)]);
        let (out, _, _) = run_chunks(Dialect::Anthropic, &["mcp__x__y"], &[&input], 1 << 20);
        let text = String::from_utf8_lossy(&out);
        assert!(
            !text.contains("mcp__x__y\",\"input"),
            "{data} passed:\n{text}"
        );
        assert!(!text.contains(data), "{data} passed unchanged:\n{text}");
    }
}

/// A tool use in an event that carries no blocks by its type (an unknown type here) is judged
/// too: a blocked one ends the stream, an allowed one passes.
#[test]
fn a_blocked_tool_use_in_an_unexpected_event_ends_the_stream() {
    let block = r#"{"type":"tool_use","id":"t1","name":"mcp__fs__delete","input":{"p":"SECRET"}}"#;
    let input = sse(&[
        ("message_start", START),
        (
            "x",
            &format!(r#"{{"type":"xcontent_block_start","index":1,"content_block":{block}}}"#),
        ),
        (
            "x",
            &format!(r#"{{"type":"message_stop","message":{{"content":[{block}]}}}}"#),
        ),
    ]);
    let out = assert_split_invariant(Dialect::Anthropic, &["mcp__fs__delete"], &input);
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("SECRET"), "{text}");
    assert!(text.contains("response stopped"), "{text}");
    // Allowed too, a `message_stop` under another SSE event name is read otherwise by the
    // SDKs (they dispatch on the name): where a tool use is concerned, the stream ends.
    let (allowed, _) = run(Dialect::Anthropic, &[], &input);
    assert!(
        String::from_utf8_lossy(&allowed).contains("under the SSE event name"),
        "{}",
        String::from_utf8_lossy(&allowed)
    );
}

/// A `content_block_delta` under the SSE event name `ping` (or none) is skipped by the SDKs,
/// so counting its input would judge arguments the client never builds. While a call is held
/// such an event ends the stream.
#[test]
fn an_input_delta_the_sdks_skip_ends_the_stream() {
    let mut events: Vec<(String, String)> = vec![
        ("message_start".into(), START.into()),
        ("content_block_start".into(), r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"mcp__fs__guarded","input":{}}}"#.into()),
        ("content_block_delta".into(), r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\":5"}}"#.into()),
    ];
    for name in ["ping", ""] {
        events.push((name.into(), r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"."}}"#.into()));
        let refs: Vec<(&str, &str)> = events
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let (out, _, closed) = run_chunks(Dialect::Anthropic, &[], &[&sse(&refs)], 1 << 20);
        let text = String::from_utf8_lossy(&out);
        assert!(
            closed || text.contains("under the SSE event name"),
            "{name:?}: {text}"
        );
        assert!(
            !text.contains("guarded"),
            "{name:?}: nothing of the held call left: {text}"
        );
        events.pop();
    }
}

/// An event with no `type` is valid JSON, not malformed: with `fail_open` too, a blocked tool
/// use in it ends the stream.
#[test]
fn a_blocked_tool_use_in_an_event_without_a_type_ends_the_stream_even_failing_open() {
    let data = r#"{"tyze":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"mcp__fs__delete","input":{"p":"SECRET"}}}"#;
    let input = sse(&[("message_start", START), ("content_block_start", data)]);
    let text =
        crate::llm::testing::run_failing_open(Dialect::Anthropic, &["mcp__fs__delete"], input);
    assert!(!text.contains("SECRET"), "{text}");
    assert!(text.contains("response stopped"), "{text}");
}

#[test]
fn a_second_message_start_does_not_unblock_a_blocked_block() {
    // The SDKs keep the first message and ignore a later message_start,
    // so the blocked block's deltas after it still belong to the replaced block.
    let block = r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"mcp__fs__delete","input":{}}}"#;
    let delta = r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"path\":\"SECRET_ARGS\"}"}}"#;
    let input = sse(&[
        ("message_start", START),
        ("content_block_start", block),
        ("message_start", START),
        ("content_block_delta", delta),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ]);
    let out = assert_split_invariant(Dialect::Anthropic, &["mcp__fs__delete"], &input);
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("SECRET_ARGS"), "{text}");
    assert!(!text.contains("\"name\":\"mcp__fs__delete\""), "{text}");
    assert!(text.contains("blocked by policy"), "{text}");
}

/// A call argument rules judge is held until its input is whole, then passed as it
/// came or replaced — at every split of the stream.
#[test]
fn a_call_argument_rules_judge_is_held_until_its_input_is_whole() {
    let input = stream(&["mcp__srv__guarded", "mcp__srv__guarded"]);
    let out = assert_split_invariant(Dialect::Anthropic, &[], &input);
    let values = data_values(&out);
    assert_eq!(
        tool_names(&values),
        vec!["mcp__srv__guarded"],
        "the second call is gone"
    );
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.contains("SECRET_1") && !text.contains("SECRET_2"),
        "{text}"
    );
    assert!(
        text.contains("argument rule of the test"),
        "the model is told why"
    );
    assert_eq!(stop_reason(&values).as_deref(), Some("tool_use"));
    let (_, records) = run(Dialect::Anthropic, &[], &input);
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].decision.action, Action::Allow);
    assert_eq!(
        records[0].input,
        Some(serde_json::json!({"a": "[toolwall:redacted]"})),
        "redacted in the record"
    );
    assert_eq!(records[1].decision.action, Action::Block);
    // Only the guarded call was held: the stream otherwise is as it came.
    let plain = stream(&["mcp__srv__guarded"]);
    assert_eq!(run(Dialect::Anthropic, &[], &plain).0, plain);
}

#[test]
fn a_held_call_past_the_buffer_or_cut_short_never_leaves() {
    let input = stream(&["mcp__srv__guarded"]);
    let (out, _, closed) = run_chunks(Dialect::Anthropic, &[], &[&input], 400);
    assert!(closed, "past the bound the stream ends");
    assert!(!String::from_utf8_lossy(&out).contains("guarded"));
    // Cut after the call's last input delta, before its stop.
    let text = String::from_utf8_lossy(&input).into_owned();
    let last_delta = text.rfind("input_json_delta").expect("a delta");
    let cut = last_delta + text[last_delta..].find("\n\n").expect("its end") + 2;
    assert!(text[cut..].starts_with("event: content_block_stop"));
    let (out, records, _) = run_chunks(Dialect::Anthropic, &[], &[&input[..cut]], 1 << 20);
    assert!(!String::from_utf8_lossy(&out).contains("guarded"));
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].decision.action, Action::Block);
}
