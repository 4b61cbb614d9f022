use super::*;
use crate::decision::Action;
use crate::mcp::enforce::Enforcement;
use crate::mcp::framing::{LineFramer, strip_newline};

mod lists;
mod results;

fn ctx(deny: &[&str], events: Option<EventSink>) -> FilterContext {
    let deny: Vec<String> = deny.iter().map(|s| s.to_string()).collect();
    FilterContext {
        gate: Enforcement::new(None, None, &deny)
            .expect("valid patterns")
            .gate,
        server_id: "srv".into(),
        server_type: "stdio".into(),
        layer: "shim",
        session_id: "sess".into(),
        events,
        approvals: None,
    }
}

fn filter(deny: &[&str]) -> Filter {
    Filter::new(ctx(deny, None))
}

/// A first page of `echo`, `add` and `echo_twice`, with a cursor to the next.
const PAGE1: &[u8] = br#"{"jsonrpc":"2.0","id":5,"result":{"tools":[{"name":"echo","description":"Echoes"},{"name":"add","inputSchema":{"type":"object"}},{"name":"echo_twice"}],"nextCursor":"c2"}}"#;

fn is_borrowed_same(out: &Outcome<'_>, msg: &[u8]) -> bool {
    matches!(&out.forward, Some(Cow::Borrowed(b)) if b.as_ptr() == msg.as_ptr() && b.len() == msg.len())
}

#[test]
fn untouched_messages_are_the_same_bytes() {
    let mut f = filter(&["^echo$"]);
    for msg in [
        &br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#[..],
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        br#"{"jsonrpc":"2.0","id":"x","method":"resources/read","params":{"uri":"test://static/resource/1"}}"#,
        br#"  {"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":2}}}  "#,
    ] {
        // Client messages are forwarded as toolwall's own canonical text (here: the same
        // without the blanks around it), never as the client's bytes.
        let out = f.on_client(msg);
        assert_eq!(
            out.forward.as_deref(),
            Some(msg.trim_ascii()),
            "{}",
            String::from_utf8_lossy(msg)
        );
        assert!(matches!(out.forward, Some(Cow::Owned(_))));
        assert!(out.replies.is_empty());
    }
    for blank in [&b""[..], b"\r", b" \t "] {
        let out = f.on_client(blank);
        assert!(out.forward.is_none() && out.replies.is_empty());
    }
    for msg in [
        &br#"{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{"messages":[]}}"#
            [..],
        br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,
        br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"echo"}]}}"#,
        br#"{"jsonrpc":"2.0","id":2,"error":{"code":-1,"message":"x"}}"#,
    ] {
        let out = f.on_server(msg);
        assert!(
            is_borrowed_same(&out, msg),
            "{}",
            String::from_utf8_lossy(msg)
        );
    }
}

