use super::*;

#[test]
fn join_array_merges_bodies_and_replies() {
    let r = vec![b"{\"id\":2}".to_vec()];
    assert_eq!(
        join_array(Some(b"{\"id\":1}"), &r),
        b"[{\"id\":1},{\"id\":2}]"
    );
    assert_eq!(
        join_array(Some(b" [{\"id\":1}] "), &r),
        b"[{\"id\":1},{\"id\":2}]"
    );
    assert_eq!(join_array(Some(b"[]"), &r), b"[{\"id\":2}]");
    assert_eq!(join_array(None, &r), b"[{\"id\":2}]");
}

#[test]
fn ids_and_params() {
    assert_eq!(
        request_ids(br#"[{"id":1,"method":"a"},{"id":"x","method":"b"},{"method":"n"},{"id":3,"result":{}}]"#),
        vec!["1".to_owned(), "\"x\"".to_owned()]
    );
    assert_eq!(
        response_id(br#"{"id":"x","result":{}}"#).as_deref(),
        Some("\"x\"")
    );
    let uri: Uri = "/message?a=1&sessionId=abc".parse().unwrap();
    assert_eq!(query_param(&uri, "sessionId"), Some("abc"));
    assert_eq!(new_session_id().len(), 32);
    assert_ne!(new_session_id(), new_session_id());
}

#[test]
fn origins_are_checked() {
    let allow = vec!["https://app.example".to_owned()];
    let with = |origin: &str| {
        let mut h = HeaderMap::new();
        h.insert(http::header::ORIGIN, HeaderValue::from_str(origin).unwrap());
        origin_allowed(&allow, &h)
    };
    assert!(origin_allowed(&allow, &HeaderMap::new()));
    assert!(with("http://localhost:6274"));
    assert!(with("http://127.0.0.1"));
    assert!(with("http://[::1]:3000"));
    assert!(with("https://app.example"));
    assert!(!with("https://evil.example"));
    assert!(!with("http://localhost.evil.example"));
    assert!(!with("null"));
}

#[test]
fn auth_passes_and_hop_by_hop_and_origin_do_not() {
    let configured =
        parse_headers(&["X-Api-Key: k1".into(), "Authorization: Bearer cfg".into()]).unwrap();
    let mut client = HeaderMap::new();
    client.insert("authorization", HeaderValue::from_static("Bearer client"));
    client.insert("host", HeaderValue::from_static("127.0.0.1:8090"));
    client.insert("origin", HeaderValue::from_static("http://localhost"));
    client.insert("connection", HeaderValue::from_static("keep-alive"));
    client.insert("last-event-id", HeaderValue::from_static("7"));
    let merged = merge_headers(&configured, &client);
    assert_eq!(merged.get("authorization").unwrap(), "Bearer client");
    assert_eq!(merged.get("last-event-id").unwrap(), "7");
    // A client with credentials of its own gets none of the lent ones beside them.
    assert!(merged.get("x-api-key").is_none());
    for gone in ["host", "origin", "connection"] {
        assert!(merged.get(gone).is_none(), "{gone}");
    }
    // A client without gets the lent ones (when they are lent at all: `upstream_headers`).
    client.remove("authorization");
    let merged = merge_headers(&configured, &client);
    assert_eq!(merged.get("authorization").unwrap(), "Bearer cfg");
    assert_eq!(merged.get("x-api-key").unwrap(), "k1");
    assert!(parse_headers(&["no colon".into()]).is_err());
}

#[test]
fn one_line_compacts_multiline_messages() {
    assert_eq!(one_line(b"{\n\"a\": 1\n}").as_ref(), b"{\"a\":1}");
    assert_eq!(one_line(b"{\"a\":1}").as_ref(), b"{\"a\":1}");
}

/// One list per upstream session and identity; a DELETE forgets the session's; past the
/// bound the least recently used one is forgotten (its next call is listed for again).
#[test]
fn session_listings_are_per_session_and_identity_and_bounded() {
    let ids = Identities::default();
    let mut listings = SessionListings::default();
    let mut of = |session: Option<&str>, auth: Option<&str>| {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(
                http::header::AUTHORIZATION,
                HeaderValue::from_str(a).expect("value"),
            );
        }
        listings.of(session, ids.of(&h, None))
    };
    let a = of(Some("s1"), Some("Bearer one"));
    assert!(Arc::ptr_eq(&a, &of(Some("s1"), Some("Bearer one"))));
    assert!(!Arc::ptr_eq(&a, &of(Some("s1"), Some("Bearer two"))));
    assert!(!Arc::ptr_eq(&a, &of(Some("s2"), Some("Bearer one"))));
    assert!(!Arc::ptr_eq(&a, &of(None, Some("Bearer one"))));
    let kept = of(Some("kept"), None);
    assert_eq!(listings.len(), 5);
    listings.ended("s1");
    assert_eq!(listings.len(), 3);
    for i in 0..MAX_LISTINGS {
        // `kept` is used between the others, so it is never the least recently used.
        listings.of(Some(&format!("n{i}")), 0);
        listings.of(Some("kept"), ids.of(&HeaderMap::new(), None));
    }
    assert_eq!(listings.len(), MAX_LISTINGS);
    assert!(Arc::ptr_eq(
        &kept,
        &listings.of(Some("kept"), ids.of(&HeaderMap::new(), None))
    ));
}

/// Every `resource_metadata` of a challenge names the proxy's metadata (quoted, bare, twice, in
/// another parameter's text), one is added to a Bearer challenge that had none, and the rest
/// (scope, error, other schemes) is kept.
#[test]
fn challenges_point_at_the_proxys_metadata() {
    let ours = "http://127.0.0.1:8090/.well-known/oauth-protected-resource/mcp";
    let cases = [
        (
            r#"Bearer error="invalid_token", resource_metadata="http://up:3000/.well-known/oauth-protected-resource/mcp", scope="a b""#,
            format!(r#"Bearer error="invalid_token", resource_metadata="{ours}", scope="a b""#),
        ),
        (
            "Bearer resource_metadata=http://up/x, scope=a",
            format!(r#"Bearer resource_metadata="{ours}", scope=a"#),
        ),
        (
            r#"Bearer error="insufficient_scope", scope="admin""#,
            format!(
                r#"Bearer error="insufficient_scope", scope="admin", resource_metadata="{ours}""#
            ),
        ),
        ("Bearer", format!(r#"Bearer resource_metadata="{ours}""#)),
        (r#"Basic realm="up""#, r#"Basic realm="up""#.to_owned()),
    ];
    for (challenge, want) in cases {
        assert_eq!(rewrite_challenge(challenge, ours), want, "{challenge}");
    }
    // Whatever the SDKs' first-match reading finds is ours, however the challenge hides
    // another URL (the TypeScript SDK's own challenge writer does not escape quotes).
    let sdk = regex::Regex::new(r#"resource_metadata=(?:"([^"]+)"|([^\s,]+))"#).unwrap();
    for hostile in [
        r#"Bearer error_description="see resource_metadata=http://evil/", resource_metadata="http://up/m""#,
        r#"Bearer error_description="resource_metadata=\"http://evil/\"", resource_metadata="http://up/m""#,
        r#"Bearer error_description="x", RESOURCE_METADATA=http://evil/,resource_metadata="http://up/m""#,
        r#"Bearer realm="resource_metadata="http://evil/"""#,
    ] {
        let rewritten = rewrite_challenge(hostile, ours);
        let first = sdk.captures(&rewritten).expect("a match");
        let found = first.get(1).or_else(|| first.get(2)).unwrap().as_str();
        assert_eq!(found, ours, "{hostile} -> {rewritten}");
    }
}

/// Metadata toolwall vouches for names authorization servers and the upstream as its resource
/// (its origin, and a path the upstream's is under), as the SDKs compare them.
#[test]
fn only_the_upstreams_own_metadata_is_vouched_for() {
    let upstream: Uri = "http://localhost:3000/mcp".parse().unwrap();
    let doc = |v: Value| v.as_object().cloned().unwrap();
    let servers = serde_json::json!(["http://localhost:3001/"]);
    for resource in [
        "http://localhost:3000/mcp",
        "http://LOCALHOST:3000/mcp/",
        "http://localhost:3000",
        "http://localhost:3000/",
    ] {
        let m = doc(serde_json::json!({"resource": resource, "authorization_servers": servers}));
        assert!(check_metadata(&m, &upstream).is_ok(), "{resource}");
    }
    for resource in [
        "https://evil.example.com/mcp",
        "http://localhost:3001/mcp",
        "https://localhost:3000/mcp",
        "http://127.0.0.1:3000/mcp",
        "http://localhost:3000/mcpx",
        "http://localhost:3000/other",
        "not a url at all",
    ] {
        let m = doc(serde_json::json!({"resource": resource, "authorization_servers": servers}));
        assert!(check_metadata(&m, &upstream).is_err(), "{resource}");
    }
    for servers in [
        serde_json::json!([]),
        serde_json::json!("x"),
        serde_json::json!([1]),
    ] {
        let m = doc(
            serde_json::json!({"resource": "http://localhost:3000/mcp", "authorization_servers": servers}),
        );
        assert!(check_metadata(&m, &upstream).is_err(), "{servers}");
    }
    let m = doc(serde_json::json!({"authorization_servers": ["http://a/"]}));
    assert!(check_metadata(&m, &upstream).is_err());
}

/// What was judged of a request is recorded whatever becomes of it: refused with the reason
/// when settled so, and when its client leaves first, refused before it was forwarded and as
/// judged after (the upstream may run it).
#[test]
fn verdicts_are_recorded_as_far_as_the_request_went() {
    use crate::decision::Action;
    use crate::events::{Event, test_call};
    let (sink, mut queue) = EventSink::channel();
    let action = |queue: &mut crate::events::EventQueue| match queue.try_recv() {
        Ok(Event::McpToolCalled(call)) => (call.action, call.reason),
        other => panic!("no call recorded: {other:?}"),
    };
    let judged = || vec![test_call("echo", None, Action::Allow, "allowed".into())];
    let mut settled = Verdicts::new(Some(&sink));
    settled.add(&mut judged());
    settled.forwarding();
    settled.settle(Some(&"the upstream refused the request (HTTP 404)"));
    assert_eq!(
        action(&mut queue),
        (
            Action::Block,
            "the upstream refused the request (HTTP 404)".into()
        )
    );
    let mut left_early = Verdicts::new(Some(&sink));
    left_early.add(&mut judged());
    drop(left_early);
    assert_eq!(action(&mut queue).0, Action::Block);
    let mut left_late = Verdicts::new(Some(&sink));
    left_late.add(&mut judged());
    left_late.forwarding();
    drop(left_late);
    assert_eq!(action(&mut queue), (Action::Allow, "allowed".into()));
    assert!(queue.try_recv().is_err(), "each recorded once");
}

/// A listing on a session's behalf follows `nextCursor` until there is none, an empty one
/// included (the SDKs' clients stop there too), and stops at a repeated cursor or past its
/// byte budget.
#[tokio::test]
async fn a_listing_follows_cursors_to_the_end_within_its_budget() {
    let page = |next: &str| match next {
        "-" => r#"{"jsonrpc":"2.0","id":"x","result":{"tools":[]}}"#.to_owned(),
        n => format!(r#"{{"jsonrpc":"2.0","id":"x","result":{{"tools":[],"nextCursor":"{n}"}}}}"#),
    };
    let mut pages = ListPages::new(ListFirst { meta: None }, Duration::from_secs(5), 1 << 20);
    assert!(pages.request().is_ok());
    assert_eq!(pages.answered(page("c1").as_bytes()), Ok(false));
    let (second, _) = pages.request().expect("a second page");
    assert!(String::from_utf8_lossy(&second).contains(r#""cursor":"c1""#));
    assert_eq!(pages.answered(page("").as_bytes()), Ok(true));
    let mut pages = ListPages::new(ListFirst { meta: None }, Duration::from_secs(5), 1 << 20);
    assert_eq!(pages.answered(page("c1").as_bytes()), Ok(false));
    assert!(
        pages.answered(page("c1").as_bytes()).is_err(),
        "a repeated cursor"
    );
    let mut pages = ListPages::new(ListFirst { meta: None }, Duration::from_secs(5), 100);
    assert!(pages.answered(page("c1").as_bytes()).is_ok());
    assert!(
        pages.answered(page("c2").as_bytes()).is_err(),
        "past the budget"
    );
    assert_eq!(
        ListPages::new(ListFirst { meta: None }, Duration::from_secs(5), 1 << 20)
            .answered(page("-").as_bytes()),
        Ok(true)
    );
}
