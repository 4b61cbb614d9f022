use super::*;
use crate::decision::Action;
use crate::mcp::enforce::Enforcement;
use crate::mcp::framing::{LineFramer, strip_newline};

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

const PAGE1: &[u8] = br#"{"jsonrpc":"2.0","id":5,"result":{"tools":[{"name":"echo","description":"Echoes"},{"name":"add","inputSchema":{"type":"object"}},{"name":"echo_twice"}],"nextCursor":"c2"}}"#;

#[test]
fn denied_tools_leave_the_list_and_the_cursor_stays() {
    let mut f = filter(&["^echo"]);
    let _ = f.on_client(br#"{"jsonrpc":"2.0","id":5,"method":"tools/list"}"#);
    let out = f.on_server(PAGE1);
    assert_eq!(
        out.forward.as_deref(),
        Some(&br#"{"jsonrpc":"2.0","id":5,"result":{"tools":[{"name":"add","inputSchema":{"type":"object"}}],"nextCursor":"c2"}}"#[..])
    );
    assert!(f.pending.is_empty());

    // Every tool of a page denied: an empty page, the cursor kept so paging goes on.
    let mut f = filter(&["."]);
    let out = f.on_server(PAGE1);
    assert_eq!(
        out.forward.as_deref(),
        Some(&br#"{"jsonrpc":"2.0","id":5,"result":{"tools":[],"nextCursor":"c2"}}"#[..])
    );

    // Nothing denied: the same bytes.
    let mut f = filter(&[]);
    assert!(is_borrowed_same(&f.on_server(PAGE1), PAGE1));
}

#[test]
fn list_response_in_a_batch_and_with_escaped_keys() {
    let mut f = filter(&["^echo$"]);
    let msg = br#"[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","id":2,"result":{"too\u006cs":[{"name":"ec\u0068o"},{"name":"add"}]}}]"#;
    let out = f.on_server(msg);
    assert_eq!(
        out.forward.as_deref(),
        Some(&br#"[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","id":2,"result":{"too\u006cs":[{"name":"add"}]}}]"#[..])
    );
    // Duplicate `tools` keys could be read either way by a client: dropped.
    let out =
        f.on_server(br#"{"jsonrpc":"2.0","id":2,"result":{"tools":[],"tools":[{"name":"echo"}]}}"#);
    assert!(out.forward.is_none());
}

/// A session that must list first (the filter proxy's): a call before its list is refused,
/// and `list_first` says so beforehand, in the call's own revision.
#[test]
fn a_session_that_must_list_first_is_told_to_before_its_first_call() {
    let mut f = filter(&[]).with_listing(Arc::new(Mutex::new(Listing::required())));
    let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add"}}"#;
    assert!(
        f.list_first(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
            .is_none()
    );
    assert!(f.list_first(b"not json").is_none());
    let first = f
        .list_first(call)
        .expect("a call before listing lists first");
    assert!(first.meta.is_none());
    // Hidden in a batch behind escapes, it is the same call.
    let batch = br#"[{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","id":2,"method":"tools\u002fcall","params":{"name":"add"}}]"#;
    assert!(f.list_first(batch).is_some());
    // A 2026-07-28 call lists at its revision: the envelope's keys, and only those.
    let modern = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"add","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"sampling":{}},"progressToken":7}}}"#;
    let meta = f.list_first(modern).and_then(|m| m.meta).expect("envelope");
    assert_eq!(meta.len(), 2, "{meta:?}");
    assert_eq!(
        meta["io.modelcontextprotocol/clientCapabilities"]["sampling"],
        serde_json::json!({})
    );
    // Unlisted, the call is refused, and says why.
    let (sink, _rx) = EventSink::channel();
    let mut recorded =
        Filter::new(ctx(&[], Some(sink))).with_listing(Arc::new(Mutex::new(Listing::required())));
    let out = recorded.on_client(call);
    assert!(out.forward.is_none());
    assert!(String::from_utf8_lossy(&out.replies[0]).contains("Unknown tool: add"));
    let Some(Event::McpToolCalled(called)) = out.records.first() else {
        panic!("the refusal is recorded: {:?}", out.records);
    };
    assert_eq!(called.action, Action::Block);
    assert!(
        called
            .reason
            .contains("before this session was given a tool list"),
        "{}",
        called.reason
    );
    // Listed (even an empty list), nothing more is asked for first.
    assert!(
        f.on_server(br#"{"jsonrpc":"2.0","id":"l","result":{"tools":[]}}"#)
            .forward
            .is_some()
    );
    assert!(f.list_first(call).is_none());
    // A session that need not list first (the shim's) is never told to.
    assert!(filter(&[]).list_first(call).is_none());
}

/// Two sessions of one server, each judged by the list it was given: what one was listed is
/// not callable by the other.
#[test]
fn each_session_is_judged_by_its_own_list() {
    let session = || filter(&[]).with_listing(Arc::new(Mutex::new(Listing::required())));
    let (mut a, mut b) = (session(), session());
    a.on_server(br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"add"}]}}"#);
    b.on_server(
        br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"add"},{"name":"sample"}]}}"#,
    );
    let call = br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"sample"}}"#;
    assert!(a.on_client(call).forward.is_none());
    assert!(b.on_client(call).forward.is_some());
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

