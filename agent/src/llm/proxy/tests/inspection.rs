//! Streamed and buffered bodies inspected end to end: blocking, no buffering, bodies split
//! anywhere, broken upstreams, events recorded, batch results.

use super::*;

#[tokio::test]
async fn streamed_anthropic_blocking_end_to_end() {
    let stream = anthropic_stream(&["mcp__fs__read", "mcp__fs__delete"]);
    let mut steps = vec![Step::Send(sse_head(""))];
    for piece in stream.chunks(37) {
        steps.push(Step::Send(chunk(piece)));
    }
    steps.push(Step::Send(b"0\r\n\r\n".to_vec()));
    let (upstream, head) = fake_upstream(steps).await;
    let (proxy, mut events, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;

    let resp = client()
        .request(post(proxy, "/v1/messages?beta=true", r#"{"stream":true}"#))
        .await
        .expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(
        !text.contains("SECRET_2"),
        "blocked arguments reached the client"
    );
    assert!(text.contains("SECRET_1"), "allowed arguments missing");
    assert!(text.contains("[toolwall] Tool 'mcp__fs__delete' blocked by policy"));
    // 17 events, the blocked block's 5 replaced by 3.
    assert_eq!(data_values(&body).len(), 15);

    let head = head.await.expect("upstream saw the request");
    assert!(
        head.starts_with("POST /v1/messages?beta=true HTTP/1.1"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("accept-encoding: identity"),
        "{head}"
    );
    assert!(head.contains("sk-test"), "auth header must pass: {head}");

    let got = intercepted(&mut events);
    assert!(
        got.contains(&("mcp__fs__delete".into(), "block".into(), "s1".into())),
        "{got:?}"
    );
    assert!(
        got.contains(&("mcp__fs__read".into(), "allow".into(), "s1".into())),
        "{got:?}"
    );
}

#[tokio::test]
async fn streaming_is_not_buffered() {
    let stream = anthropic_stream(&[]);
    let first_end = memchr::memmem::find(&stream, b"\n\n").expect("an event") + 2;
    let (steps, go_tx) = paused_at(&stream, first_end);
    let (upstream, _head) = fake_upstream(steps).await;
    let (proxy, _events, _stop) = start_proxy(upstream, &[]).await;
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    let mut body = resp.into_body();
    // The first event must arrive while upstream is still holding back the rest.
    let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("first event arrived before upstream finished")
        .expect("a frame")
        .expect("ok frame");
    let first = frame.into_data().expect("data");
    assert_eq!(&first[..], &stream[..first_end]);
    go_tx.send(()).expect("upstream waiting");
    let rest = body.collect().await.expect("rest").to_bytes();
    let mut all = first.to_vec();
    all.extend_from_slice(&rest);
    assert_eq!(all, stream, "nothing blocked: byte-identical");
}

#[tokio::test]
async fn buffered_json_is_rewritten_with_its_length() {
    let body = r#"{"id":"msg_1","content":[{"type":"tool_use","id":"t","name":"mcp__fs__delete","input":{"SECRET":1}}],"stop_reason":"tool_use"}"#;
    let resp = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (upstream, _head) = fake_upstream(vec![Step::Send(resp.into_bytes())]).await;
    let (proxy, _events, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    let len: usize = resp
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("content-length");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(body.len(), len);
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["content"][0]["type"], "text");
}

#[tokio::test]
async fn upstream_drop_mid_stream_does_not_hang_or_panic() {
    let stream = anthropic_stream(&["mcp__fs__delete"]);
    // Cut inside the blocked block's arguments, without the chunked terminator.
    let cut = memchr::memmem::find(&stream, b"SECRET_1").expect("secret") - 5;
    let steps = vec![Step::Send(sse_head("")), Step::Send(chunk(&stream[..cut]))];
    let (upstream, _head) = fake_upstream(steps).await;
    let (proxy, _events, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    let mut body = resp.into_body();
    let mut got = Vec::new();
    let outcome = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => got.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
                Err(_) => return false,
            }
        }
        true
    })
    .await
    .expect("the response ended");
    let _ = outcome;
    assert!(!String::from_utf8_lossy(&got).contains("SECRET"));
}

#[tokio::test]
async fn block_event_recorded_mid_stream_and_client_disconnect_is_survived() {
    let (steps, go_tx) = paused_after_the_blocked_call();
    let (upstream, _head) = fake_upstream(steps).await;
    let (proxy, mut events, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    let mut body = resp.into_body();
    read_until_replaced(&mut body).await;
    // The decision is in the store already, before the stream is over.
    let ev = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .expect("event emitted mid-stream")
        .expect("event");
    match ev {
        Event::McpToolCallIntercepted(e) => {
            assert_eq!(e.tool_name, "mcp__fs__delete");
            assert_eq!(e.input, None);
        }
        other => panic!("unexpected event {other:?}"),
    }
    // The client goes away; upstream then sends the rest into a closed response.
    drop(body);
    let _ = go_tx.send(());
    // The proxy keeps serving.
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("first proxy still answers");
    // Its upstream served its one connection: a 502, not a hang or a crash.
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn small_chunks_split_anywhere_are_inspected_and_allowed_bytes_stay_identical() {
    let mixed = anthropic_stream(&["mcp__fs__read", "mcp__fs__delete"]);
    let allowed = anthropic_stream(&["mcp__fs__read"]);
    for size in [1, 3, 7, 64] {
        let mut wire = sse_head("");
        wire.extend(chunked_every(&mixed, size));
        let (upstream, _) = fake_upstream(vec![Step::Send(wire)]).await;
        let (addr, mut rx, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
        let resp = client()
            .request(post(addr, "/v1/messages", "{}"))
            .await
            .expect("response");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("\"name\":\"mcp__fs__read\""), "size {size}");
        assert!(
            !text.contains("\"name\":\"mcp__fs__delete\""),
            "size {size}"
        );
        assert!(text.contains("blocked by policy"), "size {size}");
        assert!(
            intercepted(&mut rx)
                .iter()
                .any(|(t, a, _)| t == "mcp__fs__delete" && a == "block")
        );

        let mut wire = sse_head("");
        wire.extend(chunked_every(&allowed, size));
        let (upstream, _) = fake_upstream(vec![Step::Send(wire)]).await;
        let (addr, _rx, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
        let resp = client()
            .request(post(addr, "/v1/messages", "{}"))
            .await
            .expect("response");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(
            &body[..],
            &allowed[..],
            "size {size}: allowed bytes identical"
        );
    }
}

#[tokio::test]
async fn broken_chunk_framing_from_upstream_ends_the_stream_with_an_error() {
    let mut wire = sse_head("");
    wire.extend(chunk(b"event: ping\ndata: {\"type\":\"ping\"}\n\n"));
    wire.extend_from_slice(b"zz\r\nevent: x\n\n\r\n");
    let (upstream, _) = fake_upstream(vec![Step::Send(wire)]).await;
    let (addr, _rx, _stop) = start_proxy(upstream, &[]).await;
    let resp = client()
        .request(post(addr, "/v1/messages", "{}"))
        .await
        .expect("response");
    let (got, broke) = read_until_break(resp.into_body()).await;
    assert!(broke, "the client sees the break, not a clean end");
    assert_eq!(got, b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
}

#[tokio::test]
async fn a_route_without_calls_of_its_own_is_judged_whole_before_anything_leaves() {
    // Conversation items are Responses items: a call in them (here split from the line before
    // by a lone CR, where the SDKs' line readers split) refuses the whole answer.
    let line = |name: &str| {
        format!(
            "{{\"type\":\"function_call\",\"id\":\"fc\",\"call_id\":\"c\",\"name\":\"{name}\",\"arguments\":\"{{}}\"}}\r"
        )
    };
    let allowed = format!("{}{}", line("mcp__fs__read"), line("mcp__fs__list"));
    let denied = format!("{}{}", line("mcp__fs__read"), line("mcp__fs__delete"));
    for (body, blocked) in [(allowed, false), (denied, true)] {
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/binary\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let (upstream, _) = fake_upstream(vec![Step::Send(
            [head.as_bytes(), body.as_bytes()].concat(),
        )])
        .await;
        let (addr, mut rx, _stop) = start_proxy(upstream, &["mcp__fs__delete"]).await;
        let req = Request::get(format!("http://{addr}/v1/conversations/c1/items"))
            .header("authorization", "Bearer k")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let resp = client().request(req).await.expect("response");
        if blocked {
            assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
            let got = resp.into_body().collect().await.expect("body").to_bytes();
            assert!(!String::from_utf8_lossy(&got).contains("mcp__fs__delete"));
            assert!(
                intercepted(&mut rx)
                    .iter()
                    .any(|(t, a, _)| t == "mcp__fs__delete" && a == "block")
            );
        } else {
            assert_eq!(resp.status(), StatusCode::OK);
            let got = resp.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(
                got,
                body.as_bytes(),
                "an allowed answer passes byte for byte"
            );
        }
    }
}

/// The stream pump reads upstream only while the event queue has room (otherwise one response
/// of endless blocked calls queues hundreds of MB). With a queue of one byte that nobody
/// drains, what upstream sends after the first record waits unread; drained, it flows.
#[tokio::test]
async fn a_stream_waits_for_room_in_the_event_queue() {
    let (steps, go_tx) = paused_after_the_blocked_call();
    let (upstream, _head) = fake_upstream(steps).await;
    let (proxy, mut events, _stop) =
        start_proxy_with(upstream, &["mcp__fs__delete"], EventSink::with_limit(1)).await;
    let resp = client()
        .request(post(proxy, "/v1/messages", "{}"))
        .await
        .expect("response");
    let mut body = resp.into_body();
    read_until_replaced(&mut body).await;
    // Upstream sends the rest; the queue holds the blocked call's record and nobody drains it.
    let _ = go_tx.send(());
    let waited = tokio::time::timeout(Duration::from_millis(700), body.frame()).await;
    assert!(
        waited.is_err(),
        "nothing more is read while the queue is full: {waited:?}"
    );
    // The writer takes the record: the stream goes on to its end.
    events.recv().await.expect("the record");
    let rest = tokio::time::timeout(Duration::from_secs(5), body.collect())
        .await
        .expect("the rest flows once there is room")
        .expect("body")
        .to_bytes();
    assert!(String::from_utf8_lossy(&rest).contains("message_stop"));
}

/// An Anthropic stream with one blocked call, sent up to and including that call's start;
/// the rest goes when the sender is told.
fn paused_after_the_blocked_call() -> (Vec<Step>, oneshot::Sender<()>) {
    let stream = anthropic_stream(&["mcp__fs__delete"]);
    let start = memchr::memmem::find(&stream, b"\"tool_use\"").expect("tool_use");
    let cut = start + memchr::memmem::find(&stream[start..], b"\n\n").expect("end") + 2;
    paused_at(&stream, cut)
}

/// An SSE response that stops after `stream[..cut]` until the test says go.
fn paused_at(stream: &[u8], cut: usize) -> (Vec<Step>, oneshot::Sender<()>) {
    let (go_tx, go_rx) = oneshot::channel();
    let steps = vec![
        Step::Send(sse_head("")),
        Step::Send(chunk(&stream[..cut])),
        Step::Wait(go_rx),
        Step::Send(chunk(&stream[cut..])),
        Step::Send(b"0\r\n\r\n".to_vec()),
    ];
    (steps, go_tx)
}

/// Reads the response until the blocked call's replacement arrived (while upstream pauses).
async fn read_until_replaced(body: &mut hyper::body::Incoming) {
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("blocked by policy") {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("the replacement arrives while upstream is paused")
            .expect("frame")
            .expect("ok");
        got.extend_from_slice(frame.data_ref().map_or(&[][..], |d| &d[..]));
    }
}

#[tokio::test]
async fn a_secret_in_a_tool_result_never_reaches_the_model() {
    const AWS: &str = "AKIAQYLPMN5HHHFPZAM2";
    let reply = r#"{"id":"m","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"model":"x","stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}"#;
    let (upstream, seen) = fake_upstream(vec![Step::Send(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
            reply.len()
        )
        .into_bytes(),
    )])
    .await;
    let (proxy, mut events, _stop) = start_proxy(upstream, &[]).await;
    let request = serde_json::json!({
        "model": "claude", "max_tokens": 10,
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "mcp__fs__read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": format!("key id {AWS}")}]}
        ]
    })
    .to_string();
    let resp = client()
        .request(post(proxy, "/v1/messages", &request))
        .await
        .expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    let seen = seen.await.expect("upstream saw the request");
    assert!(
        !seen.contains(AWS),
        "the model's provider got the secret: {seen}"
    );
    assert!(
        seen.contains("key id [toolwall:redacted:aws-access-token]"),
        "{seen}"
    );
    // Framed by its new length.
    let (head, body) = seen.split_once("\r\n\r\n").expect("head and body");
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("content-length: {}", body.len())),
        "{head}"
    );
    let mut found = false;
    while let Ok(event) = events.try_recv() {
        found |= matches!(event, Event::McpResultInspected(ref r) if r.layer == "llm" && r.jsonrpc_id == "toolu_1");
    }
    assert!(found, "recorded");
}

#[tokio::test]
async fn a_compressed_request_on_an_inspected_route_is_refused() {
    let (upstream, _seen) = fake_upstream(vec![]).await;
    let (proxy, _events, _stop) = start_proxy(upstream, &[]).await;
    let mut req = post(proxy, "/v1/messages", "{}");
    req.headers_mut().insert(
        "content-encoding",
        hyper::header::HeaderValue::from_static("gzip"),
    );
    let resp = client().request(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("content-encoding"));
}
