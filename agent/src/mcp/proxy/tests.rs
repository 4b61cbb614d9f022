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