#[test]
fn denied_call_is_answered_unknown_tool_and_not_forwarded() {
    let mut f = filter(&["^echo$"]);
    let out = f.on_client(br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hi"}}}"#);
    assert!(out.forward.is_none());
    assert_eq!(
        out.replies,
        vec![
            br#"{"jsonrpc":"2.0","id":42,"error":{"code":-32602,"message":"Unknown tool: echo"}}"#
                .to_vec()
        ]
    );
    // The id comes back exactly as written.
    let out = f.on_client(
        br#"{"id":"a\"b","jsonrpc":"2.0","method":"tools/call","params":{"name":"echo"}}"#,
    );
    assert_eq!(
        out.replies,
        vec![br#"{"jsonrpc":"2.0","id":"a\"b","error":{"code":-32602,"message":"Unknown tool: echo"}}"#.to_vec()]
    );
    // A denied notification-shaped call is dropped with no answer.
    let out = f.on_client(br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo"}}"#);
    assert!(out.forward.is_none() && out.replies.is_empty());
}

#[test]
fn escapes_and_tricks_do_not_hide_a_call() {
    let mut f = filter(&["^echo$"]);
    for msg in [
        &br#"{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"name":"echo"}}"#[..],
        br#"{"jsonrpc":"2.0","id":1,"method":"tools\u002fcall","params":{"name":"ec\u0068o"}}"#,
        br#"{"jsonrpc":"2.0","id":1,"me\u0074hod":"tools/call","params":{"name":"echo"}}"#,
        br#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":{"name":"echo"}}"#,
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","name":"add"}}"#,
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["echo"]}"#,
        br#"[["2.0",1,"tools/call"]]"#,
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}"#,
        b"garbage",
    ] {
        let out = f.on_client(msg);
        assert!(out.forward.is_none(), "forwarded {}", String::from_utf8_lossy(msg));
        assert_eq!(out.replies.len(), 1, "{}", String::from_utf8_lossy(msg));
    }
}

#[test]
fn batch_hiding_a_denied_call() {
    let mut f = filter(&["^echo$"]);
    let msg = br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add"}}, {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}},{"jsonrpc":"2.0","method":"notifications/progress"}]"#;
    let out = f.on_client(msg);
    assert_eq!(
        out.forward.as_deref(),
        Some(&br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add"}},{"jsonrpc":"2.0","method":"notifications/progress"}]"#[..])
    );
    assert_eq!(out.replies.len(), 1);
    assert!(String::from_utf8_lossy(&out.replies[0]).contains("Unknown tool: echo"));

    let all_denied =
        br#"[{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}}]"#;
    let out = f.on_client(all_denied);
    assert!(out.forward.is_none());
    assert_eq!(out.replies.len(), 1);

    // (Id 1 is the call still outstanding.)
    let clean = br#"[{"jsonrpc":"2.0","id":11,"method":"ping"}, {"jsonrpc":"2.0","id":12,"method":"tools/list"}]"#;
    let out = f.on_client(clean);
    assert_eq!(
        out.forward.as_deref(),
        Some(&br#"[{"jsonrpc":"2.0","id":11,"method":"ping"},{"jsonrpc":"2.0","id":12,"method":"tools/list"}]"#[..])
    );
    assert!(f.on_client(b"[]").forward.is_none());
}

/// The proxy's count of the responses a POST's stream owes: requests passed on, no more.
#[test]
fn requests_passed_on_are_counted() {
    let mut f = filter(&["^echo$"]);
    let batch = br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add"}}, {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}},{"jsonrpc":"2.0","method":"notifications/progress"},{"jsonrpc":"2.0","id":3,"result":{}}]"#;
    f.on_client(batch);
    assert_eq!(
        f.requests(),
        1,
        "the refused call, the notification and the response are not"
    );
    f.on_client(br#"{"jsonrpc":"2.0","id":"x","method":"ping"}"#);
    assert_eq!(f.requests(), 2);
    f.on_client(br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo"}}"#);
    f.on_client(b"{not json");
    assert_eq!(f.requests(), 2);
}

#[test]
fn events_record_calls_and_listed_tools() {
    // The filter returns its records; the transport hands them to its sink.
    let (sink, mut rx) = EventSink::channel();
    let mut f = Filter::new(ctx(&["^echo$"], Some(sink)));
    let mut events = f.on_client(br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"m":1}}}"#).records;
    events.extend(
        f.on_client(br#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"add"}}"#)
            .records,
    );
    let listed = f.on_server(PAGE1);
    events.extend(listed.records.iter().cloned());
    assert!(rx.try_recv().is_err(), "the filter touches no sink");
    let _ = listed.record(f.sink());
    let mut handed = 0;
    while rx.try_recv().is_ok() {
        handed += 1;
    }
    assert_eq!(
        handed, 3,
        "Outcome::record hands the listing's three records on"
    );
    assert_eq!(events.len(), 5);
    let Event::McpToolCalled(called) = &events[0] else {
        panic!("{:?}", events[0])
    };
    assert_eq!(called.tool_name, "echo");
    assert_eq!(called.action, Action::Block);
    assert_eq!(called.jsonrpc_id, serde_json::json!(9));
    assert_eq!(called.input, Some(serde_json::json!({"m": 1})));
    assert_eq!(called.session_id, "sess");
    let Event::McpToolCalled(called) = &events[1] else {
        panic!()
    };
    assert_eq!(called.action, Action::Allow);
    let seen: Vec<(String, Action, usize)> = events[2..]
        .iter()
        .map(|e| match e {
            Event::McpToolSeen(s) => (s.tool_name.clone(), s.action, s.tool_hash.len()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("echo".into(), Action::Block, 64),
            ("add".into(), Action::Allow, 64),
            ("echo_twice".into(), Action::Allow, 64)
        ]
    );
}

/// Runs a stream through framer and filter with the input cut at `cut`; returns the bytes
/// forwarded and the replies, as the shim would write them.
fn pump(f: &mut Filter, stream: &[u8], cut: usize, on_client: bool) -> (Vec<u8>, Vec<u8>) {
    let mut framer = LineFramer::new();
    let (mut fwd, mut rep) = (Vec::new(), Vec::new());
    let mut handle = |line: &[u8], fwd: &mut Vec<u8>, rep: &mut Vec<u8>| {
        let msg = strip_newline(line);
        let out = if on_client {
            f.on_client(msg)
        } else {
            f.on_server(msg)
        };
        if let Some(b) = out.forward {
            fwd.extend_from_slice(&b);
            fwd.push(b'\n');
        }
        for r in out.replies {
            rep.extend_from_slice(&r);
            rep.push(b'\n');
        }
    };
    for part in [&stream[..cut], &stream[cut..]] {
        framer.extend(part);
        while let Some(line) = framer.next_line().expect("within the limit") {
            handle(&line, &mut fwd, &mut rep);
        }
    }
    if let Some(rest) = framer.finish().expect("within the limit") {
        handle(&rest, &mut fwd, &mut rep);
    }
    (fwd, rep)
}

#[test]
fn streams_filtered_identically_at_every_split() {
    let client = concat!(
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#, "\n",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#, "\r\n",
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}}"#, "\n",
        "\n",
        r#"[{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"secret_echo"}},{"jsonrpc":"2.0","id":4,"method":"ping"}]"#, "\n",
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"add"}}"#,
    )
    .as_bytes();
    let server = [
        r#"{"jsonrpc":"2.0","id":0,"result":{"capabilities":{}}}"#.as_bytes(),
        b"\n",
        PAGE1,
        b"\r\n",
        br#"{"jsonrpc":"2.0","id":9,"method":"sampling/createMessage","params":{}}"#,
        b"\n",
    ]
    .concat();
    let expected_client = pump(&mut filter(&["echo"]), client, client.len(), true);
    let expected_server = pump(&mut filter(&["echo"]), &server, server.len(), false);
    // What the whole-stream run gives, spelled out once.
    assert_eq!(
        String::from_utf8_lossy(&expected_client.0),
        concat!(
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            "\n",
            r#"[{"jsonrpc":"2.0","id":4,"method":"ping"}]"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"add"}}"#,
            "\n",
        )
    );
    assert_eq!(expected_client.1.iter().filter(|b| **b == b'\n').count(), 2);
    assert!(!String::from_utf8_lossy(&expected_server.0).contains("echo"));
    for cut in 0..=client.len() {
        assert_eq!(
            pump(&mut filter(&["echo"]), client, cut, true),
            expected_client,
            "client cut {cut}"
        );
    }
    for cut in 0..=server.len() {
        assert_eq!(
            pump(&mut filter(&["echo"]), &server, cut, false),
            expected_server,
            "server cut {cut}"
        );
    }
}

#[test]
fn huge_messages() {
    let mut f = filter(&["^echo$"]);
    let big = "x".repeat(8 * 1024 * 1024);
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"add","arguments":{{"blob":"{big}"}}}}}}"#
    );
    assert_eq!(
        f.on_client(call.as_bytes()).forward.as_deref(),
        Some(call.as_bytes())
    );
    let denied = call.replace("\"add\"", "\"echo\"");
    assert!(f.on_client(denied.as_bytes()).forward.is_none());

    // As many tools as one list may hold, each with a long description: a big message.
    let long = "d".repeat(1000);
    let tools: Vec<String> = (0..listing::MAX_LISTED_TOOLS)
        .map(|i| {
            format!(
                r#"{{"name":"{}","description":"{i}{long}"}}"#,
                if i % 2 == 0 { "echo" } else { "add" }
            )
        })
        .collect();
    let list = format!(
        r#"{{"jsonrpc":"2.0","id":1,"result":{{"tools":[{}]}}}}"#,
        tools.join(",")
    );
    let out = f.on_server(list.as_bytes());
    let value: Value =
        serde_json::from_slice(&out.forward.expect("list kept")).expect("valid JSON");
    let names = value["result"]["tools"].as_array().expect("array");
    assert_eq!(names.len(), listing::MAX_LISTED_TOOLS / 2);
    assert!(names.iter().all(|t| t["name"] == "add"));
}