#[test]
fn pagination_across_pages() {
    let mut f = filter(&["^b"]);
    let pages = [
        (
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a1"},{"name":"b1"}],"nextCursor":"p2"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a1"}],"nextCursor":"p2"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"b2"}],"nextCursor":"p3"}}"#,
            r#"{"jsonrpc":"2.0","id":2,"result":{"tools":[],"nextCursor":"p3"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"a3"}]}}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"a3"}]}}"#,
        ),
    ];
    for (i, (page, want)) in pages.iter().enumerate() {
        let req = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"tools/list","params":{{"cursor":"p{}"}}}}"#,
            i + 1,
            i + 1
        );
        assert!(f.on_client(req.as_bytes()).forward.is_some());
        assert_eq!(f.pending.len(), 1);
        let out = f.on_server(page.as_bytes());
        assert_eq!(String::from_utf8_lossy(&out.forward.expect("page")), *want);
        assert!(f.pending.is_empty());
    }
}

/// A tool is callable once a listing judged here let it through, so a tool the server adds
/// is judged before it runs.
#[test]
fn only_listed_tools_are_callable() {
    let mut f = filter(&["^echo$"]);
    // Each call an id of its own: the ones passed on stay outstanding.
    let mut id = 0;
    let mut call = |f: &mut Filter, name: &str| {
        id += 1;
        let msg = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}"}}}}"#
        );
        let out = f.on_client(msg.as_bytes());
        (out.forward.is_some(), out.replies)
    };
    // Before any listing, names are judged by the rules alone.
    assert!(call(&mut f, "add").0);
    assert!(call(&mut f, "fresh").0);
    assert!(f.on_server(PAGE1).forward.is_some());
    assert!(call(&mut f, "add").0);
    assert!(call(&mut f, "echo_twice").0);
    let (forwarded, replies) = call(&mut f, "fresh");
    assert!(!forwarded);
    assert!(String::from_utf8_lossy(&replies[0]).contains("Unknown tool: fresh"));
    // The server's list changed: what was judged stays callable, what is new waits for the
    // listing that shows it.
    f.on_server(br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#);
    assert!(call(&mut f, "add").0);
    assert!(!call(&mut f, "fresh").0);
    let page = br#"{"jsonrpc":"2.0","id":6,"result":{"tools":[{"name":"fresh"},{"name":"echo"}],"ttlMs":0,"cacheScope":"private","resultType":"complete"}}"#;
    let out = f.on_server(page);
    let listed = String::from_utf8_lossy(out.forward.as_deref().unwrap_or_default()).into_owned();
    assert!(
        listed.contains("ttlMs") && !listed.contains("echo"),
        "{listed}"
    );
    assert!(call(&mut f, "fresh").0);
    assert!(!call(&mut f, "echo").0);
    // A listing asked anew (no cursor) replaces the list: what the server no longer lists is
    // no longer callable; its later pages add to it.
    let relist = |f: &mut Filter, id: u32, cursor: &str, tools: &str, next: &str| {
        let params = match cursor {
            "" => String::new(),
            c => format!(r#","params":{{"cursor":"{c}"}}"#),
        };
        let ask = format!(r#"{{"jsonrpc":"2.0","id":"l{id}","method":"tools/list"{params}}}"#);
        assert!(f.on_client(ask.as_bytes()).forward.is_some());
        let next = match next {
            "" => String::new(),
            n => format!(r#","nextCursor":"{n}""#),
        };
        let page =
            format!(r#"{{"jsonrpc":"2.0","id":"l{id}","result":{{"tools":{tools}{next}}}}}"#);
        assert!(f.on_server(page.as_bytes()).forward.is_some());
    };
    relist(&mut f, 1, "", r#"[{"name":"add"}]"#, "c2");
    assert!(call(&mut f, "add").0);
    assert!(!call(&mut f, "fresh").0);
    relist(&mut f, 2, "c2", r#"[{"name":"fresh"}]"#, "");
    assert!(call(&mut f, "add").0 && call(&mut f, "fresh").0);
    // An empty cursor asks for the first page too.
    relist(&mut f, 3, "", r#"[{"name":"add"}]"#, "");
    let ask = br#"{"jsonrpc":"2.0","id":"l4","method":"tools/list","params":{"cursor":""}}"#;
    assert!(f.on_client(ask).forward.is_some());
    let page = br#"{"jsonrpc":"2.0","id":"l4","result":{"tools":[{"name":"fresh"}]}}"#;
    assert!(f.on_server(page).forward.is_some());
    assert!(!call(&mut f, "add").0 && call(&mut f, "fresh").0);
}

#[test]
fn a_tool_list_too_large_to_judge_is_answered_with_an_error() {
    let list = |n: usize| {
        let tools: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"name":"t{i}","inputSchema":{{"type":"object"}}}}"#))
            .collect();
        format!(
            r#"{{"jsonrpc":"2.0","id":"L1","result":{{"tools":[{}]}}}}"#,
            tools.join(",")
        )
    };
    let mut f = filter(&["^t1$"]);
    let at_limit = list(listing::MAX_LISTED_TOOLS);
    let out = f.on_server(at_limit.as_bytes());
    let kept: Value = serde_json::from_slice(out.forward.as_deref().expect("forwarded")).unwrap();
    assert_eq!(
        kept["result"]["tools"].as_array().map(Vec::len),
        Some(listing::MAX_LISTED_TOOLS - 1),
        "judged: the denied tool left"
    );
    let over = list(listing::MAX_LISTED_TOOLS + 1);
    let out = f.on_server(over.as_bytes());
    let answer: Value = serde_json::from_slice(out.forward.as_deref().expect("an answer")).unwrap();
    assert_eq!(answer["id"], "L1");
    assert_eq!(answer["error"]["code"], -32603);
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("2049 tools") && m.contains("at most 2048")),
        "{answer}"
    );
    assert!(answer.get("result").is_none(), "no tool of it passes");
}

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
