//! Tool lists: denied tools leave them (cursors and batches kept), each session is judged by its
//! own list across pages, and only a listed tool is callable.

use super::*;

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

/// Two lists of one session judged out of the order they came (the first, large, judged off
/// the proxy's thread and done last): the session keeps the one that came last, and a list
/// still being judged when a listing failed does not set the list after it.
#[test]
fn a_list_done_after_a_newer_one_does_not_replace_it() {
    let listing = Arc::new(Mutex::new(Listing::required()));
    let session = || filter(&[]).with_listing(listing.clone());
    let (mut older, mut newer) = (session(), session());
    let call = |name: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"{name}"}}}}"#)
    };
    older.arrive();
    newer.on_server(br#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"kept"}]}}"#);
    let out = older.on_server(
        br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"kept"},{"name":"dropped"}]}}"#,
    );
    // Its client still gets the list it asked for, judged.
    assert!(out.forward.is_some());
    assert!(
        session()
            .on_client(call("dropped").as_bytes())
            .forward
            .is_none()
    );
    assert!(
        session()
            .on_client(call("kept").as_bytes())
            .forward
            .is_some()
    );
    // Every list of an older message (a batch) is as old as it.
    let mut batch = session();
    batch.arrive();
    session().on_server(br#"{"jsonrpc":"2.0","id":5,"result":{"tools":[{"name":"kept"}]}}"#);
    batch.on_server(
        br#"[{"jsonrpc":"2.0","id":6,"result":{"tools":[{"name":"dropped"}]}},{"jsonrpc":"2.0","id":7,"result":{"tools":[{"name":"dropped"}]}}]"#,
    );
    assert!(
        session()
            .on_client(call("dropped").as_bytes())
            .forward
            .is_none()
    );
    // A later list (in its turn) applies as ever.
    session().on_server(br#"{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"dropped"}]}}"#);
    assert!(
        session()
            .on_client(call("dropped").as_bytes())
            .forward
            .is_some()
    );
    // A listing that failed while a list was judged: that list does not set the session's.
    let mut late = session();
    late.arrive();
    session().listing_failed();
    late.on_server(br#"{"jsonrpc":"2.0","id":4,"result":{"tools":[{"name":"kept"}]}}"#);
    assert!(
        session()
            .on_client(call("kept").as_bytes())
            .forward
            .is_none()
    );
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
