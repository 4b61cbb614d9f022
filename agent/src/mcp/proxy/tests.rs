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
    assert_eq!(merged.get("x-api-key").unwrap(), "k1");
    assert_eq!(merged.get("last-event-id").unwrap(), "7");
    for gone in ["host", "origin", "connection"] {
        assert!(merged.get(gone).is_none(), "{gone}");
    }
    assert!(parse_headers(&["no colon".into()]).is_err());
}

#[test]
fn one_line_compacts_multiline_messages() {
    assert_eq!(one_line(b"{\n\"a\": 1\n}").as_ref(), b"{\"a\":1}");
    assert_eq!(one_line(b"{\"a\":1}").as_ref(), b"{\"a\":1}");
}

/// One list per upstream session and credential; a DELETE forgets the session's; past the
/// bound the least recently used one is forgotten (its next call is listed for again).
#[test]
fn session_listings_are_per_session_and_credential_and_bounded() {
    let headers = |session: Option<&str>, auth: Option<&str>| {
        let mut h = HeaderMap::new();
        if let Some(s) = session {
            h.insert(SESSION_HEADER, HeaderValue::from_str(s).expect("value"));
        }
        if let Some(a) = auth {
            h.insert(
                http::header::AUTHORIZATION,
                HeaderValue::from_str(a).expect("value"),
            );
        }
        h
    };
    let mut listings = SessionListings::default();
    let a = listings.of(&headers(Some("s1"), Some("Bearer one")));
    assert!(Arc::ptr_eq(
        &a,
        &listings.of(&headers(Some("s1"), Some("Bearer one")))
    ));
    assert!(!Arc::ptr_eq(
        &a,
        &listings.of(&headers(Some("s1"), Some("Bearer two")))
    ));
    assert!(!Arc::ptr_eq(
        &a,
        &listings.of(&headers(Some("s2"), Some("Bearer one")))
    ));
    assert!(!Arc::ptr_eq(
        &a,
        &listings.of(&headers(None, Some("Bearer one")))
    ));
    assert_eq!(listings.len(), 4);
    listings.ended("s1");
    assert_eq!(listings.len(), 2);
    let kept = listings.of(&headers(Some("kept"), None));
    for i in 0..MAX_LISTINGS {
        // `kept` is used between the others, so it is never the least recently used.
        listings.of(&headers(Some(&format!("n{i}")), None));
        listings.of(&headers(Some("kept"), None));
    }
    assert_eq!(listings.len(), MAX_LISTINGS);
    assert!(Arc::ptr_eq(
        &kept,
        &listings.of(&headers(Some("kept"), None))
    ));
}
